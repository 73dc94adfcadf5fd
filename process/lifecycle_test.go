package process

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/retention"
	"github.com/agentloom/loomfs/snapshot"
	"github.com/agentloom/loomfs/tools"
)

// containerGone reports whether the engine no longer knows the container.
func (e *env) containerGone(name string) bool {
	ok, err := e.svc.cfg.Runner.ContainerExists(context.Background(), name)
	return err == nil && !ok
}

func waitFor(t testing.TB, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A server keeps running across calls while tool writes go through (the
// scope lock is not held for its life), then INT ends it and its exit code
// is reported.
func TestServerSurvivesWritesThenINT(t *testing.T) {
	e := newEnv(t, "", testNode, "acme/coder/server", "")
	out := e.start(map[string]any{"command": "exec python3 -u -m http.server 8000 --bind 127.0.0.1", "yield_ms": 1000})
	if out.Status != tools.StatusRunning {
		t.Fatalf("server status %s: %q", out.Status, out.Output)
	}
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		var w tools.WriteResult
		e.must(tools.Write, map[string]any{"path": "notes.txt", "content": strings.Repeat("x", i)}, &w)
		time.Sleep(500 * time.Millisecond)
	}
	var r tools.ProcessOutput
	e.must(tools.ProcessRead, map[string]any{"process_id": out.ProcessID, "since": out.Cursor}, &r)
	if r.Status != tools.StatusRunning {
		t.Fatalf("server not running 10 s later: %+v", r)
	}
	// The server serves the workspace, written through the tools.
	var c tools.ProcessOutput
	e.must(tools.ProcessStart, map[string]any{"command": "python3 -c \"import urllib.request as u; print(len(u.urlopen('http://127.0.0.1:8000/notes.txt').read()))\"", "yield_ms": 10000}, &c)
	if c.Status != tools.StatusExited || *c.ExitCode != 0 {
		t.Fatalf("fetch from the server: %+v", c)
	}
	var info tools.ProcessInfo
	e.must(tools.ProcessSignal, map[string]any{"process_id": out.ProcessID, "signal": "INT"}, &info)
	waitFor(t, "the server to exit", 10*time.Second, func() bool {
		e.must(tools.ProcessRead, map[string]any{"process_id": out.ProcessID, "since": 0}, &r)
		return r.Status == tools.StatusExited
	})
	if r.ExitCode == nil {
		t.Fatalf("exit code not reported: %+v", r)
	}
	var list tools.ProcessListResult
	e.must(tools.ProcessList, map[string]any{}, &list)
	found := false
	for _, p := range list.Processes {
		if p.ProcessID == out.ProcessID {
			found = p.Status == tools.StatusExited && p.Signal == "INT" && p.ExitCode != nil && *p.ExitCode == *r.ExitCode
		}
	}
	if !found {
		t.Fatalf("list does not show the server exited after INT: %+v", list)
	}
}

// The session sandbox ends after the policy's idle time, and after its
// maximum lifetime even with a process running; the container is removed
// and the session marker cleared.
func TestIdleAndLifetime(t *testing.T) {
	for _, tc := range []struct {
		name, policy, command string
	}{
		{"idle timeout", "limits:\n  session_idle: 2s\n", "true"},
		{"max lifetime", "limits:\n  session_lifetime: 4s\n", "sleep 600"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, "", testNode, "acme/coder/"+strings.ReplaceAll(tc.name, " ", "-"), tc.policy)
			out := e.start(map[string]any{"command": tc.command, "yield_ms": 100})
			if m, _ := e.ws.SessionMarkerOf(); m == nil || m.Container != out.Container {
				t.Fatalf("session marker %+v while container %s runs", m, out.Container)
			}
			waitFor(t, "the session sandbox to end", 30*time.Second, func() bool { return e.containerGone(out.Container) })
			waitFor(t, "the session marker to go", 10*time.Second, func() bool {
				m, _ := e.ws.SessionMarkerOf()
				return m == nil
			})
			var r tools.ProcessOutput
			e.must(tools.ProcessRead, map[string]any{"process_id": out.ProcessID}, &r)
			if r.Status != tools.StatusExited {
				t.Fatalf("process after its sandbox ended: %+v", r)
			}
			if err := e.ws.CheckQuarantine(); err != nil {
				t.Fatalf("scope quarantined after a confirmed stop: %v", err)
			}
		})
	}
}

