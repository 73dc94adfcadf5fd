package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
	"github.com/agentloom/loomfs/tools"
)

// TestToolsOverMCP is the model's session: list, write, read, edit with a
// stale and a fresh sha256, grep, and the refusals a model meets, over
// each transport.
func TestToolsOverMCP(t *testing.T) {
	for _, tr := range transports {
		t.Run(string(tr), func(t *testing.T) {
			tb := newToolbox(t, nil)
			cs := connect(t, newServer(t, tb, Options{}), tr, nil)

			t.Run("lists the definitions of loomfs tools", func(t *testing.T) {
				listed, err := cs.ListTools(context.Background(), nil)
				if err != nil {
					t.Fatal(err)
				}
				defs := tools.Definitions(tb.WS.Policy())
				if len(listed.Tools) != len(defs) {
					t.Fatalf("listed %d tools, want %d", len(listed.Tools), len(defs))
				}
				byName := map[string]*mcp.Tool{}
				for _, tl := range listed.Tools {
					byName[tl.Name] = tl
				}
				for _, d := range defs {
					tl := byName[d.Name]
					if tl == nil {
						t.Errorf("%s not listed", d.Name)
						continue
					}
					if tl.Description != d.Description {
						t.Errorf("%s description differs from tools.Definitions", d.Name)
					}
					if !sameJSON(t, tl.InputSchema, d.InputSchema) {
						t.Errorf("%s input schema differs from tools.Definitions:\n got %v\nwant %s", d.Name, tl.InputSchema, d.InputSchema)
					}
					if tl.Annotations == nil || tl.Annotations.ReadOnlyHint == tools.Mutating(d.Name) {
						t.Errorf("%s: readOnlyHint does not match tools.Mutating", d.Name)
					}
				}
			})

			w := ok(t, callTool(t, cs, tools.Write, map[string]any{"path": "a.txt", "content": "alpha\nbeta\ngamma\n"}))
			sha1 := w["sha256"].(string)
			if w["created"] != true {
				t.Fatalf("write: %v", w)
			}

			t.Run("read is line-numbered text", func(t *testing.T) {
				res := callTool(t, cs, tools.Read, map[string]any{"path": "a.txt", "offset": 2})
				if r := ok(t, res); r["content"] != "beta\ngamma\n" || r["sha256"] != sha1 || r["total_lines"] != 3.0 {
					t.Fatalf("read: %v", r)
				}
				txt := text(res)
				for _, want := range []string{"     2\tbeta\n", "     3\tgamma\n", sha1} {
					if !strings.Contains(txt, want) {
						t.Errorf("read text lacks %q:\n%s", want, txt)
					}
				}
				if strings.Contains(txt, "alpha") {
					t.Errorf("read from offset 2 shows line 1:\n%s", txt)
				}
			})

			t.Run("edit with a stale sha256 is a conflict", func(t *testing.T) {
				ok(t, callTool(t, cs, tools.Write, map[string]any{"path": "a.txt", "content": "alpha\nBETA\ngamma\n", "expected_sha256": sha1}))
				res := callTool(t, cs, tools.Edit, map[string]any{"path": "a.txt", "old_text": "gamma", "new_text": "delta", "expected_sha256": sha1})
				e := toolError(t, res, policy.Conflict)
				cur, _ := e["current_sha256"].(string)
				if len(cur) != 64 || cur == sha1 || !strings.Contains(text(res), cur) {
					t.Fatalf("conflict does not carry the current sha256: %v / %q", e, text(res))
				}
				ed := ok(t, callTool(t, cs, tools.Edit, map[string]any{"path": "a.txt", "old_text": "gamma", "new_text": "delta", "expected_sha256": cur}))
				if ed["replacements"] != 1.0 {
					t.Fatalf("edit: %v", ed)
				}
			})

			t.Run("grep lists path:line: text", func(t *testing.T) {
				ok(t, callTool(t, cs, tools.Mkdir, map[string]any{"path": "src"}))
				ok(t, callTool(t, cs, tools.Write, map[string]any{"path": "src/b.go", "content": "package b\n// delta here\n"}))
				res := callTool(t, cs, tools.Grep, map[string]any{"pattern": "delta"})
				if m := ok(t, res); len(m["matches"].([]any)) != 2 {
					t.Fatalf("grep: %v", m)
				}
				txt := text(res)
				for _, want := range []string{"a.txt:3: delta\n", "src/b.go:2: // delta here\n", "2 matching lines in 2 files"} {
					if !strings.Contains(txt, want) {
						t.Errorf("grep text lacks %q:\n%s", want, txt)
					}
				}
			})

			t.Run("list shows directories with a slash", func(t *testing.T) {
				txt := text(callTool(t, cs, tools.List, map[string]any{}))
				if !strings.Contains(txt, "src/\n") || !strings.Contains(txt, "a.txt  ") {
					t.Errorf("list text:\n%s", txt)
				}
			})

			refusals := []struct {
				name string
				tool string
				args map[string]any
				code policy.Code
			}{
				{"path escape with ..", tools.Read, map[string]any{"path": "../../etc/passwd"}, policy.InvalidPath},
				{"absolute path", tools.Write, map[string]any{"path": "/etc/passwd", "content": "x"}, policy.InvalidPath},
				{"text over the 2 MiB limit", tools.Write, map[string]any{"path": "big.txt", "content": strings.Repeat("x", 2<<20+1)}, policy.TooLarge},
				{"missing file", tools.Read, map[string]any{"path": "nope.txt"}, policy.NotFound},
				{"ambiguous edit", tools.Edit, map[string]any{"path": "a.txt", "old_text": "a", "new_text": "b"}, policy.AmbiguousEdit},
				{"command without a sandbox", tools.Command, map[string]any{"command": "true"}, policy.SandboxUnavailable},
			}
			for _, c := range refusals {
				t.Run(c.name, func(t *testing.T) {
					toolError(t, callTool(t, cs, c.tool, c.args), c.code)
				})
			}
			if _, err := tb.WS.Lstat("big.txt"); policy.CodeOf(err) != policy.NotFound {
				t.Errorf("refused oversize write left a file: %v", err)
			}
		})
	}
}

