package fork_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/fork"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// walkTree fills main with 40 directories two and three deep, 5 files
// each, and returns the workspace.
func walkTree(t *testing.T) (*volume, *store.Workspace) {
	t.Helper()
	v := newVolume(t, t.TempDir())
	main := v.open(t, mainScope, nil)
	for d := range 40 {
		dir := fmt.Sprintf("src/p%d/d%02d", d%4, d)
		if d%3 == 0 {
			dir += "/deeper"
		}
		if err := os.MkdirAll(v.path(mainScope, dir), 0o700); err != nil {
			t.Fatal(err)
		}
		for f := range 5 {
			if err := os.WriteFile(v.path(mainScope, fmt.Sprintf("%s/f%d.go", dir, f)), []byte("package p\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	return v, main
}

// collect walks view with walk and returns every path it was given.
func collect(t *testing.T, walk func(store.WalkFunc) error, fn store.WalkFunc) ([]string, error) {
	t.Helper()
	var mu sync.Mutex
	var got []string
	err := walk(func(rel string, info store.Info) error {
		mu.Lock()
		got = append(got, rel)
		mu.Unlock()
		if fn != nil {
			return fn(rel, info)
		}
		return nil
	})
	slices.Sort(got)
	return got, err
}

// TestWalkParallel: the merge's walk on several goroutines visits what a
// walk on one does, whatever the number of walkers; a directory removed
// after its listing named it is passed over; an error of fn is the walk's,
// even one that looks like a removal.
func TestWalkParallel(t *testing.T) {
	v, main := walkTree(t)
	view := main.Unfiltered()
	ctx := context.Background()
	want, err := collect(t, func(fn store.WalkFunc) error { return view.Walk(ctx, ".", fn) }, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{1, 2, 8, 64} {
		got, err := collect(t, func(fn store.WalkFunc) error { return fork.WalkParallel(ctx, view, n, fn) }, nil)
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("%d walkers: %d paths, %v; a walk on one goroutine has %d", n, len(got), err, len(want))
		}
	}

	t.Run("a directory removed meanwhile is passed over", func(t *testing.T) {
		got, err := collect(t, func(fn store.WalkFunc) error { return fork.WalkParallel(ctx, view, 8, fn) }, func(rel string, info store.Info) error {
			if rel == "src/p1/d05" {
				return os.RemoveAll(v.path(mainScope, rel))
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(got, "src/p1/d05/f0.go") || !slices.Contains(got, "src/p1/d01/f0.go") {
			t.Fatalf("walked %v: want src/p1/d05 passed over and the rest walked", got)
		}
	})

	t.Run("an error of fn stops the walk", func(t *testing.T) {
		mine := policy.FromErrno(unix.ENOENT, "look", "src/p2/d06/deeper/f3.go")
		_, err := collect(t, func(fn store.WalkFunc) error { return fork.WalkParallel(ctx, view, 8, fn) }, func(rel string, info store.Info) error {
			if rel == "src/p2/d06/deeper/f3.go" {
				return mine
			}
			return nil
		})
		if !errors.Is(err, mine) {
			t.Fatalf("err %v, want fn's", err)
		}
	})

	t.Run("a cancelled walk says so", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		_, err := collect(t, func(fn store.WalkFunc) error { return fork.WalkParallel(cctx, view, 8, fn) }, nil)
		if policy.CodeOf(err) != policy.Cancelled {
			t.Fatalf("err %v, want cancelled", err)
		}
	})
}
