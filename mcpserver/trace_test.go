package mcpserver

import (
	"context"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/tools"
)

// A traceparent in a request's _meta continues the platform's trace: the
// call's audit records carry its trace id. One that is not a traceparent
// is ignored, and the call is made all the same.
func TestMetaTraceparent(t *testing.T) {
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	for _, tr := range transports {
		t.Run(string(tr), func(t *testing.T) {
			tb := newToolbox(t, nil)
			cs := connect(t, newServer(t, tb, Options{}), tr, nil)
			for _, tc := range []struct{ path, traceparent, want string }{
				{"traced.txt", "00-" + traceID + "-00f067aa0ba902b7-01", traceID},
				{"untraced.txt", "garbage", ""},
			} {
				params := &mcp.CallToolParams{Name: tools.Write, Arguments: map[string]any{"path": tc.path, "content": "x"}}
				params.SetMeta(map[string]any{"traceparent": tc.traceparent})
				res, err := cs.CallTool(context.Background(), params)
				if err != nil {
					t.Fatal(err)
				}
				ok(t, res)
				e := recorderOf(tb).waitFor(t, 5*time.Second, tc.path, func(e audit.Event) bool {
					return e.Op == tools.Write && e.Path == tc.path && e.Result == "ok"
				})
				if e.TraceID != tc.want {
					t.Errorf("%s with traceparent %q: audit trace id %q, want %q", tc.path, tc.traceparent, e.TraceID, tc.want)
				}
			}
		})
	}
}
