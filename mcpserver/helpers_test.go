package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
	"github.com/agentloom/loomfs/tools"
)

// recorder is an audit sink that keeps what it is told.
type recorder struct {
	mu     sync.Mutex
	events []audit.Event
	added  chan struct{} // signalled on every event
}

func newRecorder() *recorder { return &recorder{added: make(chan struct{}, 1)} }

func (r *recorder) Record(_ context.Context, e audit.Event) error {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
	select {
	case r.added <- struct{}{}:
	default:
	}
	return nil
}

func (r *recorder) all() []audit.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]audit.Event(nil), r.events...)
}

// waitFor waits until an event satisfies ok, or fails after d.
func (r *recorder) waitFor(t *testing.T, d time.Duration, what string, ok func(audit.Event) bool) audit.Event {
	t.Helper()
	deadline := time.After(d)
	for {
		for _, e := range r.all() {
			if ok(e) {
				return e
			}
		}
		select {
		case <-r.added:
		case <-deadline:
			t.Fatalf("no audit event %s within %s; have %+v", what, d, r.all())
		}
	}
}

// newToolbox opens a fresh main scope on a temporary local root.
func newToolbox(t *testing.T, pol *policy.Policy) *tools.Toolbox {
	t.Helper()
	ctx := context.Background()
	vol, err := store.OpenVolume(ctx, store.Config{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vol.Close() })
	ws, err := vol.Open(ctx, store.Scope{Space: "sp", Agent: "ag", Session: "se"}, pol)
	if err != nil {
		t.Fatal(err)
	}
	tb := &tools.Toolbox{WS: ws, Audit: newRecorder()}
	t.Cleanup(func() { tb.Wait(); ws.Close() })
	return tb
}

func recorderOf(tb *tools.Toolbox) *recorder { return tb.Audit.(*recorder) }

func newServer(t *testing.T, tb *tools.Toolbox, opts Options) *Server {
	t.Helper()
	s, err := New(tb, opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// transport names how a test client reaches the server.
type transport string

const (
	overPipe transport = "pipe" // newline-delimited JSON over a pipe: the stdio code path
	overHTTP transport = "http" // streamable HTTP on a real loopback listener
)

var transports = []transport{overPipe, overHTTP}

// connect starts s on tr and returns a client session to it.
func connect(t *testing.T, s *Server, tr transport, copts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var ct mcp.Transport
	done := make(chan error, 1)
	switch tr {
	case overPipe:
		st, c := mcp.NewInMemoryTransports()
		go func() { done <- s.Run(ctx, st) }()
		ct = c
	case overHTTP:
		ln, err := Listen("127.0.0.1:0", false)
		if err != nil {
			t.Fatal(err)
		}
		go func() { done <- s.ServeHTTP(ctx, ln, "", time.Second) }()
		ct = &mcp.StreamableClientTransport{Endpoint: "http://" + ln.Addr().String(), MaxRetries: -1}
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, copts).Connect(ctx, ct, nil)
	if err != nil {
		cancel()
		t.Fatalf("connect over %s: %v", tr, err)
	}
	t.Cleanup(func() {
		cs.Close()
		cancel()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, mcp.ErrConnectionClosed) {
				t.Logf("server over %s ended: %v", tr, err)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("server over %s did not stop", tr)
		}
	})
	return cs
}

// callTool calls a tool; a protocol error fails the test.
func callTool(t *testing.T, cs *mcp.ClientSession, name string, args any) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: protocol error: %v", name, err)
	}
	return res
}

// ok returns a successful result's structured content.
func ok(t *testing.T, res *mcp.CallToolResult) map[string]any {
	t.Helper()
	if res.IsError {
		t.Fatalf("tool error: %s", text(res))
	}
	return structured(t, res)
}

func structured(t *testing.T, res *mcp.CallToolResult) map[string]any {
	t.Helper()
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("structured content is not an object: %s", b)
	}
	return m
}

func text(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// toolError checks res is a tool error with code and returns the error
// object of its structured content.
func toolError(t *testing.T, res *mcp.CallToolResult, code policy.Code) map[string]any {
	t.Helper()
	if !res.IsError {
		t.Fatalf("want tool error %s, got success: %s", code, text(res))
	}
	e, _ := structured(t, res)["error"].(map[string]any)
	if e == nil || e["code"] != string(code) {
		t.Fatalf("want error code %s, got %v (text %q)", code, e, text(res))
	}
	if msg, _ := e["message"].(string); msg == "" || !strings.HasPrefix(text(res), string(code)+": "+msg) {
		t.Fatalf("text %q is not %q followed by the message %q", text(res), string(code)+": ", msg)
	}
	return e
}

// bearerClient adds an Authorization header to every request.
type bearerClient struct {
	token string
	base  http.RoundTripper
}

func (b bearerClient) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.base.RoundTrip(r)
}
