package store_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// TestUsageQuota: the scope's bytes and file count are checked before a
// change, with the figures in the message (SPEC §3.3).
func TestUsageQuota(t *testing.T) {
	e := newEnv(t)
	pol := policy.Default()
	pol.Limits.ScopeBytes = 1000
	pol.Limits.ScopeFiles = 5
	ws := e.open(t, mainScope, pol)
	ctx := context.Background()
	usage := func(want policy.Usage) {
		t.Helper()
		got, err := ws.Usage(ctx)
		if err != nil || got != want {
			t.Fatalf("Usage = %+v, %v; want %+v", got, err, want)
		}
	}

	usage(policy.Usage{})
	if _, err := ws.WriteFile(ctx, "a", make([]byte, 600), nil); err != nil {
		t.Fatal(err)
	}
	usage(policy.Usage{Bytes: 600, Files: 1})

	_, err := ws.WriteFile(ctx, "b", make([]byte, 500), nil)
	codeIs(t, "write over the workspace total", err, policy.QuotaExceeded)
	if err != nil && err.Error() != "quota exceeded: workspace total 1000 B (used 600 B, write of 500 B refused)" {
		t.Errorf("quota message %q", err)
	}
	if _, err := ws.Lstat("b"); policy.CodeOf(err) != policy.NotFound {
		t.Errorf("a refused write created its file: %v", err)
	}
	usage(policy.Usage{Bytes: 600, Files: 1})

	// Replacing counts only the difference.
	if _, err := ws.WriteFile(ctx, "a", make([]byte, 1000), nil); err != nil {
		t.Fatalf("growing a to exactly the limit: %v", err)
	}
	usage(policy.Usage{Bytes: 1000, Files: 1})
	_, err = ws.WriteFile(ctx, "a", make([]byte, 1001), nil)
	codeIs(t, "growing a past the limit", err, policy.QuotaExceeded)
	// Shrinking always passes, so a full scope can be cleaned up.
	if _, err := ws.WriteFile(ctx, "a", make([]byte, 10), nil); err != nil {
		t.Fatal(err)
	}
	usage(policy.Usage{Bytes: 10, Files: 1})

	// The file count: directories count too.
	for _, d := range []string{"d1", "d2", "d3"} {
		if _, err := ws.Mkdir(ctx, d, false); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ws.WriteFile(ctx, "d1/f", []byte("x"), nil); err != nil {
		t.Fatal(err)
	}
	usage(policy.Usage{Bytes: 11, Files: 5})
	_, err = ws.Mkdir(ctx, "d4", false)
	codeIs(t, "mkdir over the file count", err, policy.QuotaExceeded)
	_, err = ws.WriteFile(ctx, "g", []byte("x"), nil)
	codeIs(t, "create over the file count", err, policy.QuotaExceeded)
	if err != nil && err.Error() != "quota exceeded: workspace file count 5 (used 5, 1 new refused)" {
		t.Errorf("file count message %q", err)
	}
	if err := ws.Remove(ctx, "d1/f", nil); err != nil {
		t.Fatal(err)
	}
	if err := ws.Remove(ctx, "d3", nil); err != nil {
		t.Fatal(err)
	}
	usage(policy.Usage{Bytes: 10, Files: 3})

	// Refused and cancelled writes give their reservation back.
	_, err = ws.WriteFile(ctx, "a", []byte("x"), ptr(strings.Repeat("0", 64)))
	codeIs(t, "stale write", err, policy.Conflict)
	c, cancel := context.WithCancel(ctx)
	cancel()
	_, err = ws.WriteFile(c, "new", make([]byte, 100), nil)
	codeIs(t, "cancelled write", err, policy.Cancelled)
	usage(policy.Usage{Bytes: 10, Files: 3})
}

func TestReserveAdjust(t *testing.T) {
	e := newEnv(t)
	pol := policy.Default()
	pol.Limits.ScopeBytes = 100
	pol.Limits.ScopeFiles = 3
	ws := e.open(t, childScope, pol)
	s := e.dir(childScope)
	ctx := context.Background()

	// Files someone else put there count, once the usage is computed;
	// loomfs's own names do not.
	mkfile(t, filepath.Join(s, "planted"), strings.Repeat("p", 40))
	mkfile(t, filepath.Join(s, policy.InternalPrefix+"tmp-leftover"), strings.Repeat("t", 90))
	got, err := ws.Usage(ctx)
	if err != nil || got != (policy.Usage{Bytes: 40, Files: 1}) {
		t.Fatalf("Usage = %+v, %v; want 40 bytes in 1 file", got, err)
	}
	if err := ws.Reserve(context.Background(), 60, 1); err != nil {
		t.Fatalf("Reserve up to the limit: %v", err)
	}
	codeIs(t, "Reserve one byte over", ws.Reserve(context.Background(), 1, 0), policy.QuotaExceeded)
	codeIs(t, "Reserve one file over", ws.Reserve(context.Background(), 0, 2), policy.QuotaExceeded)
	if err := ws.Reserve(context.Background(), -50, -1); err != nil {
		t.Fatalf("a shrinking Reserve: %v", err)
	}
	ws.Adjust(-10, 0)
	if got, _ := ws.Usage(ctx); got != (policy.Usage{Bytes: 40, Files: 1}) {
		t.Fatalf("after Reserve and Adjust, Usage = %+v", got)
	}

	// A change made outside this process shows after RefreshUsage.
	mkfile(t, filepath.Join(s, "d", "x"), strings.Repeat("x", 5))
	if got, _ := ws.Usage(ctx); got.Files != 1 {
		t.Fatalf("Usage walked again without RefreshUsage: %+v", got)
	}
	ws.RefreshUsage(context.Background())
	if got, _ := ws.Usage(ctx); got != (policy.Usage{Bytes: 45, Files: 3}) {
		t.Fatalf("after RefreshUsage, Usage = %+v; want 45 bytes in 3 entries", got)
	}
	codeIs(t, "Reserve a file over after the refresh", ws.Reserve(context.Background(), 0, 1), policy.QuotaExceeded)
}

// TestHashFile covers the sha256 workspace_stat reports.
func TestHashFile(t *testing.T) {
	e := newEnv(t)
	pol := policy.Default()
	pol.Limits.TextBytes = 10
	ws := e.open(t, mainScope, pol)
	s := e.dir(mainScope)
	mkfile(t, filepath.Join(s, "small"), "0123456789")
	mkfile(t, filepath.Join(s, "big"), "0123456789a")
	mkdir(t, filepath.Join(s, "dir"))
	tests := []struct {
		rel  string
		want string
	}{
		{"small", sha([]byte("0123456789"))},
		{"big", ""}, // over the text limit: no hash
		{"dir", ""},
	}
	for _, tc := range tests {
		got, err := ws.HashFile(tc.rel)
		if err != nil || got != tc.want {
			t.Errorf("HashFile(%s) = %q, %v; want %q", tc.rel, got, err, tc.want)
		}
	}
	_, err := ws.HashFile("missing")
	codeIs(t, "HashFile(missing)", err, policy.NotFound)
}

// TestReplaceTreeCounted: a tree swapped in with the list of what it holds
// leaves the scope's account where a walk of the new tree counts it, under
// the policy of whichever view counts for the account (hidden subtrees,
// a listed path below a hidden one, loomfs's own names), with what this
// process holds open added; a capped subtree's account is walked, and
// the old tree's content is gone from both.
func TestReplaceTreeCounted(t *testing.T) {
	tree := []store.TreeEntry{
		{Path: "a", Size: 7},
		{Path: "secret", Dir: true},
		{Path: "secret/k", Size: 11},
		{Path: "secret/open", Dir: true},
		{Path: "secret/open/x", Size: 13},
		{Path: "src", Dir: true},
		{Path: "src/" + policy.InternalPrefix + "own", Size: 17},
		{Path: "src/" + policy.InternalPrefix + "d", Dir: true},
		{Path: "src/" + policy.InternalPrefix + "d/in", Size: 19},
		{Path: "src/m.go", Size: 23},
		{Path: "src/empty"},
		{Path: "tmp", Dir: true},
		{Path: "tmp/t", Size: 29},
	}
	cases := []struct {
		name       string
		unfiltered bool // the account is first counted through Unfiltered
		counted    bool // ReplaceTreeCounted, not ReplaceTree
	}{
		{"counted from the list, the scope's view", false, true},
		{"counted from the list, the unfiltered view", true, true},
		{"walked, the scope's view", false, false},
		{"walked, the unfiltered view", true, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			pol := capPolicy(t)
			if err := pol.SetRules([]policy.Rule{{Prefix: "secret", Mode: policy.ModeHidden}, {Prefix: "secret/open", Mode: policy.ModeRW}}); err != nil {
				t.Fatal(err)
			}
			ws := e.open(t, mainScope, pol)
			ctx := context.Background()
			view := ws
			if c.unfiltered {
				view = ws.Unfiltered()
			}
			// The old tree, counted, with a file in the capped subtree.
			mkfile(t, filepath.Join(e.dir(mainScope), "old/f"), strings.Repeat("o", 100))
			mkfile(t, filepath.Join(e.dir(mainScope), "tmp/old"), strings.Repeat("o", 50))
			if _, err := view.Usage(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := ws.SubtreeUsage(ctx, "tmp"); err != nil {
				t.Fatal(err)
			}
			remove := ws.CountHeld(func(under string) policy.Usage {
				if under == "." {
					return policy.Usage{Bytes: 1000, Files: 1}
				}
				return policy.Usage{}
			})
			defer remove()
			fill := func(dir *os.File) ([]store.TreeEntry, error) {
				// The tree is built beside the scope directory.
				for _, te := range tree {
					p := filepath.Join(filepath.Dir(e.dir(mainScope)), dir.Name(), te.Path)
					if te.Dir {
						mkdir(t, p)
					} else {
						mkfile(t, p, strings.Repeat("c", int(te.Size)))
					}
				}
				return tree, nil
			}
			unlock, err := ws.Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if c.counted {
				err = ws.ReplaceTreeCounted(ctx, fill)
			} else {
				err = ws.ReplaceTree(ctx, func(dir *os.File) error { _, err := fill(dir); return err })
			}
			unlock()
			if err != nil {
				t.Fatal(err)
			}
			got, err := view.Usage(ctx)
			if err != nil {
				t.Fatal(err)
			}
			walked, err := view.CountUsage(ctx)
			if err != nil {
				t.Fatal(err)
			}
			// The walk: a, src, src/m.go, src/empty, tmp, tmp/t, and
			// secret with what it holds through the unfiltered view.
			want := policy.Usage{Bytes: 1000 + 7 + 23 + 29, Files: 1 + 6}
			if c.unfiltered {
				want = policy.Usage{Bytes: want.Bytes + 11 + 13, Files: want.Files + 4}
			}
			if got != walked || got != want {
				t.Fatalf("Usage %+v, a walk %+v, want %+v", got, walked, want)
			}
			capGot, err := ws.SubtreeUsage(ctx, "tmp")
			if err != nil {
				t.Fatal(err)
			}
			if capWalked, _ := ws.CountSubtree(ctx, "tmp"); capGot != capWalked || capGot != (policy.Usage{Bytes: 29, Files: 2}) {
				t.Fatalf("tmp/ usage %+v, a walk %+v, want 29 bytes in 2", capGot, capWalked)
			}
		})
	}
}
