package newname_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/newname"
)

// TestPlace: an exclusive create refuses an existing name and leaves no
// temporary file, with RENAME_NOREPLACE and without it (ceph-fuse,
// GlusterFS).
func TestPlace(t *testing.T) {
	for _, refused := range []bool{false, true} {
		name := "renameat2"
		if refused {
			name = "no RENAME_NOREPLACE"
		}
		t.Run(name, func(t *testing.T) {
			if refused {
				t.Cleanup(newname.WithoutRenameNoReplace())
			}
			dir := t.TempDir()
			dfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(dfd)
			mkfile(t, filepath.Join(dir, "tmp1"), "new")
			if err := newname.Place(dfd, "tmp1", "rec"); err != nil {
				t.Fatalf("Place onto a new name: %v", err)
			}
			mkfile(t, filepath.Join(dir, "tmp2"), "other")
			if err := newname.Place(dfd, "tmp2", "rec"); !errors.Is(err, unix.EEXIST) {
				t.Fatalf("Place onto an existing name = %v, want EEXIST", err)
			}
			if b, _ := os.ReadFile(filepath.Join(dir, "rec")); string(b) != "new" {
				t.Errorf("rec holds %q, want %q", b, "new")
			}
			if _, err := os.Stat(filepath.Join(dir, "tmp1")); !os.IsNotExist(err) {
				t.Errorf("the placed temporary file is still there: %v", err)
			}
		})
	}
}

func mkfile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
