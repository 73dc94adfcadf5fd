package quota

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestPublishLeavesOldVersionWhole: a temporary name left over as another
// name of the current version (a placing by hard link whose removal of
// the temporary name failed, or a crash between the two) is not written
// through: the current version keeps its bytes until the next is placed.
func TestPublishLeavesOldVersionWhole(t *testing.T) {
	path := t.TempDir()
	dir, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dir)
	v := version{base: "ledger"}
	if err := v.publish(dir, "t-x.ledger", []byte("first\n")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(path, "ledger.1"), filepath.Join(path, "t-x.ledger")); err != nil {
		t.Fatal(err)
	}
	// A reader has the current version open.
	old, err := os.Open(filepath.Join(path, "ledger.1"))
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if err := v.publish(dir, "t-x.ledger", []byte("second\n")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if n, _ := old.ReadAt(buf, 0); string(buf[:n]) != "first\n" {
		t.Errorf("the version a reader had open now holds %q, want %q", buf[:n], "first\n")
	}
	if b, err := os.ReadFile(filepath.Join(path, "ledger.2")); err != nil || string(b) != "second\n" {
		t.Errorf("ledger.2 = %q, %v; want the second version", b, err)
	}
	names, _ := listDir(dir)
	if got := versionOf(names, "ledger"); got.n != 2 || len(got.older) != 0 {
		t.Errorf("versions after two publishes: %+v", got)
	}
}