// TestQuotaRefusal: a write past the scope's byte quota is a tool error
// naming the limit and the figures.
func TestQuotaRefusal(t *testing.T) {
	pol := policy.Default()
	pol.Limits.ScopeBytes = 1 << 10
	tb := newToolbox(t, pol)
	for _, tr := range transports {
		t.Run(string(tr), func(t *testing.T) {
			cs := connect(t, newServer(t, tb, Options{}), tr, nil)
			res := callTool(t, cs, tools.Write, map[string]any{"path": "q-" + string(tr), "content": strings.Repeat("q", 2<<10)})
			e := toolError(t, res, policy.QuotaExceeded)
			if msg := e["message"].(string); !strings.Contains(msg, "1 KiB") || !strings.Contains(msg, "2 KiB") {
				t.Errorf("quota message does not name the limit and the write: %q", msg)
			}
			ok(t, callTool(t, cs, tools.Write, map[string]any{"path": "small-" + string(tr), "content": "fits"}))
		})
	}
}

// blockingRunner stands in for the sandbox: a command runs until it is
// released or its context ends, and says which.
type blockingRunner struct {
	started chan string   // call id of each command started
	ended   chan error    // ctx.Err() when the context ended first, nil when released
	release chan struct{} // each value lets one command finish
	stop    chan struct{} // closed: every command finishes
}

func newBlockingRunner() *blockingRunner {
	return &blockingRunner{started: make(chan string, 10), ended: make(chan error, 10), release: make(chan struct{}, 10), stop: make(chan struct{})}
}

// finishAtCleanup lets every command finish when the test ends. Call it
// after connect, so that it runs before the server is asked to stop.
func (r *blockingRunner) finishAtCleanup(t *testing.T) {
	t.Cleanup(func() { close(r.stop) })
}

func (r *blockingRunner) RunCommand(ctx context.Context, ws *store.Workspace, req tools.CommandRequest) (tools.CommandResult, error) {
	r.started <- req.CallID
	select {
	case <-ctx.Done():
		r.ended <- ctx.Err()
		return tools.CommandResult{}, ctx.Err()
	case <-r.release:
	case <-r.stop:
	}
	r.ended <- nil
	return tools.CommandResult{ExitCode: 0, Stdout: "done\n"}, nil
}

// TestCancelStopsHandler: a client's cancellation reaches the context the
// tool runs under — for a command (the runner sees it), and for a write
// waiting on the scope lock (it gives up long before its own wait ends).
func TestCancelStopsHandler(t *testing.T) {
	for _, tr := range transports {
		t.Run(string(tr)+"/command", func(t *testing.T) {
			tb := newToolbox(t, nil)
			runner := newBlockingRunner()
			tb.Commands = runner
			cs := connect(t, newServer(t, tb, Options{}), tr, nil)
			runner.finishAtCleanup(t)

			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			go func() {
				_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tools.Command, Arguments: map[string]any{"command": "sleep 100", "timeout_s": 120}})
				errc <- err
			}()
			select {
			case <-runner.started:
			case <-time.After(10 * time.Second):
				t.Fatal("command never started")
			}
			cancel()
			select {
			case err := <-runner.ended:
				if !errors.Is(err, context.Canceled) {
					t.Fatalf("runner ended with %v, want context.Canceled", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("runner still running 10 s after the client cancelled")
			}
			if err := <-errc; err == nil {
				t.Error("cancelled call reported success")
			}
			// The scope lock was let go: the next write goes through.
			ok(t, callTool(t, cs, tools.Write, map[string]any{"path": "after.txt", "content": "x"}))
		})

		t.Run(string(tr)+"/write waiting for the lock", func(t *testing.T) {
			tb := newToolbox(t, nil)
			tb.LockWait = time.Minute
			cs := connect(t, newServer(t, tb, Options{}), tr, nil)
			unlock, err := tb.WS.Lock(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			defer unlock()

			ctx, cancel := context.WithCancel(context.Background())
			go cs.CallTool(ctx, &mcp.CallToolParams{Name: tools.Write, Arguments: map[string]any{"path": "w.txt", "content": "x"}})
			rec := recorderOf(tb)
			rec.waitFor(t, 10*time.Second, "write started", func(e audit.Event) bool { return e.Op == tools.Write && e.Result == "started" })
			time.Sleep(100 * time.Millisecond) // into the lock wait
			start := time.Now()
			cancel()
			rec.waitFor(t, 10*time.Second, "write ended", func(e audit.Event) bool { return e.Op == tools.Write && e.Result != "started" })
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("write gave up %s after cancel", d)
			}
			if _, err := tb.WS.Lstat("w.txt"); policy.CodeOf(err) != policy.NotFound {
				t.Errorf("cancelled write happened: %v", err)
			}
		})
	}
}

