package fork_test

import (
	"context"
	"os"
	"slices"
	"testing"

	"github.com/agentloom/loomfs/fork"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/snapshot"
	"github.com/agentloom/loomfs/store"
)

// withRules is the open policy with rules, and links as links says ("" emulate).
func withRules(t *testing.T, links policy.Symlinks, rules ...policy.Rule) *policy.Policy {
	t.Helper()
	pol := policy.Default()
	if err := pol.SetRules(rules); err != nil {
		t.Fatal(err)
	}
	if links != "" {
		pol.Symlinks = links
	}
	return pol
}

// TestForkKeepsHiddenAndWriteOnly: a subtree hidden or write-only in the
// source is copied only where the fork's policy keeps it so (or hides
// it), never where the fork's agent could read it (SPEC §3.3, issue 47
// item 4).
func TestForkKeepsHiddenAndWriteOnly(t *testing.T) {
	hidden := policy.Rule{Prefix: "secret", Mode: policy.ModeHidden}
	wo := policy.Rule{Prefix: "secret", Mode: policy.ModeWO}
	tests := []struct {
		name   string
		src    policy.Rule
		dst    []policy.Rule
		copied bool
	}{
		{name: "hidden into hidden: copied, still hidden", src: hidden, dst: []policy.Rule{hidden}, copied: true},
		{name: "hidden into rw: left out", src: hidden, copied: false},
		{name: "hidden into read-only: left out", src: hidden, dst: []policy.Rule{{Prefix: "secret", Mode: policy.ModeRO}}, copied: false},
		{name: "hidden into write-only: left out (its names would show)", src: hidden, dst: []policy.Rule{wo}, copied: false},
		{name: "hidden under a hidden parent of the fork: copied", src: hidden, dst: []policy.Rule{{Prefix: ".", Mode: policy.ModeRW}, {Prefix: "secret", Mode: policy.ModeHidden}}, copied: true},
		{name: "write-only into write-only: copied", src: wo, dst: []policy.Rule{wo}, copied: true},
		{name: "write-only into hidden: copied", src: wo, dst: []policy.Rule{hidden}, copied: true},
		{name: "write-only into rw: left out", src: wo, copied: false},
		{name: "write-only into read-only: left out", src: wo, dst: []policy.Rule{{Prefix: "secret", Mode: policy.ModeRO}}, copied: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := newVolume(t, t.TempDir())
			main := v.open(t, mainScope, policy.Default())
			write(t, main, "secret/key.txt", "the key\n")
			write(t, main, "src/a.go", "package a\n")
			main = v.open(t, mainScope, withRules(t, "", tc.src))
			child := v.open(t, childA, withRules(t, "", tc.dst...))
			res, err := fork.Fork(context.Background(), main, child, fork.Options{})
			if err != nil {
				t.Fatal(err)
			}
			got, ok := read(t, v, childA, "secret/key.txt")
			if ok != tc.copied || (ok && got != "the key\n") {
				t.Fatalf("secret/key.txt in the fork: %q, there %v; want there %v", got, ok, tc.copied)
			}
			left := slices.ContainsFunc(res.Skipped, func(s snapshot.Skipped) bool { return s.Path == "secret" })
			if left == tc.copied {
				t.Errorf("skipped %v: want secret listed %v", res.Skipped, !tc.copied)
			}
			if got, _ := read(t, v, childA, "src/a.go"); got != "package a\n" {
				t.Errorf("src/a.go in the fork: %q", got)
			}
		})
	}
}