// A call for a process another node owns answers process_on_other_node
// naming that node, and that node's lease keeps a second node from
// starting a sandbox over the same scope. Two roots of one volume when
// LOOMFS_DFS_ROOTS names them, else one directory seen by both.
func TestProcessOnOtherNode(t *testing.T) {
	rootA, rootB := t.TempDir(), ""
	if roots := strings.Split(os.Getenv("LOOMFS_DFS_ROOTS"), ","); len(roots) == 2 {
		name := "process-test-" + filepath.Base(t.TempDir())
		rootA, rootB = filepath.Join(roots[0], name), filepath.Join(roots[1], name)
		if err := os.Mkdir(rootA, 0o700); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(rootA) })
		waitFor(t, "the directory on the second client", 10*time.Second, func() bool { _, err := os.Stat(rootB); return err == nil })
	} else {
		rootB = rootA
	}
	scope := "acme/coder/nodes"
	a := newEnv(t, rootA, testNode, scope, "")
	b := newEnv(t, rootB, testNode+"-b", scope, "")
	out := a.start(map[string]any{"command": "sleep 600", "yield_ms": 100})
	for _, tc := range []struct {
		name string
		in   map[string]any
	}{
		{tools.ProcessRead, map[string]any{"process_id": out.ProcessID}},
		{tools.ProcessWrite, map[string]any{"process_id": out.ProcessID, "input": "x\n"}},
		{tools.ProcessSignal, map[string]any{"process_id": out.ProcessID, "signal": "KILL"}},
	} {
		err := b.call(tc.name, tc.in, nil)
		if policy.CodeOf(err) != policy.ProcessOnOtherNode || !strings.Contains(err.Error(), testNode) {
			t.Errorf("%s from node b: %v, want process_on_other_node naming %s", tc.name, err, testNode)
		}
	}
	err := b.call(tools.ProcessStart, map[string]any{"command": "true"}, nil)
	if policy.CodeOf(err) != policy.ProcessOnOtherNode {
		t.Errorf("start on node b while node a runs the session: %v, want process_on_other_node", err)
	}
	// The KILL's answer waits a few seconds for the end; on a loaded node
	// (under gVisor, its sweep reads /proc a byte at a time) a read tells it.
	var info tools.ProcessInfo
	a.must(tools.ProcessSignal, map[string]any{"process_id": out.ProcessID, "signal": "KILL"}, &info)
	var r tools.ProcessOutput
	waitFor(t, "the killed process to exit", 30*time.Second, func() bool {
		a.must(tools.ProcessRead, map[string]any{"process_id": out.ProcessID, "yield_ms": 1000}, &r)
		return r.Status == tools.StatusExited
	})
}

