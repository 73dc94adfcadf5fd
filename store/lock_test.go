package store_test

import (
	"context"
	"fmt"
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

// TestStateLookKept: once the state directory has been quiet, a lock
// holder that finds it unchanged skips its lookups (statelook.go), and
// whatever another handle puts there afterwards is still found by the next
// holder: a dead command's or session's marker, the quarantine flag set
// without the lock. The other handle is another process's on this disk
// and, with LOOMFS_DFS_ROOTS=A,B (CI: two ceph-fuse clients), another
// node's through the other client.
func TestStateLookKept(t *testing.T) {
	const quiet = 500 * time.Millisecond
	store.QuietAfter(t, quiet)
	ctx := context.Background()
	plants := []struct {
		name  string
		plant func(t *testing.T, other *store.Workspace)
	}{
		{"a dead command's marker", func(t *testing.T, other *store.Workspace) {
			unlock, err := other.Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer unlock() // the command's worker dies holding its marker
			if err := other.SetMarker(store.Marker{Container: "loomfs-cmd-dead", Node: "node-b", Time: time.Now()}); err != nil {
				t.Fatal(err)
			}
		}},
		{"a dead session's marker", func(t *testing.T, other *store.Workspace) {
			if err := other.SetSessionMarker(store.Marker{Container: "loomfs-session-dead", Node: "node-b", Time: time.Now()}); err != nil {
				t.Fatal(err)
			}
		}},
		{"the quarantine flag, set without the lock", func(t *testing.T, other *store.Workspace) {
			if err := other.Quarantine(store.Marker{Container: "loomfs-session-failed", Node: "node-b", Time: time.Now()}, "cleanup unconfirmed"); err != nil {
				t.Fatal(err)
			}
		}},
	}
	volumes := []struct {
		name string
		open func(t *testing.T) (ws, other *store.Workspace)
	}{
		{"one disk", func(t *testing.T) (ws, other *store.Workspace) {
			e := newEnv(t)
			return e.open(t, mainScope, nil), e.openAnew(t, mainScope)
		}},
	}
	if roots := os.Getenv("LOOMFS_DFS_ROOTS"); roots != "" {
		a, b, _ := strings.Cut(roots, ",")
		volumes = append(volumes, struct {
			name string
			open func(t *testing.T) (ws, other *store.Workspace)
		}{"two clients (LOOMFS_DFS_ROOTS)", func(t *testing.T) (ws, other *store.Workspace) {
			return openShared(t, b, a)
		}})
	}
	for _, v := range volumes {
		for _, tc := range plants {
			t.Run(v.name+"/"+tc.name, func(t *testing.T) {
				began := time.Now() // the state directory changes after this
				ws, other := v.open(t)
				write := func() error {
					unlock, err := ws.Lock(ctx)
					if err != nil {
						return err
					}
					defer unlock()
					_, err = ws.WriteFile(ctx, "f.txt", []byte("x"), nil)
					return err
				}
				for range 2 { // the second through the lock file the first kept
					if err := write(); err != nil {
						t.Fatal(err)
					}
				}
				// Only a change less than quiet before the look is one
				// made just now: on a loaded node the open and two writes
				// can take longer (CI's, on CephFS).
				switch took := time.Since(began); {
				case took >= quiet:
					t.Logf("the open and two writes took %v, over the %v that makes a change recent: not asked", took, quiet)
				case store.LookKept(ws):
					t.Fatal("a look at a state directory changed just now was kept")
				}
				time.Sleep(2 * quiet)
				if err := write(); err != nil {
					t.Fatal(err)
				}
				if !store.LookKept(ws) {
					t.Fatal("a look at a quiet state directory was not kept")
				}
				tc.plant(t, other)
				codeIs(t, "a write after "+tc.name, write(), policy.Quarantined)
				if store.LookKept(ws) {
					t.Error("a look that found the scope quarantined was kept")
				}
			})
		}
	}
}

// openShared makes a shared volume of its own in the shared root seen at
// path a (and b) and opens mainScope on it through each: two nodes.
func openShared(t *testing.T, a, b string) (wsA, wsB *store.Workspace) {
	t.Helper()
	name := fmt.Sprintf("store-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	id := "vol-" + name
	if err := os.Mkdir(filepath.Join(a, name), 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(filepath.Join(a, name)) })
	if err := os.WriteFile(filepath.Join(a, name, store.VolumeMarker), []byte(id+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var ws []*store.Workspace
	for _, root := range []string{a, b} {
		vol, err := store.OpenVolume(context.Background(), store.Config{Backend: store.BackendSharedPOSIX, Root: filepath.Join(root, name), VolumeID: id})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { vol.Close() })
		w, err := vol.Open(context.Background(), mainScope, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { w.Close() })
		ws = append(ws, w)
	}
	return ws[0], ws[1]
}

// TestIdleLockFileReplaced: a Workspace keeps its lock file open between
// Locks; when that file is removed and another made in its place (the state
// directory cleared and made anew), the next Lock takes the new one, so it
// still excludes a holder of the new file.
func TestIdleLockFileReplaced(t *testing.T) {
	store.QuietAfter(t, 20*time.Millisecond)
	e := newEnv(t)
	ws := e.open(t, mainScope, nil)
	ctx := context.Background()
	for range 2 { // the second look is kept: the directory was quiet
		unlock, err := ws.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		unlock()
		time.Sleep(40 * time.Millisecond)
	}
	if !store.LookKept(ws) {
		t.Fatal("no look kept")
	}
	if err := os.Remove(filepath.Join(e.root, store.LocksDir, mainScope.Hash(), store.LockFile)); err != nil {
		t.Fatal(err)
	}
	other := e.openAnew(t, mainScope)
	unlockOther, err := other.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if unlock, err := ws.Lock(short); err == nil {
		unlock()
		t.Fatal("Lock through the removed lock file succeeded while another handle holds the new one")
	}
	unlockOther()
	unlock, err := ws.Lock(ctx)
	if err != nil {
		t.Fatalf("Lock once the new file is free: %v", err)
	}
	unlock()
}