// TestMergePolicy: a merge carries into the target only what its policy
// takes: never into a read-only or hidden subtree, links as its symlinks
// setting says, and a new file's owner bits (an executable stays one).
func TestMergePolicy(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name    string
		target  *policy.Policy
		prepare func(t *testing.T, main *store.Workspace) // before the fork
		inFork  func(t *testing.T, v *volume, child *store.Workspace)
		applied []string
		refused []string
		check   func(t *testing.T, v *volume, main *store.Workspace)
	}{
		{
			name:    "never into a hidden subtree of the target",
			target:  withRules(t, "", policy.Rule{Prefix: "secret", Mode: policy.ModeHidden}),
			inFork:  func(t *testing.T, v *volume, child *store.Workspace) { write(t, child, "secret/planted.txt", "x") },
			refused: []string{"secret:not_found", "secret/planted.txt:not_found"},
			check: func(t *testing.T, v *volume, main *store.Workspace) {
				if _, ok := read(t, v, mainScope, "secret/planted.txt"); ok {
					t.Error("the merge wrote into the target's hidden subtree")
				}
			},
		},
		{
			name:    "a link the fork made is made, where the target emulates links",
			inFork:  func(t *testing.T, v *volume, child *store.Workspace) { symlink(t, child, "src/l", "a.go") },
			applied: []string{"src/l:symlink"},
			check:   wantLink("src/l", "a.go"),
		},
		{
			name:    "a link the fork made is refused where the target refuses links",
			target:  withRules(t, policy.SymlinksRefuse),
			inFork:  func(t *testing.T, v *volume, child *store.Workspace) { symlink(t, child, "src/l", "a.go") },
			refused: []string{"src/l:symlink_refused"},
			check:   wantLink("src/l", ""),
		},
		{
			name:    "a link the fork removed is removed",
			prepare: func(t *testing.T, main *store.Workspace) { symlink(t, main, "src/l", "a.go") },
			inFork:  func(t *testing.T, v *volume, child *store.Workspace) { remove(t, child, "src/l") },
			applied: []string{"src/l:delete"},
			check:   wantLink("src/l", ""),
		},
		{
			name:    "a link the fork pointed elsewhere is replaced",
			prepare: func(t *testing.T, main *store.Workspace) { symlink(t, main, "src/l", "a.go") },
			inFork: func(t *testing.T, v *volume, child *store.Workspace) {
				remove(t, child, "src/l")
				symlink(t, child, "src/l", "b.go")
			},
			applied: []string{"src/l:relink"},
			check:   wantLink("src/l", "b.go"),
		},
		{
			name: "a new executable stays one",
			inFork: func(t *testing.T, v *volume, child *store.Workspace) {
				write(t, child, "bin/run.sh", "#!/bin/sh\n")
				chmodFile(t, v, childA, "bin/run.sh", 0o700)
			},
			applied: []string{"bin:mkdir", "bin/run.sh:create"},
			check:   wantMode("bin/run.sh", 0o700),
		},
		{
			name: "a replaced file keeps the target's mode",
			inFork: func(t *testing.T, v *volume, child *store.Workspace) {
				write(t, child, "src/a.go", "package a // fork\n")
				chmodFile(t, v, childA, "src/a.go", 0o700)
			},
			applied: []string{"src/a.go:write"},
			check:   wantMode("src/a.go", 0o600),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := newVolume(t, t.TempDir())
			main := v.open(t, mainScope, policy.Default())
			write(t, main, "src/a.go", "package a\n")
			if tc.prepare != nil {
				tc.prepare(t, main)
			}
			child := v.open(t, childA, policy.Default())
			if _, err := fork.Fork(ctx, main, child, fork.Options{}); err != nil {
				t.Fatal(err)
			}
			tc.inFork(t, v, child)
			if tc.target != nil {
				main = v.open(t, mainScope, tc.target)
			}
			res, err := fork.Merge(ctx, child, main, fork.MergeOptions{Partial: true})
			if err != nil && policy.CodeOf(err) != policy.Conflict {
				t.Fatal(err)
			}
			var refused []string
			for _, r := range res.Refused {
				refused = append(refused, r.Path+":"+r.Code)
			}
			if got := appliedOps(res); !slices.Equal(got, tc.applied) {
				t.Errorf("applied %v, want %v", got, tc.applied)
			}
			if !slices.Equal(refused, tc.refused) {
				t.Errorf("refused %v, want %v", refused, tc.refused)
			}
			tc.check(t, v, main)
		})
	}
}

func symlink(t *testing.T, ws *store.Workspace, rel, target string) {
	t.Helper()
	if _, err := ws.Symlink(context.Background(), rel, target); err != nil {
		t.Fatalf("symlink %s: %v", rel, err)
	}
}

func chmodFile(t *testing.T, v *volume, sc store.Scope, rel string, mode os.FileMode) {
	t.Helper()
	if err := os.Chmod(v.path(sc, rel), mode); err != nil {
		t.Fatal(err)
	}
}

// wantLink checks the target's link at rel points at target ("" none).
func wantLink(rel, target string) func(t *testing.T, v *volume, main *store.Workspace) {
	return func(t *testing.T, v *volume, main *store.Workspace) {
		got, _, err := main.Unfiltered().ReadLink(rel)
		if target == "" {
			if err == nil {
				t.Errorf("%s in the target is a link to %q, want none", rel, got)
			}
			return
		}
		if err != nil || got != target {
			t.Errorf("%s in the target: link to %q, %v; want %q", rel, got, err, target)
		}
	}
}

func wantMode(rel string, mode os.FileMode) func(t *testing.T, v *volume, main *store.Workspace) {
	return func(t *testing.T, v *volume, main *store.Workspace) {
		fi, err := os.Stat(v.path(mainScope, rel))
		if err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s in the target: %v, %v; want mode %v", rel, fi, err, mode)
		}
	}
}
