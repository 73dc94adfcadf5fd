package store_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// TestScopeLockAcrossProcesses: the scope lock is a POSIX advisory lock on
// .agentloom-locks/<scope-hash>/scope.lock, named by the logical scope, so
// two processes that reach the volume by different paths (as two nodes
// with different mount points do) contend on it (SPEC §7.2).
func TestScopeLockAcrossProcesses(t *testing.T) {
	e := newEnv(t)
	ws := e.open(t, mainScope, nil)
	alias := filepath.Join(t.TempDir(), "mnt-loom")
	symlink(t, e.root, alias)

	cmd := helper(t, "hold-lock", alias, mainScope)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	lines := readLines(out)
	expectLine(t, lines, "locked", 30*time.Second)

	lockFile := filepath.Join(e.root, store.LocksDir, mainScope.Hash(), store.LockFile)
	if _, err := os.Stat(lockFile); err != nil {
		t.Fatalf("the lock file is not where SPEC §7.2 puts it: %v", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	unlock, err := ws.Lock(ctx)
	if err == nil {
		unlock()
		t.Fatal("Lock succeeded while another process holds the scope lock")
	}
	codeIs(t, "Lock while another process holds it", err, policy.Timeout)
	if d := time.Since(start); d < 250*time.Millisecond {
		t.Errorf("Lock gave up after %v, before its context was done", d)
	}
	if !strings.Contains(err.Error(), "retry") {
		t.Errorf("timeout message %q does not tell the caller to retry", err)
	}

	stdin.Close() // the holder releases and exits
	ctx2, cancel2 := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel2()
	unlock, err = ws.Lock(ctx2)
	if err != nil {
		t.Fatalf("Lock after the holder released: %v (holder: %s)", err, stderr.String())
	}
	unlock()
	expectLine(t, lines, "released", 30*time.Second)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("holder: %v: %s", err, stderr.String())
	}
}

// TestScopeLockInProcess: the lock also excludes another handle in the
// same process (open-file-description locks), and only its own scope.
func TestScopeLockInProcess(t *testing.T) {
	e := newEnv(t)
	ws := e.open(t, mainScope, nil)
	ws2 := e.open(t, mainScope, nil)
	other := e.open(t, childScope, nil)
	unlock, err := ws.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if u, err := ws2.Lock(ctx); err == nil {
		u()
		t.Fatal("a second handle in the same process took a held lock")
	} else {
		codeIs(t, "second Lock", err, policy.Timeout)
	}
	uo, err := other.Lock(context.Background())
	if err != nil {
		t.Fatalf("another scope's lock is not independent: %v", err)
	}
	uo()
	unlock()
	u, err := ws2.Lock(context.Background())
	if err != nil {
		t.Fatalf("Lock after unlock: %v", err)
	}
	u()
}

// TestStaleMarkerQuarantines: a command's execution marker found by the
// next lock holder means its owner died; the scope is quarantined then:
// writes refused, reads still work (SPEC §5, §7.3).
func TestStaleMarkerQuarantines(t *testing.T) {
	e := newEnv(t)
	ws := e.open(t, mainScope, nil)
	ctx := context.Background()
	if _, err := ws.WriteFile(ctx, "keep.txt", []byte("kept"), nil); err != nil {
		t.Fatal(err)
	}

	unlock, err := ws.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m := store.Marker{Container: "loomfs-cmd-1", Node: "node-a", PID: 4242, Run: "run-1", Call: "call-7", Time: time.Now().UTC()}
	if err := ws.SetMarker(m); err != nil {
		t.Fatal(err)
	}
	if err := ws.SetMarker(m); err == nil {
		t.Errorf("a second marker replaced the first")
	}
	unlock() // the worker dies: the marker is never cleared
	if err := ws.CheckQuarantine(); err != nil {
		t.Fatalf("quarantined before anyone found the marker: %v", err)
	}

	unlock, err = ws.Lock(ctx)
	if err != nil {
		t.Fatalf("Lock finding a stale marker: %v", err)
	}
	unlock()

	err = ws.CheckQuarantine()
	codeIs(t, "CheckQuarantine", err, policy.Quarantined)
	if err != nil && (!strings.Contains(err.Error(), "loomfs-cmd-1") || !strings.Contains(err.Error(), "node-a")) {
		t.Errorf("quarantine message %q does not name the container and node", err)
	}
	q, err := ws.QuarantineMarker()
	if err != nil || q == nil || q.Container != m.Container || q.Call != m.Call || q.Reason == "" || q.ScopeHash != mainScope.Hash() {
		t.Fatalf("QuarantineMarker = %+v, %v", q, err)
	}
	if _, err := os.Lstat(filepath.Join(e.root, store.LocksDir, mainScope.Hash(), store.ExecMarker)); !os.IsNotExist(err) {
		t.Errorf("the execution marker is still there after quarantine: %v", err)
	}

	refused := map[string]error{}
	_, refused["WriteFile"] = ws.WriteFile(ctx, "new.txt", []byte("x"), nil)
	_, refused["WriteFile existing"] = ws.WriteFile(ctx, "keep.txt", []byte("x"), nil)
	refused["Remove"] = ws.Remove(ctx, "keep.txt", nil)
	_, refused["Mkdir"] = ws.Mkdir(ctx, "d", false)
	for op, err := range refused {
		codeIs(t, op+" in a quarantined scope", err, policy.Quarantined)
	}
	if b, _, err := ws.ReadFile(ctx, "keep.txt"); err != nil || string(b) != "kept" {
		t.Errorf("ReadFile in a quarantined scope = %q, %v; reads still work", b, err)
	}
	if ents, err := ws.ReadDir(ctx, "."); err != nil || len(ents) != 1 {
		t.Errorf("ReadDir in a quarantined scope = %v, %v", names(ents), err)
	}

	// Another handle (another process, another node) sees it too; the
	// quarantine file lives outside the scope.
	ws2 := e.open(t, mainScope, nil)
	codeIs(t, "CheckQuarantine on another handle", ws2.CheckQuarantine(), policy.Quarantined)
	if ents, _ := ws2.ReadDir(ctx, "."); len(ents) != 1 {
		t.Errorf("quarantine state shows in the scope: %v", names(ents))
	}
	// Other scopes are untouched.
	child := e.open(t, childScope, nil)
	if err := child.CheckQuarantine(); err != nil {
		t.Errorf("another scope is quarantined too: %v", err)
	}
}

func TestClearedMarkerDoesNotQuarantine(t *testing.T) {
	e := newEnv(t)
	ws := e.open(t, mainScope, nil)
	ctx := context.Background()
	unlock, err := ws.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ws.SetMarker(store.Marker{Container: "c", Time: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := ws.ClearMarker(); err != nil {
		t.Fatal(err)
	}
	unlock()
	unlock, err = ws.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	unlock()
	if err := ws.CheckQuarantine(); err != nil {
		t.Fatalf("a cleared marker quarantined the scope: %v", err)
	}
	if _, err := ws.WriteFile(ctx, "a", []byte("x"), nil); err != nil {
		t.Fatal(err)
	}
}

func TestUnreadableMarkerQuarantines(t *testing.T) {
	e := newEnv(t)
	ws := e.open(t, mainScope, nil)
	mkfile(t, filepath.Join(e.root, store.LocksDir, mainScope.Hash(), store.ExecMarker), "{torn")
	unlock, err := ws.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	unlock()
	codeIs(t, "CheckQuarantine after an unreadable marker", ws.CheckQuarantine(), policy.Quarantined)
}