// Process start, input (bytes, not content), signal, exit and the
// container's lifecycle are audited with the call ids that made them.
func TestProcessAudit(t *testing.T) {
	e := newEnv(t, "", testNode, "acme/coder/audit", "")
	ctx := context.Background()
	res, err := e.tb.Call(ctx, tools.ProcessStart, "call-start", []byte(`{"command":"read x; sleep 600","yield_ms":100}`))
	if err != nil {
		t.Fatal(err)
	}
	id := between(string(res), `"process_id":"`, `"`)
	var rec Record
	if ok, _ := e.ws.ReadProcessRecord(id, &rec); !ok || rec.CallID != "call-start" {
		t.Fatalf("record %+v: want the start's call id", rec)
	}
	if _, err := e.tb.Call(ctx, tools.ProcessWrite, "call-write", []byte(`{"process_id":"`+id+`","input":"secret\n","yield_ms":100}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.tb.Call(ctx, tools.ProcessSignal, "call-signal", []byte(`{"process_id":"`+id+`","signal":"TERM"}`)); err != nil {
		t.Fatal(err)
	}
	res, err = e.tb.Call(ctx, tools.ProcessStart, "call-make", []byte(`{"command":"echo x > made.txt","yield_ms":5000}`))
	if err != nil {
		t.Fatal(err)
	}
	maker := between(string(res), `"process_id":"`, `"`)
	if stopped, err := e.svc.Stop(ctx, e.ws, "call-stop"); err != nil || !stopped {
		t.Fatalf("stop: %v %v", stopped, err)
	}
	var recs []audit.Record
	if err := audit.Query(audit.Dir(e.root), audit.Filter{}, func(r audit.Record) error { recs = append(recs, r); return nil }); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"process_start": "call-start", "process_input": "call-write", "process_signal": "call-signal",
		"process_exit": "call-start", "container_create": "call-start", "container_start": "call-start", "container_removed": "call-stop"}
	seen := map[string]bool{}
	for _, r := range recs {
		if r.Source != audit.SourceSandbox {
			continue
		}
		if call, ok := want[r.Op]; ok && r.CallID == call {
			seen[r.Op] = true
		}
		if r.Op == "process_input" && r.Bytes != 7 {
			t.Errorf("process_input bytes %d, want 7", r.Bytes)
		}
		if strings.Contains(fmt.Sprint(r), "secret") {
			t.Errorf("an audit record holds the input's content: %+v", r)
		}
	}
	attributed := false
	for _, r := range recs {
		if r.Source == audit.SourceFUSE && r.Path == "made.txt" && r.Detail["process_id"] == maker {
			attributed = true
		}
	}
	if !attributed && os.Getenv("AGENT_LOOM_SANDBOX_RUNTIME") == "" {
		t.Errorf("no FUSE record of made.txt carries process id %s", maker)
		for _, r := range recs {
			if r.Path == "made.txt" {
				t.Logf("%s %s %v", r.Source, r.Op, r.Detail)
			}
		}
	}
	for op := range want {
		if !seen[op] {
			t.Errorf("no %s record with call id %s", op, want[op])
		}
	}
}

func between(s, a, b string) string {
	_, s, _ = strings.Cut(s, a)
	s, _, _ = strings.Cut(s, b)
	return s
}

// Records of ended processes stay for late readers, then are collected;
// a running process's record stays.
func TestEndedRecordsCollected(t *testing.T) {
	e := newEnvKeeping(t, "", testNode, "acme/coder/collect", "", 2*time.Second)
	ended := e.start(map[string]any{"command": "echo done", "yield_ms": 5000})
	running := e.start(map[string]any{"command": "sleep 600", "yield_ms": 100})
	var r tools.ProcessOutput
	e.must(tools.ProcessRead, map[string]any{"process_id": ended.ProcessID}, &r)
	if r.Output != "done\n" || r.Status != tools.StatusExited {
		t.Fatalf("late read of an ended process: %+v", r)
	}
	var rec Record
	if ok, _ := e.ws.ReadProcessRecord(ended.ProcessID, &rec); !ok || rec.Node != testNode || rec.Container != ended.Container || rec.ExecID == "" || rec.Command != "echo done" || rec.Started.IsZero() {
		t.Fatalf("record %+v", rec)
	}
	time.Sleep(2500 * time.Millisecond)
	var list tools.ProcessListResult
	e.must(tools.ProcessList, map[string]any{}, &list)
	if len(list.Processes) != 1 || list.Processes[0].ProcessID != running.ProcessID {
		t.Fatalf("after the keep time: %+v, want only the running process", list.Processes)
	}
	if err := e.call(tools.ProcessRead, map[string]any{"process_id": ended.ProcessID}, nil); policy.CodeOf(err) != policy.NotFound {
		t.Fatalf("read of a collected process: %v, want not_found", err)
	}
}

// A process changing a file between a model's read and its write makes
// the write's expected_sha256 fail with conflict and the current hash,
// never a silent overwrite: the CAS half of the lock rule.
func TestProcessWriteMeetsCAS(t *testing.T) {
	e := newEnv(t, "", testNode, "acme/coder/cas", "")
	var w tools.WriteResult
	e.must(tools.Write, map[string]any{"path": "f.txt", "content": "one\n"}, &w)
	out := e.start(map[string]any{"command": "echo two >> f.txt", "yield_ms": 5000})
	if out.Status != tools.StatusExited || *out.ExitCode != 0 {
		t.Fatalf("append: %+v", out)
	}
	err := e.call(tools.Write, map[string]any{"path": "f.txt", "content": "mine\n", "expected_sha256": w.SHA256}, nil)
	if pe := policy.AsError(err); pe.Code != policy.Conflict || pe.SHA256 == "" || pe.SHA256 == w.SHA256 {
		t.Fatalf("stale write: %v, want conflict with the new hash", err)
	}
}

// Snapshots and restores refuse while the session sandbox runs, as gc
// leaves its scope alone; once it stopped they work.
func TestSnapshotRefusedDuringSession(t *testing.T) {
	e := newEnv(t, "", testNode, "acme/coder/snap", "")
	e.start(map[string]any{"command": "sleep 600", "yield_ms": 100})
	ctx := context.Background()
	if _, err := snapshot.Create(ctx, e.ws, snapshot.Options{Label: "during"}); policy.CodeOf(err) != policy.Conflict {
		t.Fatalf("snapshot during a session: %v, want conflict", err)
	}
	if err := e.ws.Volume().CheckIdle(e.ws.Scope()); policy.CodeOf(err) != policy.Conflict {
		t.Fatalf("CheckIdle (gc, restore) during a session: %v, want conflict", err)
	}
	if _, err := e.svc.Stop(ctx, e.ws, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := snapshot.Create(ctx, e.ws, snapshot.Options{Label: "after"}); err != nil {
		t.Fatalf("snapshot after the session: %v", err)
	}
}

// later is a clock far enough ahead that every session is old.
type later struct{}

func (later) Now() time.Time { return time.Now().Add(365 * 24 * time.Hour) }

// gc never removes a session whose scope has a live session sandbox; it
// keeps it and says why.
func TestGCKeepsLiveSession(t *testing.T) {
	e := newEnv(t, "", testNode, "acme/coder/gc", "")
	e.start(map[string]any{"command": "sleep 600", "yield_ms": 100})
	rep, err := retention.Collect(context.Background(), e.ws.Volume(), retention.Options{Clock: later{}})
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range rep.Removed {
		if it.Kind == retention.KindSession {
			t.Fatalf("gc removed %s while its session sandbox ran", it.Scope)
		}
	}
	kept := false
	for _, it := range rep.Kept {
		kept = kept || (it.Kind == retention.KindSession && strings.Contains(it.Reason, "session sandbox"))
	}
	if !kept {
		t.Fatalf("gc report %+v does not keep the session for its sandbox", rep)
	}
}
