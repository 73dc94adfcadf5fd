package newname

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestPlaceRemembersRefusal: once a filesystem refused RENAME_NOREPLACE,
// Place goes to link(2) there without asking again (a round trip on
// ceph-fuse), and still refuses an existing name.
func TestPlaceRemembersRefusal(t *testing.T) {
	t.Cleanup(WithoutRenameNoReplace())
	asked := 0
	renameNoReplace = func(int, string, string) error { asked++; return unix.EINVAL }
	dir := t.TempDir()
	dfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dfd)
	for i, name := range []string{"a", "b", "c"} {
		tmp := "tmp-" + name
		if err := os.WriteFile(filepath.Join(dir, tmp), []byte(name), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := Place(dfd, tmp, name); err != nil {
			t.Fatalf("Place %s: %v", name, err)
		}
		if asked != 1 {
			t.Fatalf("after %d placements RENAME_NOREPLACE was tried %d times, want once", i+1, asked)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "tmp-x"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Place(dfd, "tmp-x", "a"); err != unix.EEXIST {
		t.Errorf("Place onto an existing name = %v, want EEXIST", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "a")); string(b) != "a" {
		t.Errorf("a holds %q after a refused placement", b)
	}
}
