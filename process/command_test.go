package process

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/fusefs"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/sandbox"
	"github.com/agentloom/loomfs/store"
	"github.com/agentloom/loomfs/tools"
)

// servedMount lets a session projection serve one command after another,
// as loom's does: the command's refusals reach its result.
type servedMount struct{ *fusefs.Mounted }

func (s servedMount) Serve(call sandbox.CallInfo) {
	var refused func(fusefs.Refusal)
	if call.Refused != nil {
		refused = func(r fusefs.Refusal) {
			call.Refused(tools.PolicyEvent{Op: r.Op, Path: r.Path, Code: string(r.Code), Message: r.Message})
		}
	}
	s.Mounted.Serve(fusefs.Call{CallID: call.CallID, Container: call.Container, Refused: refused})
}

// commandEnvs returns two toolboxes over one scope: workspace_command in
// a fresh container per command, and in the scope's session sandbox.
func commandEnvs(t testing.TB, scope string) (fresh, session *env) {
	t.Helper()
	root := t.TempDir()
	fresh = newEnv(t, root, testNode, scope, "")
	session = newEnv(t, root, testNode, scope, "commands: session\n")
	fresh.tb.Commands = &sandbox.Commands{Runner: fresh.svc.cfg.Runner, MountDir: filepath.Join(t.TempDir(), "mnt"),
		Mount: func(ctx context.Context, ws *store.Workspace, mp string, call sandbox.CallInfo) (sandbox.Projection, error) {
			m, err := fusefs.Mount(ctx, ws, mp, fusefs.Options{AllowOther: true, CallID: call.CallID, Audit: fresh.log})
			if err != nil {
				return nil, err
			}
			servedMount{m}.Serve(call)
			return m, nil
		}}
	session.useSessionCommands()
	return fresh, session
}

// useSessionCommands makes the env's workspace_command run in its
// service's session sandbox, over a projection that serves each command.
func (e *env) useSessionCommands() {
	mount := e.svc.cfg.Mount
	e.svc.cfg.Mount = func(ctx context.Context, ws *store.Workspace, log audit.Sink, mp string, call sandbox.CallInfo) (sandbox.Projection, error) {
		p, err := mount(ctx, ws, log, mp, call)
		if err != nil {
			return nil, err
		}
		return servedMount{p.(*fusefs.Mounted)}, nil
	}
	e.tb.Commands = e.svc
}

// command runs workspace_command through the Toolbox.
func (e *env) command(in map[string]any) (tools.CommandResult, error) {
	e.t.Helper()
	b, _ := json.Marshal(in)
	res, err := e.tb.Call(context.Background(), tools.Command, "", b)
	var out tools.CommandResult
	if err == nil {
		if err := json.Unmarshal(res, &out); err != nil {
			e.t.Fatal(err)
		}
	}
	return out, err
}

