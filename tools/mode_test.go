package tools

import (
	"os"
	"path/filepath"
	"testing"
)

// TestWriteEditKeepMode: workspace_write and workspace_edit replace a file
// atomically and keep its mode (an executable stays one), never with a
// group or other bit; a new file is 0600 (SPEC §2.1).
func TestWriteEditKeepMode(t *testing.T) {
	tb, dir := newBox(t, nil)
	mustCall(t, tb, Write, map[string]any{"path": "run.sh", "content": "#!/bin/sh\necho one\n"})
	mustCall(t, tb, Write, map[string]any{"path": "shared.txt", "content": "x\n"})
	// As a program in the projection leaves them: an executable, and a
	// file someone else made readable to all.
	for rel, mode := range map[string]os.FileMode{"run.sh": 0o700, "shared.txt": 0o644} {
		if err := os.Chmod(filepath.Join(dir, rel), mode); err != nil {
			t.Fatal(err)
		}
	}
	mustCall(t, tb, Write, map[string]any{"path": "run.sh", "content": "#!/bin/sh\necho two\n"})
	mustCall(t, tb, Edit, map[string]any{"path": "run.sh", "old_text": "two", "new_text": "three"})
	mustCall(t, tb, Edit, map[string]any{"path": "shared.txt", "old_text": "x", "new_text": "y"})
	mustCall(t, tb, Write, map[string]any{"path": "new.txt", "content": "new\n"})
	for rel, want := range map[string]os.FileMode{"run.sh": 0o700, "shared.txt": 0o600, "new.txt": 0o600} {
		fi, err := os.Stat(filepath.Join(dir, rel))
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode() & os.ModePerm; got != want {
			t.Errorf("%s after write and edit: mode %v, want %v", rel, got, want)
		}
	}
}