// TestProgress: a call with a progress token hears that it is still
// running; one without hears nothing.
func TestProgress(t *testing.T) {
	for _, tr := range transports {
		t.Run(string(tr), func(t *testing.T) {
			tb := newToolbox(t, nil)
			runner := newBlockingRunner()
			tb.Commands = runner
			notes := make(chan *mcp.ProgressNotificationParams, 100)
			copts := &mcp.ClientOptions{ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
				notes <- r.Params
			}}
			cs := connect(t, newServer(t, tb, Options{ProgressEvery: 20 * time.Millisecond}), tr, copts)
			runner.finishAtCleanup(t)

			params := &mcp.CallToolParams{Name: tools.Command, Arguments: map[string]any{"command": "make"}}
			params.SetProgressToken("tok-1")
			resc := make(chan *mcp.CallToolResult, 1)
			go func() {
				res, err := cs.CallTool(context.Background(), params)
				if err != nil {
					t.Error(err)
				}
				resc <- res
			}()
			<-runner.started
			var got []*mcp.ProgressNotificationParams
			for len(got) < 3 {
				select {
				case n := <-notes:
					got = append(got, n)
				case <-time.After(10 * time.Second):
					t.Fatalf("%d progress notifications in 10 s, want 3", len(got))
				}
			}
			runner.release <- struct{}{}
			if res := <-resc; res == nil || !strings.Contains(text(res), "exit code 0") || !strings.Contains(text(res), "done") {
				t.Fatalf("command result: %+v", res)
			}
			for i, n := range got {
				if n.ProgressToken != "tok-1" {
					t.Errorf("notification %d has token %v", i, n.ProgressToken)
				}
				if i > 0 && n.Progress <= got[i-1].Progress {
					t.Errorf("progress did not increase: %v then %v", got[i-1].Progress, n.Progress)
				}
				if !strings.Contains(n.Message, tools.Command) {
					t.Errorf("progress message %q does not name the tool", n.Message)
				}
			}

			// Without a token: no notifications.
			for len(notes) > 0 {
				<-notes
			}
			go func() { time.Sleep(150 * time.Millisecond); runner.release <- struct{}{} }()
			ok(t, callTool(t, cs, tools.Command, map[string]any{"command": "make"}))
			if len(notes) != 0 {
				t.Errorf("%d progress notifications for a call without a progress token", len(notes))
			}
		})
	}
}

// TestCallIDs: each request's call id is "mcp-<session>-<request id>",
// unique per request and per session, and it reaches the audit record.
func TestCallIDs(t *testing.T) {
	for _, tr := range transports {
		t.Run(string(tr), func(t *testing.T) {
			tb := newToolbox(t, nil)
			s := newServer(t, tb, Options{})
			seen := map[string]bool{}
			prefixes := map[string]bool{}
			for sess := range 2 {
				cs := connect(t, s, tr, nil)
				for i := range 2 {
					ok(t, callTool(t, cs, tools.Write, map[string]any{"path": "f.txt", "content": strings.Repeat("x", sess*10+i)}))
				}
				for _, e := range recorderOf(tb).all() {
					if e.Result != "ok" || seen[e.CallID] {
						continue
					}
					seen[e.CallID] = true
					id := e.CallID
					if !strings.HasPrefix(id, "mcp-") {
						t.Fatalf("call id %q does not start with mcp-", id)
					}
					cut := strings.LastIndex(id, "-")
					prefixes[id[:cut]] = true
					if tr == overHTTP && id[:cut] != "mcp-"+cs.ID() {
						t.Errorf("call id %q is not of HTTP session %q", id, cs.ID())
					}
				}
			}
			if len(seen) != 4 || len(prefixes) != 2 {
				t.Fatalf("call ids %v: want 4 distinct in 2 sessions", seen)
			}
		})
	}
}

func sameJSON(t *testing.T, a any, b json.RawMessage) bool {
	t.Helper()
	ab, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	var x, y any
	json.Unmarshal(ab, &x)
	json.Unmarshal(b, &y)
	return reflect.DeepEqual(x, y)
}