// "commands: session" answers every command as a fresh container does:
// exit codes, output and its caps, timeouts, policy events.
func TestSessionCommandsAnswerAsFresh(t *testing.T) {
	fresh, session := commandEnvs(t, "acme/coder/cmd-same")
	flood := "head -c 200000 /dev/zero | tr '\\000' a"
	for _, tc := range []struct {
		name    string
		in      map[string]any
		timeout bool
	}{
		{"true", map[string]any{"command": "true"}, false},
		{"exit code and both streams", map[string]any{"command": "echo out; echo err >&2; exit 3"}, false},
		{"stdout over the cap is truncated", map[string]any{"command": flood}, false},
		{"stderr over the cap is truncated", map[string]any{"command": flood + " >&2"}, false},
		{"umask 077 and the working directory", map[string]any{"command": "umask; pwd; id -u"}, false},
		{"environment", map[string]any{"command": "echo $HOME $TMPDIR $PYTHONDONTWRITEBYTECODE"}, false},
		{"timeout kills the command", map[string]any{"command": "echo before; sleep 30", "timeout_s": 3}, true},
		{"timeout kills its children", map[string]any{"command": "sleep 30 & sleep 30", "timeout_s": 3}, true},
		{"timeout kills a child in a session of its own", map[string]any{"command": "setsid sleep 30 & sleep 30", "timeout_s": 3}, true},
		{"a refusal is a policy event", map[string]any{"command": "touch .agentloom-x; echo $?"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want, err := fresh.command(tc.in)
			if err != nil {
				t.Fatalf("fresh: %v", err)
			}
			got, err := session.command(tc.in)
			if err != nil {
				t.Fatalf("session: %v", err)
			}
			if got.ExitCode != want.ExitCode || got.Stdout != want.Stdout || got.Stderr != want.Stderr ||
				got.StdoutTruncated != want.StdoutTruncated || got.StderrTruncated != want.StderrTruncated || got.TimedOut != want.TimedOut {
				t.Errorf("session answered\n%+v\nfresh answered\n%+v", brief(got), brief(want))
			}
			if got.TimedOut != tc.timeout {
				t.Errorf("timed_out %v, want %v", got.TimedOut, tc.timeout)
			}
			if len(got.PolicyEvents.Events) != len(want.PolicyEvents.Events) || got.PolicyEvents.Total != want.PolicyEvents.Total {
				t.Errorf("policy events: session %+v, fresh %+v", got.PolicyEvents, want.PolicyEvents)
			}
			for i := range got.PolicyEvents.Events {
				if g, w := got.PolicyEvents.Events[i], want.PolicyEvents.Events[i]; g.Op != w.Op || g.Path != w.Path || g.Code != w.Code {
					t.Errorf("policy event %d: session %+v, fresh %+v", i, g, w)
				}
			}
		})
	}
	// Every command ran in the one session container, never in one of its own.
	if n := len(session.svc.Sandboxes()); n != 1 {
		t.Fatalf("%d session sandboxes, want 1", n)
	}
}

func brief(r tools.CommandResult) tools.CommandResult {
	for _, s := range []*string{&r.Stdout, &r.Stderr} {
		if len(*s) > 80 {
			*s = (*s)[:40] + "…" + (*s)[len(*s)-40:]
		}
	}
	return r
}

// live lists the command lines of the session sandbox's processes, as
// a command sees them.
func (e *env) live(t *testing.T) string {
	t.Helper()
	r, err := e.command(map[string]any{"command": `for p in /proc/[0-9]*; do tr '\000' ' ' < $p/cmdline; echo; done`})
	if err != nil {
		t.Fatal(err)
	}
	return r.Stdout
}

// What a command leaves running ends with it, whichever way it left it:
// nothing of a workspace_command outlives its call. A process session's
// process, started on purpose, is left alone.
func TestSessionCommandLeavesNothing(t *testing.T) {
	e := newEnv(t, "", testNode, "acme/coder/cmd-left", "commands: session\n")
	e.useSessionCommands()
	kept := e.start(map[string]any{"command": "sleep 1001", "yield_ms": 100})
	for _, tc := range []struct{ name, command string }{
		{"background job holding the output", "sleep 1000 & echo started"},
		{"background job with its output elsewhere", "nohup sleep 1000 >/dev/null 2>&1 &"},
		{"orphaned grandchild", "(sleep 1000 &); echo started"},
		{"its own process group", "set -m; sleep 1000 & echo started"},
		{"its own session, holding the output", "setsid sleep 1000 & sleep 0.5; echo started"},
		{"a daemon: its own session, its output closed", "setsid sleep 1000 >/dev/null 2>&1 </dev/null & sleep 0.5"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			began := time.Now()
			r, err := e.command(map[string]any{"command": tc.command, "timeout_s": 60})
			if err != nil {
				t.Fatal(err)
			}
			if r.ExitCode != 0 || r.TimedOut {
				t.Fatalf("result %+v", r)
			}
			if d := time.Since(began); d > 20*time.Second {
				t.Fatalf("the command took %v: its main process exit was not the end", d)
			}
			if ps := e.live(t); strings.Contains(ps, "sleep 1000") {
				t.Fatalf("the command's background process outlived the call:\n%s", ps)
			}
			if r.Container != kept.Container {
				t.Fatalf("the command ran in %s, not the session sandbox %s: it was stopped", r.Container, kept.Container)
			}
		})
	}
	if ps := e.live(t); !strings.Contains(ps, "sleep 1001") {
		t.Fatalf("a command killed the process session's process:\n%s", ps)
	}
	var r tools.ProcessOutput
	e.must(tools.ProcessRead, map[string]any{"process_id": kept.ProcessID}, &r)
	if r.Status != tools.StatusRunning {
		t.Fatalf("process session's process after the commands: %+v", r)
	}
}

