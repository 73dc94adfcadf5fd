package nodeservice

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/fusefs"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/process"
	"github.com/agentloom/loomfs/sandbox"
	"github.com/agentloom/loomfs/store"
	"github.com/agentloom/loomfs/tools"
)

// served is a process.Service behind a Server on a socket of the test's,
// and a Toolbox that reaches it through a Client, as another process on
// the node would.
func served(tb testing.TB, scope string) *tools.Toolbox {
	root := tb.TempDir()
	ctx := context.Background()
	open := func(ctx context.Context, sc store.Scope) (*store.Workspace, audit.Sink, func(), error) {
		vol, err := store.OpenVolume(ctx, store.Config{Root: root})
		if err != nil {
			return nil, nil, nil, err
		}
		ws, err := vol.Open(ctx, sc, policy.Default())
		if err != nil {
			vol.Close()
			return nil, nil, nil, err
		}
		return ws, audit.Discard, func() { ws.Close(); vol.Close() }, nil
	}
	r, err := sandbox.NewRunner(ctx, sandbox.Config{Host: sandbox.HostFromEnv(), Image: "loomfs-sandbox-dev:latest",
		Node: "nodeservice-test", Runtime: os.Getenv("AGENT_LOOM_SANDBOX_RUNTIME")})
	if err != nil {
		tb.Fatal(err)
	}
	svc := process.NewService(process.Config{Runner: r, MountDir: filepath.Join(tb.TempDir(), "mnt"), Open: open,
		Mount: func(ctx context.Context, ws *store.Workspace, log audit.Sink, mp string, call sandbox.CallInfo) (sandbox.Projection, error) {
			return fusefs.Mount(ctx, ws, mp, fusefs.Options{AllowOther: true})
		}})
	sock := filepath.Join(tb.TempDir(), "sock", "serve.sock")
	ln, err := Listen(sock)
	if err != nil {
		tb.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	srv := &Server{Service: svc, Open: func(ctx context.Context, scope string) (*store.Workspace, func(), error) {
		sc, err := store.ParseScope(scope)
		if err != nil {
			return nil, nil, err
		}
		ws, _, done, err := open(ctx, sc)
		return ws, done, err
	}}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(sctx, ln) }()
	sc, _ := store.ParseScope(scope)
	ws, _, done, err := open(ctx, sc)
	if err != nil {
		tb.Fatal(err)
	}
	c := NewClient(sock)
	tb.Cleanup(func() {
		c.Close()
		cancel()
		<-served
		if err := svc.Close(); err != nil {
			tb.Errorf("service close: %v", err)
		}
		done()
		r.Close()
	})
	return &tools.Toolbox{WS: ws, Processes: c}
}

func call(tb testing.TB, t *tools.Toolbox, name string, in map[string]any) tools.ProcessOutput {
	tb.Helper()
	b, _ := json.Marshal(in)
	res, err := t.Call(context.Background(), name, "", b)
	if err != nil {
		tb.Fatalf("%s: %v", name, err)
	}
	var out tools.ProcessOutput
	json.Unmarshal(res, &out)
	return out
}

// Calls through the socket reach the service's processes, and its
// refusals come back with their codes.
func TestOverSocket(t *testing.T) {
	tb := served(t, "acme/coder/socket")
	out := call(t, tb, tools.ProcessStart, map[string]any{"command": "read x; echo got:$x", "yield_ms": 100})
	w := call(t, tb, tools.ProcessWrite, map[string]any{"process_id": out.ProcessID, "input": "over-the-socket\n", "yield_ms": 5000})
	if w.Status == tools.StatusRunning { // the answer came; the exit may follow it by a moment
		r := call(t, tb, tools.ProcessRead, map[string]any{"process_id": out.ProcessID, "since": w.Cursor, "yield_ms": 5000})
		w.Status = r.Status
	}
	if w.Stdout != "got:over-the-socket\n" || w.Status != tools.StatusExited {
		t.Fatalf("answer %+v", w)
	}
	_, err := tb.Call(context.Background(), tools.ProcessRead, "", []byte(`{"process_id":"p-000000000000"}`))
	if policy.CodeOf(err) != policy.NotFound {
		t.Fatalf("unknown process over the socket: %v, want not_found", err)
	}
	missing := &tools.Toolbox{WS: tb.WS, Processes: NewClient(filepath.Join(t.TempDir(), "none.sock"))}
	_, err = missing.Call(context.Background(), tools.ProcessList, "", []byte(`{}`))
	if policy.CodeOf(err) != policy.ProcessServiceUnavailable || strings.Contains(err.Error(), "/") {
		t.Fatalf("no service: %v, want process_service_unavailable without a host path", err)
	}
}

// BenchmarkREPLRoundTripSocket: a write/read round trip to a Python REPL
// over the node service's socket, as loomfs mcp makes it.
func BenchmarkREPLRoundTripSocket(b *testing.B) {
	tb := served(b, "acme/coder/bench-socket")
	out := call(b, tb, tools.ProcessStart, map[string]any{"command": "python3 -i -q", "yield_ms": 500})
	var l []time.Duration
	for b.Loop() {
		t0 := time.Now()
		w := call(b, tb, tools.ProcessWrite, map[string]any{"process_id": out.ProcessID, "input": "print(6*7)\n", "yield_ms": 5000})
		l = append(l, time.Since(t0))
		if !strings.Contains(w.Stdout, "42") {
			b.Fatalf("%+v", w)
		}
	}
	sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
	b.ReportMetric(float64(l[len(l)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(l[len(l)*9/10].Microseconds())/1000, "p90-ms")
}

// BenchmarkProcessStartWarmSocket: workspace_process_start of true with a
// warm session sandbox, over the socket.
func BenchmarkProcessStartWarmSocket(b *testing.B) {
	tb := served(b, "acme/coder/bench-warm-socket")
	call(b, tb, tools.ProcessStart, map[string]any{"command": "true", "yield_ms": 10000})
	var l []time.Duration
	for b.Loop() {
		t0 := time.Now()
		out := call(b, tb, tools.ProcessStart, map[string]any{"command": "true", "yield_ms": 10000})
		l = append(l, time.Since(t0))
		if out.Status != tools.StatusExited {
			b.Fatalf("%+v", out)
		}
	}
	sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
	b.ReportMetric(float64(l[len(l)/2].Microseconds())/1000, "p50-ms")
}
