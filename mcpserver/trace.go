package mcpserver

import (
	"context"

	"github.com/agentloom/loomfs/tracing"
)

// metaTraceparent is the key of a request's _meta under which a platform
// hands its W3C trace context, as MCP clients that trace do.
const metaTraceparent = "traceparent"

// withMetaTrace returns ctx continuing the trace a request's _meta names.
// A traceparent that is not one is ignored, as W3C Trace Context says: the
// call starts a trace of its own rather than fail.
func withMetaTrace(ctx context.Context, meta map[string]any) context.Context {
	tp, _ := meta[metaTraceparent].(string)
	if out, err := tracing.WithTraceparent(ctx, tp); err == nil {
		return out
	}
	return ctx
}
