package tools

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/agentloom/loomfs/policy"
)

// TestTrailingSlashOnAFile: "tf.txt/" names a directory; every tool answers
// not_dir for a file there, and nothing is read, replaced or removed.
func TestTrailingSlashOnAFile(t *testing.T) {
	tb, dir := newBox(t, nil)
	w := mustCall(t, tb, Write, map[string]any{"path": "tf.txt", "content": "keep\n"})
	mustCall(t, tb, Mkdir, map[string]any{"path": "d"})
	sum := w["sha256"].(string)
	for _, path := range []string{"tf.txt/", "tf.txt/.", "./tf.txt/"} {
		for _, c := range []struct {
			tool string
			in   map[string]any
		}{
			{Read, map[string]any{"path": path}},
			{Stat, map[string]any{"path": path}},
			{List, map[string]any{"path": path}},
			{Glob, map[string]any{"pattern": "*", "path": path}},
			{Grep, map[string]any{"pattern": "keep", "path": path}},
			{Write, map[string]any{"path": path, "content": "lost\n"}},
			{Write, map[string]any{"path": path, "content": "lost\n", "expected_sha256": sum}},
			{Edit, map[string]any{"path": path, "old_text": "keep", "new_text": "lost"}},
			{Delete, map[string]any{"path": path}},
			{Delete, map[string]any{"path": path, "expected_sha256": sum}},
			{Mkdir, map[string]any{"path": path}},
		} {
			_, err := call(t, tb, c.tool, c.in)
			wantCode(t, err, policy.NotDir)
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "tf.txt")); err != nil || string(b) != "keep\n" {
		t.Fatalf("tf.txt is now %q, %v", b, err)
	}
	// A new file can't be created under a directory's spelling either.
	_, err := call(t, tb, Write, map[string]any{"path": "new.txt/", "content": "x"})
	wantCode(t, err, policy.NotDir)
	if _, err := os.Lstat(filepath.Join(dir, "new.txt")); !os.IsNotExist(err) {
		t.Fatalf("new.txt was created: %v", err)
	}
	// Directories keep working with the slash.
	mustCall(t, tb, List, map[string]any{"path": "d/"})
	mustCall(t, tb, Stat, map[string]any{"path": "d/"})
	mustCall(t, tb, Mkdir, map[string]any{"path": "e/"})
	mustCall(t, tb, Delete, map[string]any{"path": "e/"})
}