// The session's commands share its container: what one leaves in /tmp is
// there for the next (a fresh container starts empty), and writes to the
// workspace go through the projection both ways.
func TestSessionCommandsShareTheSandbox(t *testing.T) {
	fresh, session := commandEnvs(t, "acme/coder/cmd-share")
	for _, e := range []*env{fresh, session} {
		if _, err := e.command(map[string]any{"command": "echo kept > /tmp/keep"}); err != nil {
			t.Fatal(err)
		}
	}
	r, _ := session.command(map[string]any{"command": "cat /tmp/keep"})
	if r.Stdout != "kept\n" {
		t.Fatalf("session: /tmp after the last command: %+v", r)
	}
	r, _ = fresh.command(map[string]any{"command": "cat /tmp/keep"})
	if r.ExitCode == 0 {
		t.Fatalf("fresh: /tmp kept across commands: %+v", r)
	}

	if _, err := session.command(map[string]any{"command": "echo from-command > made.txt"}); err != nil {
		t.Fatal(err)
	}
	var rd tools.ReadResult
	session.must(tools.Read, map[string]any{"path": "made.txt"}, &rd)
	if rd.Content != "from-command\n" {
		t.Fatalf("tool door reads %q", rd.Content)
	}
	session.must(tools.Write, map[string]any{"path": "made.txt", "content": "from-tool\n"}, nil)
	r, _ = session.command(map[string]any{"command": "cat made.txt"})
	if r.Stdout != "from-tool\n" {
		t.Fatalf("the command reads %q after the tool's write", r.Stdout)
	}
	// The same workspace, seen by the fresh door too.
	r, _ = fresh.command(map[string]any{"command": "cat made.txt"})
	if r.Stdout != "from-tool\n" {
		t.Fatalf("fresh command reads %q", r.Stdout)
	}
}

// Refusals are the fresh door's: a bad timeout before anything runs, a
// quarantined scope before any sandbox starts.
func TestSessionCommandRefusals(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   map[string]any
		prep func(e *env)
		code policy.Code
	}{
		{"timeout 0", map[string]any{"command": "true", "timeout_s": 0}, nil, policy.InvalidInput},
		{"timeout over 120", map[string]any{"command": "true", "timeout_s": 121}, nil, policy.InvalidInput},
		{"empty command", map[string]any{"command": " "}, nil, policy.InvalidInput},
		{"quarantined scope", map[string]any{"command": "true"}, func(e *env) {
			if err := e.ws.Quarantine(store.Marker{Container: "loomfs-test-gone", Node: testNode, Time: time.Now()}, "test"); err != nil {
				t.Fatal(err)
			}
		}, policy.Quarantined},
	} {
		t.Run(tc.name, func(t *testing.T) {
			scope := "acme/coder/refuse-" + strings.NewReplacer(" ", "-").Replace(tc.name)
			fresh, session := commandEnvs(t, scope)
			if tc.prep != nil {
				tc.prep(fresh)
			}
			_, ferr := fresh.command(tc.in)
			_, serr := session.command(tc.in)
			if policy.CodeOf(ferr) != tc.code || policy.CodeOf(serr) != tc.code {
				t.Fatalf("fresh: %v; session: %v; want %s from both", ferr, serr, tc.code)
			}
			if n := len(session.svc.Sandboxes()); n != 0 {
				t.Fatalf("a refused command started %d session sandboxes", n)
			}
		})
	}
}

