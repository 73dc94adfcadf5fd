package fork_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agentloom/loomfs/fork"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/snapshot"
	"github.com/agentloom/loomfs/store"
)

var (
	mainScope = store.Scope{Space: "sp", Agent: "ag", Session: "se"}
	childA    = store.Scope{Space: "sp", Agent: "ag", Session: "se", Run: "r1", Instance: "a"}
	childB    = store.Scope{Space: "sp", Agent: "ag", Session: "se", Run: "r1", Instance: "b"}
)

// volume is a fresh local volume.
type volume struct {
	root string
	vol  *store.Volume
}

func newVolume(t testing.TB, root string) *volume {
	t.Helper()
	vol, err := store.OpenVolume(context.Background(), store.Config{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vol.Close() })
	return &volume{root: root, vol: vol}
}

// open opens sc under pol (the standard preset when nil).
func (v *volume) open(t testing.TB, sc store.Scope, pol *policy.Policy) *store.Workspace {
	t.Helper()
	if pol == nil {
		pol, _ = policy.Preset("standard")
	}
	ws, err := v.vol.Open(context.Background(), sc, pol.WithScope(sc.Main()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	return ws
}

func (v *volume) path(sc store.Scope, rel string) string {
	return filepath.Join(v.root, sc.Dir(), rel)
}

func write(t testing.TB, ws *store.Workspace, rel, content string) {
	t.Helper()
	if dir, _ := policy.Split(rel); dir != "." {
		if _, err := ws.Platform().Mkdir(context.Background(), dir, true); err != nil && policy.CodeOf(err) != policy.Exists {
			t.Fatalf("mkdir %s: %v", dir, err)
		}
	}
	if _, err := ws.Platform().WriteFile(context.Background(), rel, []byte(content), nil); err != nil {
		t.Fatalf("write %s: %v", rel, err)
	}
}

func remove(t testing.TB, ws *store.Workspace, rel string) {
	t.Helper()
	if err := ws.Platform().Remove(context.Background(), rel, nil); err != nil {
		t.Fatalf("remove %s: %v", rel, err)
	}
}

func read(t testing.TB, v *volume, sc store.Scope, rel string) (string, bool) {
	t.Helper()
	b, err := os.ReadFile(v.path(sc, rel))
	if os.IsNotExist(err) {
		return "", false
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(b), true
}

func sum(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// seed fills main with a few files, a hidden one among them.
func seed(t testing.TB, ws *store.Workspace) map[string]string {
	files := map[string]string{
		"src/a.go":        "package a\n",
		"src/b.go":        "package b\n\nfunc B() {}\n",
		"src/sub/c.go":    "package sub\n",
		"logs/run.log":    "started\n",
		"output/out.txt":  "result\n",
		".meta/task.json": `{"task":1}`,
	}
	for rel, c := range files {
		write(t, ws, rel, c)
	}
	return files
}

func TestFork(t *testing.T) {
	v := newVolume(t, t.TempDir())
	src := v.open(t, mainScope, nil)
	files := seed(t, src)
	// An executable stays one (SPEC §2.1 keeps the owner's execute bit).
	write(t, src, "bin/run.sh", "#!/bin/sh\n")
	files["bin/run.sh"] = "#!/bin/sh\n"
	if err := os.Chmod(v.path(mainScope, "bin/run.sh"), 0o700); err != nil {
		t.Fatal(err)
	}
	dst := v.open(t, childA, nil)
	res, err := fork.Fork(context.Background(), src, dst, fork.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for rel, want := range map[string]os.FileMode{"bin/run.sh": 0o700, "src/a.go": 0o600} {
		if fi, err := os.Stat(v.path(childA, rel)); err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s in the fork: %v, %v; want mode %v", rel, fi.Mode(), err, want)
		}
	}
	if res.Snapshot == "" || res.Files != len(files) {
		t.Fatalf("result %+v, want a snapshot and %d files", res, len(files))
	}
	for rel, c := range files {
		if got, ok := read(t, v, childA, rel); !ok || got != c {
			t.Errorf("%s in the fork: %q (exists %v), want %q", rel, got, ok, c)
		}
	}
	rec, err := fork.ReadRecord(v.vol, childA)
	if err != nil {
		t.Fatal(err)
	}
	if rec.From != mainScope || rec.Snapshot != res.Snapshot || len(rec.Entries) == 0 {
		t.Fatalf("record %+v", rec)
	}
	if forks, err := fork.Forks(v.vol, mainScope); err != nil || len(forks) != 1 || forks[0] != childA {
		t.Fatalf("forks of main: %v, %v; want %s", forks, err, childA)
	}
	// The source is untouched and is no fork.
	if _, err := fork.ReadRecord(v.vol, mainScope); policy.CodeOf(err) != policy.NotFound {
		t.Fatalf("the source's record: %v, want not_found", err)
	}
}

func TestForkRefusals(t *testing.T) {
	rw, _ := policy.Preset("standard")
	rwMeta := *rw
	if err := rwMeta.SetRules([]policy.Rule{{Prefix: "src", Mode: policy.ModeRW}}); err != nil {
		t.Fatal(err)
	}
	small := *rw
	small.Limits.ScopeBytes = 20
	bigFile := *rw
	bigFile.Limits.FileBytes = 8
	capped := *rw
	if err := capped.SetSubtrees([]policy.Subtree{{Prefix: "logs", MaxBytes: 4}}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		dstPol   *policy.Policy
		prepare  func(t *testing.T, dst *store.Workspace)
		code     policy.Code
		inMsg    string
		skipped  []string // paths the fork must leave out
		notThere []string
	}{
		{name: "a destination holding a file is refused", prepare: func(t *testing.T, dst *store.Workspace) { write(t, dst, "notes.txt", "mine") }, code: policy.Exists, inMsg: "notes.txt"},
		{name: "over the destination's quota, refused whole with the figures", dstPol: &small, code: policy.QuotaExceeded, inMsg: "20 B"},
		{name: "a file over the destination's file size, refused whole", dstPol: &bigFile, code: policy.TooLarge},
		{name: "over a capped subtree of the destination, refused whole", dstPol: &capped, code: policy.QuotaExceeded, inMsg: "logs"},
		{name: "hidden and write-only subtrees are not copied where they would be readable", dstPol: &rwMeta, skipped: []string{".meta", "output"}, notThere: []string{".meta/task.json", "output/out.txt"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := newVolume(t, t.TempDir())
			src := v.open(t, mainScope, nil)
			seed(t, src)
			dst := v.open(t, childA, tc.dstPol)
			if tc.prepare != nil {
				tc.prepare(t, dst)
			}
			res, err := fork.Fork(context.Background(), src, dst, fork.Options{})
			if tc.code != "" {
				if policy.CodeOf(err) != tc.code || !strings.Contains(err.Error(), tc.inMsg) {
					t.Fatalf("err %v, want %s naming %q", err, tc.code, tc.inMsg)
				}
				if _, ok := read(t, v, childA, "src/a.go"); ok {
					t.Fatal("a refused fork copied files")
				}
				if _, err := fork.ReadRecord(v.vol, childA); policy.CodeOf(err) != policy.NotFound {
					t.Fatalf("a refused fork left a record: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range tc.skipped {
				if !slices.ContainsFunc(res.Skipped, func(s snapshot.Skipped) bool { return s.Path == p }) {
					t.Errorf("skipped %v, want %s", res.Skipped, p)
				}
			}
			for _, p := range tc.notThere {
				if _, ok := read(t, v, childA, p); ok {
					t.Errorf("%s was copied into the fork", p)
				}
			}
			if got, _ := read(t, v, childA, "src/a.go"); got != "package a\n" {
				t.Errorf("src/a.go in the fork: %q", got)
			}
		})
	}
}
