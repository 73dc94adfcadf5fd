package store_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// walkFewFDs is the helper role walk-few-fds: it lowers the process's
// descriptor limit to n more than it has open now, walks the
// scope and prints how many entries it saw and what the walk returned.
func walkFewFDs(ctx context.Context, ws *store.Workspace, n int) {
	fds, _ := os.ReadDir("/proc/self/fd")
	lim := uint64(len(fds) + n)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: lim, Max: lim}); err != nil {
		fmt.Println("setrlimit:", err)
		return
	}
	seen := 0
	err := ws.Walk(ctx, ".", func(string, store.Info) error { seen++; return nil })
	fmt.Printf("seen %d\ncode %s\nerror %v\n", seen, policy.CodeOf(err), err)
}

// A walk that can't open a directory for a fault of the storage (here
// its process is out of descriptors) fails, naming the directory; it
// used to pass over it as if removed, and hand a snapshot, a quota count
// or a search a tree with the directory missing. A directory removed or
// replaced meanwhile is still passed over (TestWalkPassesOverRemoved).
func TestWalkFailsOnStorageFault(t *testing.T) {
	e := newEnv(t)
	sc := store.Scope{Space: "acme", Agent: "coder", Session: "walkfault"}
	ws := e.open(t, sc, nil)
	ctx := context.Background()
	// 40 directories deep, a file in each: a walk holds a descriptor per
	// level.
	dir := "."
	for i := range 40 {
		dir = filepath.Join(dir, fmt.Sprintf("d%02d", i))
		if _, err := ws.Mkdir(ctx, dir, false); err != nil {
			t.Fatal(err)
		}
		if _, err := ws.WriteFile(ctx, filepath.Join(dir, "f"), []byte("x"), nil); err != nil {
			t.Fatal(err)
		}
	}
	out, err := helper(t, "walk-few-fds", e.root, sc, helperN+"=8").CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	got := string(out)
	if strings.Contains(got, "error <nil>") || strings.Contains(got, "seen 80\n") {
		t.Fatalf("a walk out of descriptors halfway down a 40-level tree:\n%s\nwant an error, not a tree cut short", got)
	}
	if !strings.Contains(got, "list d00/d01/") || strings.Contains(got, e.root) {
		t.Errorf("the walk's error:\n%s\nwant it to name the directory by its path in the scope, and no host path", got)
	}
}

// A directory removed between its listing and its open is passed over:
// it is gone, not unread.
func TestWalkPassesOverRemoved(t *testing.T) {
	e := newEnv(t)
	ws := e.open(t, store.Scope{Space: "acme", Agent: "coder", Session: "walkgone"}, nil)
	ctx := context.Background()
	for _, d := range []string{"a", "b", "c"} {
		if _, err := ws.Mkdir(ctx, d+"/sub", true); err != nil {
			t.Fatal(err)
		}
	}
	var seen []string
	err := ws.Walk(ctx, ".", func(rel string, info store.Info) error {
		seen = append(seen, rel)
		if rel == "b" {
			// Removed after the listing named it, before the walk opens it.
			if err := ws.Remove(ctx, "b/sub", nil); err != nil {
				return err
			}
			return ws.Remove(ctx, "b", nil)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk with a directory removed meanwhile: %v", err)
	}
	if want := "a a/sub b c c/sub"; strings.Join(seen, " ") != want {
		t.Errorf("walked %q, want %q", strings.Join(seen, " "), want)
	}
}