// A command's session sandbox ends after the policy's idle time with no
// command running, as a process session's does, and the service's close
// (the run's end) removes it.
func TestSessionCommandSandboxEnds(t *testing.T) {
	e := newEnv(t, "", testNode, "acme/coder/cmd-idle", "commands: session\nlimits:\n  session_idle: 2s\n")
	e.useSessionCommands()
	r, err := e.command(map[string]any{"command": "sleep 4; echo slept", "timeout_s": 10})
	if err != nil || r.Stdout != "slept\n" {
		t.Fatalf("a command longer than the idle time: %+v %v", r, err)
	}
	if m, _ := e.ws.SessionMarkerOf(); m == nil || m.Container != r.Container {
		t.Fatalf("session marker %+v while container %s runs", m, r.Container)
	}
	waitFor(t, "the idle session sandbox to end", 30*time.Second, func() bool { return e.containerGone(r.Container) })
	waitFor(t, "the session marker to go", 10*time.Second, func() bool { m, _ := e.ws.SessionMarkerOf(); return m == nil })

	r, err = e.command(map[string]any{"command": "true"})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.svc.Close(); err != nil {
		t.Fatal(err)
	}
	if !e.containerGone(r.Container) {
		t.Fatalf("container %s left after the service closed", r.Container)
	}
	if err := e.ws.CheckQuarantine(); err != nil {
		t.Fatalf("quarantined after confirmed stops: %v", err)
	}
}

// A command that comes while this node's own session sandbox of the scope
// is stopping waits for the stop, which lets the session lease go last,
// and runs in a new sandbox: it is not told that another worker holds it.
func TestSessionCommandWhileStopping(t *testing.T) {
	e := newEnv(t, "", testNode, "acme/coder/cmd-stopping", "commands: session\n")
	e.useSessionCommands()
	first, err := e.command(map[string]any{"command": "true"})
	if err != nil {
		t.Fatal(err)
	}
	e.svc.mu.Lock()
	b := e.svc.boxes[e.ws.Scope().Hash()]
	e.svc.mu.Unlock()
	if b == nil {
		t.Fatal("no session sandbox after a session command")
	}
	stopped := make(chan error, 1)
	go func() { stopped <- b.Stop(context.Background(), "test", "") }()
	waitFor(t, "the stop to begin", 10*time.Second, func() bool { return !b.alive() })
	r, err := e.command(map[string]any{"command": "echo again"})
	if err != nil || r.Stdout != "again\n" {
		t.Fatalf("a command while the sandbox stops: %+v %v", r, err)
	}
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if r.Container == first.Container {
		t.Fatalf("ran in the stopped sandbox %s", first.Container)
	}
	if !e.containerGone(first.Container) {
		t.Errorf("the stopped sandbox's container %s is still there", first.Container)
	}
}

// A session command is audited as the tool call it is, with the exec's
// start, kill and exit under its call id, and the FUSE records of what it
// did carry that call id too.
func TestSessionCommandAudit(t *testing.T) {
	e := newEnv(t, "", testNode, "acme/coder/cmd-audit", "commands: session\n")
	e.useSessionCommands()
	ctx := context.Background()
	if _, err := e.tb.Call(ctx, tools.Command, "call-cmd", []byte(`{"command":"echo x > made.txt"}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.tb.Call(ctx, tools.Command, "call-slow", []byte(`{"command":"sleep 30","timeout_s":1}`)); err != nil {
		t.Fatal(err)
	}
	var recs []audit.Record
	if err := audit.Query(audit.Dir(e.root), audit.Filter{}, func(r audit.Record) error { recs = append(recs, r); return nil }); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"exec_start": "call-cmd", "exec_exit": "call-cmd", "exec_kill": "call-slow", "container_start": "call-cmd", "tool": "call-cmd"}
	seen := map[string]bool{}
	fuse := false
	for _, r := range recs {
		if r.Source == audit.SourceSandbox && want[r.Op] == r.CallID {
			seen[r.Op] = true
		}
		if r.Source == audit.SourceFUSE && r.Path == "made.txt" && r.CallID == "call-cmd" {
			fuse = true
		}
		if r.Source == audit.SourceTool && r.Op == tools.Command && r.CallID == "call-cmd" && r.Result == "ok" {
			seen["tool"] = true
		}
	}
	for op, call := range want {
		if !seen[op] {
			t.Errorf("no %s record with call id %s", op, call)
		}
	}
	if !fuse {
		t.Errorf("no FUSE record of made.txt carries the command's call id")
	}
}
