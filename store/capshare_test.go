package store_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// sharedCapPolicy caps tmp/ at 10 KiB and 100 entries, under a scope
// quota of scopeBytes (0: the default).
func sharedCapPolicy(t *testing.T, scopeBytes int64) *policy.Policy {
	t.Helper()
	p := policy.Default()
	if scopeBytes > 0 {
		p.Limits.ScopeBytes = scopeBytes
	}
	if err := p.SetSubtrees([]policy.Subtree{{Prefix: "tmp", MaxBytes: 10 << 10, MaxFiles: 100}}); err != nil {
		t.Fatal(err)
	}
	return p
}

// openOwn opens scope sc with pol through a volume of its own, as another
// process (or node) would: nothing is shared with e's handles but the
// files.
func (e *testEnv) openOwn(t *testing.T, sc store.Scope, pol *policy.Policy) *store.Workspace {
	t.Helper()
	ws := e.openAnewWith(t, sc, pol)
	// Made on disk, so that no process holds a grant of tmp/'s account
	// before its first write there.
	for _, d := range []string{"src", "tmp"} {
		if err := os.MkdirAll(filepath.Join(e.dir(sc), d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return ws
}

// tmpBytes is what tmp/ holds on disk.
func tmpBytes(t *testing.T, e *testEnv) int64 {
	t.Helper()
	var n int64
	err := filepath.Walk(filepath.Join(e.dir(mainScope), "tmp"), func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCapSharedAcrossProcesses: two processes writing into a capped
// subtree together hold at most its cap, and a refusal names the cap and
// the figures as both count them.
func TestCapSharedAcrossProcesses(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	pol := sharedCapPolicy(t, 0)
	wss := []*store.Workspace{e.openOwn(t, mainScope, pol), e.openOwn(t, mainScope, pol)}
	piece := make([]byte, 1<<10)
	refused := make([]error, len(wss))
	wrote := make([]int, len(wss))
	for i := 0; refused[0] == nil || refused[1] == nil; i++ {
		for j, ws := range wss {
			if refused[j] != nil {
				continue
			}
			_, err := ws.WriteFile(ctx, fmt.Sprintf("tmp/%d-%d", j, i), piece, nil)
			switch {
			case err == nil:
				wrote[j]++
			case policy.CodeOf(err) == policy.QuotaExceeded:
				refused[j] = err
			default:
				t.Fatal(err)
			}
		}
		if i > 100 {
			t.Fatalf("no refusal after %d pieces each (%v)", i, wrote)
		}
	}
	if got := tmpBytes(t, e); got > 10<<10 {
		t.Fatalf("tmp/ holds %d bytes written by two processes (%v pieces); the cap is %d", got, wrote, 10<<10)
	}
	if wrote[0] == 0 || wrote[1] == 0 {
		t.Errorf("one process was refused from the start: %v", wrote)
	}
	for _, err := range refused {
		if msg := err.Error(); !strings.HasPrefix(msg, "quota exceeded: tmp/ total 10 KiB (used ") || !strings.Contains(msg, "write of 1 KiB refused") {
			t.Errorf("refusal %q does not name the cap and the figures", msg)
		}
	}
	// Both count what is there.
	want := policy.Usage{Bytes: tmpBytes(t, e), Files: int64(1 + wrote[0] + wrote[1])}
	for i, ws := range wss {
		if u, err := ws.SubtreeUsage(ctx, "tmp"); err != nil || u != want {
			t.Errorf("process %d counts tmp/ as %+v, %v; want %+v", i, u, err, want)
		}
	}
}

// TestCapRefusalGivesBack: a ReserveAt that passes a cap but fails the
// scope quota, or a deeper cap, leaves the cap's account as it was, for
// this process and the others.
func TestCapRefusalGivesBack(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	pol := sharedCapPolicy(t, 6<<10)
	if err := pol.SetSubtrees(append(pol.Subtrees, policy.Subtree{Prefix: "tmp/inner", MaxBytes: 2 << 10})); err != nil {
		t.Fatal(err)
	}
	a, b := e.openOwn(t, mainScope, pol), e.openOwn(t, mainScope, pol)
	if _, err := a.Mkdir(ctx, "tmp/inner", true); err != nil {
		t.Fatal(err)
	}
	if _, err := a.WriteFile(ctx, "src/big", make([]byte, 4<<10), nil); err != nil {
		t.Fatal(err)
	}
	before, err := b.SubtreeUsage(ctx, "tmp")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, rel string
		bytes     int64
		says      string
	}{
		{"the scope quota refuses", "tmp/x", 3 << 10, "workspace total"},
		{"a deeper cap refuses", "tmp/inner/x", 3 << 10, "tmp/inner/ total"},
	}
	for _, c := range cases {
		err := a.ReserveAt(context.Background(), c.rel, c.bytes, 1)
		if policy.CodeOf(err) != policy.QuotaExceeded || !strings.Contains(err.Error(), c.says) {
			t.Fatalf("%s: ReserveAt(%s) = %v", c.name, c.rel, err)
		}
		for name, ws := range map[string]*store.Workspace{"the refused process": a, "another": b} {
			if u, err := ws.SubtreeUsage(ctx, "tmp"); err != nil || u != before {
				t.Errorf("%s: %s counts tmp/ as %+v, %v; want %+v as before", c.name, name, u, err, before)
			}
		}
	}
}

// TestCapMoveOutFreesRoom: moving a file out of a full capped subtree
// frees room for another process.
func TestCapMoveOutFreesRoom(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	pol := sharedCapPolicy(t, 0)
	a, b := e.openOwn(t, mainScope, pol), e.openOwn(t, mainScope, pol)
	if _, err := a.WriteFile(ctx, "tmp/full", make([]byte, 10<<10-100), nil); err != nil {
		t.Fatal(err)
	}
	_, err := b.WriteFile(ctx, "tmp/more", make([]byte, 1<<10), nil)
	codeIs(t, "another process writing into a full tmp/", err, policy.QuotaExceeded)

	// A rename as a door makes it: checked and counted, then done.
	if err := a.ReserveMove(context.Background(), "tmp/full", "src/full", 10<<10-100, 1); err != nil {
		t.Fatal(err)
	}
	dir := e.dir(mainScope)
	if err := os.Rename(filepath.Join(dir, "tmp/full"), filepath.Join(dir, "src/full")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.WriteFile(ctx, "tmp/more", make([]byte, 8<<10), nil); err != nil {
		t.Fatalf("after the move out of tmp/: %v", err)
	}
	// And moving it back is checked against what the other wrote.
	err = a.ReserveMove(context.Background(), "src/full", "tmp/full", 10<<10-100, 1)
	codeIs(t, "moving the file back into tmp/", err, policy.QuotaExceeded)
}

// TestCapRecountAfterClear: a subtree cleared by another process (loomfs
// gc) is counted again in the shared account, so it takes writes again.
func TestCapRecountAfterClear(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	pol := sharedCapPolicy(t, 0)
	a := e.openOwn(t, mainScope, pol)
	if _, err := a.WriteFile(ctx, "tmp/full", make([]byte, 10<<10), nil); err != nil {
		t.Fatal(err)
	}
	gc := e.openOwn(t, mainScope, pol)
	if _, err := gc.Unfiltered().ClearDir(ctx, "tmp"); err != nil {
		t.Fatal(err)
	}
	gc.RefreshUsage(context.Background())
	if u, err := a.SubtreeUsage(ctx, "tmp"); err != nil || u != (policy.Usage{Files: 1}) {
		t.Fatalf("after the clear, tmp/ is counted as %+v, %v", u, err)
	}
	if _, err := a.WriteFile(ctx, "tmp/again", make([]byte, 10<<10), nil); err != nil {
		t.Fatalf("writing into the cleared tmp/: %v", err)
	}
}

// TestCapPlatformViewShares: what the platform's view (stage) places in a
// capped subtree is counted in the workspace's account at once.
func TestCapPlatformViewShares(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	ws := e.openOwn(t, mainScope, sharedCapPolicy(t, 0))
	unlock, err := ws.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = ws.Platform().PlaceFile(ctx, "tmp/staged", strings.NewReader(strings.Repeat("s", 9<<10)), 9<<10, 0o600)
	unlock()
	if err != nil {
		t.Fatal(err)
	}
	if u, err := ws.SubtreeUsage(ctx, "tmp"); err != nil || u != (policy.Usage{Bytes: 9 << 10, Files: 2}) {
		t.Fatalf("tmp/ after the platform placed 9 KiB: %+v, %v", u, err)
	}
	_, err = ws.WriteFile(ctx, "tmp/more", make([]byte, 2<<10), nil)
	codeIs(t, "writing past what the platform placed", err, policy.QuotaExceeded)
}

// TestCapConcurrentWriters: writers in two processes at once, several in
// each, hold a capped subtree within its cap together, and both count
// what they left.
func TestCapConcurrentWriters(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	pol := sharedCapPolicy(t, 0)
	wss := []*store.Workspace{e.openOwn(t, mainScope, pol), e.openOwn(t, mainScope, pol)}
	var wg sync.WaitGroup
	var mu sync.Mutex
	files := int64(1) // tmp/ itself
	for i, ws := range wss {
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := 0; ; k++ {
					_, err := ws.WriteFile(ctx, fmt.Sprintf("tmp/%d-%d-%d", i, g, k), make([]byte, 512), nil)
					if policy.CodeOf(err) == policy.QuotaExceeded {
						return
					}
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					files++
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	held := tmpBytes(t, e)
	if held > 10<<10 {
		t.Fatalf("tmp/ holds %d bytes written by two processes at once; the cap is %d", held, 10<<10)
	}
	for i, ws := range wss {
		if u, err := ws.SubtreeUsage(ctx, "tmp"); err != nil || u != (policy.Usage{Bytes: held, Files: files}) {
			t.Errorf("process %d counts tmp/ as %+v, %v; it holds %d bytes in %d entries", i, u, err, held, files)
		}
	}
}
