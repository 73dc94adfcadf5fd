package store_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// TestLayoutAtFirstUse: a scope opened under the standard preset gets its
// six directories, 0700, once; an object already at a layout path is left
// alone, and so is what is beneath it.
func TestLayoutAtFirstUse(t *testing.T) {
	e := newEnv(t)
	std, _ := policy.Preset("standard")
	ws := e.open(t, mainScope, std)
	want := []string{".meta", "data", "logs", "output", "src", "tmp"}
	if got := ws.LayoutMade(); !slices.Equal(got, want) {
		t.Fatalf("made %q, want %q", got, want)
	}
	for _, d := range want {
		st, err := os.Lstat(filepath.Join(e.dir(mainScope), d))
		if err != nil || !st.IsDir() || st.Mode().Perm() != 0o700 {
			t.Errorf("%s: %v %v", d, st.Mode(), err)
		}
	}
	if again := e.open(t, mainScope, std); len(again.LayoutMade()) != 0 {
		t.Errorf("a second open made %q", again.LayoutMade())
	}

	// Something other than a directory at a layout path stays.
	pol := policy.Default()
	if err := pol.SetLayout([]string{"f", "f/under", "a/b"}); err != nil {
		t.Fatal(err)
	}
	mkfile(t, filepath.Join(e.dir(childScope), "f"), "x")
	ws = e.open(t, childScope, pol)
	if got := ws.LayoutMade(); !slices.Equal(got, []string{"a", "a/b"}) {
		t.Errorf("made %q", got)
	}
	if b, _ := os.ReadFile(filepath.Join(e.dir(childScope), "f")); string(b) != "x" {
		t.Error("a file at a layout path was touched")
	}
}

// TestLayoutJournalled: the directories the layout made are in the change
// journal, so a snapshot sees them.
func TestLayoutJournalled(t *testing.T) {
	e := newEnv(t)
	std, _ := policy.Preset("standard")
	ws := e.open(t, mainScope, std)
	files, err := ws.ReadJournal(nil)
	if err != nil {
		t.Fatal(err)
	}
	var all []string
	for _, f := range files {
		for _, c := range f.Changes {
			all = append(all, c.Path)
		}
	}
	for _, d := range []string{"data", ".meta"} {
		if !slices.Contains(all, d) {
			t.Errorf("%s not journalled: %q", d, all)
		}
	}
}

// TestPlaceFile: the platform view places a file streamed into a ro and a
// hidden subtree; the size must match, limits and quota hold with their
// figures, and a refusal leaves no file.
func TestPlaceFile(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	std, _ := policy.Preset("standard")
	std.Limits.FileBytes = 1 << 20
	std.Limits.ScopeBytes = 3 << 20
	ws := e.open(t, mainScope, std)
	pf := ws.Platform()
	cases := []struct {
		name string
		rel  string
		data []byte
		size int64
		code policy.Code
		msg  string
	}{
		{"into ro data", "data/in.csv", []byte("a,b\n"), 4, "", ""},
		{"into hidden .meta", ".meta/task.json", []byte("{}"), 2, "", ""},
		{"replace", "data/in.csv", []byte("a,b,c\n"), 6, "", ""},
		{"over the per-file limit", "data/big", make([]byte, 2<<20), 2 << 20, policy.TooLarge, "per-file limit is 1 MiB"},
		{"source grew", "data/grew", []byte("abcd"), 3, policy.Conflict, "grew"},
		{"source shrank", "data/shrank", []byte("ab"), 3, policy.Conflict, "shrank"},
		{"reserved name", ".agentloom-x", []byte("x"), 1, policy.InvalidPath, ""},
		{"README.md, not generated here", "README.md", []byte("x"), 1, "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res, err := pf.PlaceFile(ctx, c.rel, bytes.NewReader(c.data), c.size, 0o755)
			if c.code != "" {
				codeIs(t, c.rel, err, c.code)
				if !strings.Contains(err.Error(), c.msg) {
					t.Errorf("message %q lacks %q", err, c.msg)
				}
				if _, serr := os.Lstat(filepath.Join(e.dir(mainScope), c.rel)); serr == nil {
					t.Error("a refused file was left")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.Bytes != c.size || res.SHA256 != sha(c.data) {
				t.Errorf("result %+v", res)
			}
			st, _ := os.Lstat(filepath.Join(e.dir(mainScope), c.rel))
			if st.Mode().Perm() != 0o700 {
				t.Errorf("mode %v, want 0700 (0755 within OwnerPerm)", st.Mode())
			}
		})
	}
	// The agent's view still refuses both.
	if _, err := ws.WriteFile(ctx, "data/x", []byte("x"), nil); policy.CodeOf(err) != policy.ReadOnly {
		t.Errorf("agent write into data/: %v", err)
	}
	// Past the quota: refused with the figures, nothing left.
	for i := range 2 {
		if _, err := pf.PlaceFile(ctx, "data/q"+string(rune('0'+i)), bytes.NewReader(make([]byte, 1<<20)), 1<<20, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	_, err := pf.PlaceFile(ctx, "data/over", bytes.NewReader(make([]byte, 1<<20)), 1<<20, 0o600)
	codeIs(t, "over quota", err, policy.QuotaExceeded)
	if !strings.Contains(err.Error(), "workspace total 3 MiB") {
		t.Errorf("no figures: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(e.dir(mainScope), "data/over")); err == nil {
		t.Error("a partial file was left")
	}
	names := diskNames(t, filepath.Join(e.dir(mainScope), "data"))
	for _, n := range names {
		if strings.HasPrefix(n, policy.InternalPrefix) {
			t.Errorf("temporary left: %s", n)
		}
	}
	_ = store.WriteResult{}
}

// BenchmarkOpen is what opening a scope costs with no layout (open) and
// with the standard preset's, already made: six lstats more.
func BenchmarkOpen(b *testing.B) {
	std, _ := policy.Preset("standard")
	for _, c := range []struct {
		name string
		pol  *policy.Policy
	}{{"open", policy.Default()}, {"standard", std}} {
		b.Run(c.name, func(b *testing.B) {
			vol, err := store.OpenVolume(context.Background(), store.Config{Root: b.TempDir()})
			if err != nil {
				b.Fatal(err)
			}
			defer vol.Close()
			for b.Loop() {
				ws, err := vol.Open(context.Background(), mainScope, c.pol)
				if err != nil {
					b.Fatal(err)
				}
				ws.Close()
			}
		})
	}
}
