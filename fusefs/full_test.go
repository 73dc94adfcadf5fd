package fusefs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// fullTmpfs mounts a tmpfs of size (bytes or inodes: "size=512k",
// "nr_inodes=64") for the test's volume, or skips without privilege.
func fullTmpfs(t *testing.T, opts string) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, opts+",mode=0700"); err != nil {
		t.Skipf("cannot mount tmpfs (needs root): %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// fillVolume takes every block under root (inodes: every inode instead),
// from the host, and returns a function that gives them back.
func fillVolume(t *testing.T, root string, inodes bool) (free func()) {
	t.Helper()
	dir := filepath.Join(root, "filler")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		f, err := os.Create(filepath.Join(dir, strconv.Itoa(i)))
		if errors.Is(err, syscall.ENOSPC) && inodes {
			break
		}
		if err != nil {
			t.Fatalf("filling the volume: %v", err)
		}
		if !inodes {
			_, err = f.Write(make([]byte, 64<<20))
			f.Close()
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling the volume: %v", err)
			}
			break
		}
		f.Close()
		if i > 100000 {
			t.Fatal("the volume's inodes never ran out")
		}
	}
	return func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
	}
}

// A full volume, of bytes or of inodes, is ENOSPC through the mount, never
// a crash of the daemon: the mount stays up, what was there reads as it
// was, a replace that could not be written leaves the old content, and
// once room comes back, writes go on without a remount. The mount's first
// change on the full volume opens the scope's quota account, which used to
// map its record sparse and die of SIGBUS.
func TestFullVolume(t *testing.T) {
	for _, size := range []string{"size=1m", "nr_inodes=256"} {
		t.Run(size, func(t *testing.T) {
			root := fullTmpfs(t, size)
			inodes := strings.HasPrefix(size, "nr_inodes")
			e := newEnv(t, withRoot(filepath.Join(root, "volume")))
			if err := os.WriteFile(e.host("kept.txt"), []byte("old"), 0o600); err != nil {
				t.Fatal(err)
			}
			free := fillVolume(t, root, inodes)

			err := os.WriteFile(e.path("new.txt"), make([]byte, 256<<10), 0o600)
			if !errors.Is(err, syscall.ENOSPC) {
				t.Errorf("write of a new file on a full volume: %v, want ENOSPC", err)
			}
			// A replace as editors make it: a temporary file renamed over.
			tmp := e.path("kept.txt.tmp")
			if err := os.WriteFile(tmp, make([]byte, 256<<10), 0o600); err == nil {
				if err := os.Rename(tmp, e.path("kept.txt")); err != nil {
					t.Fatal(err)
				}
				t.Fatal("a replace was written on a full volume")
			} else if !errors.Is(err, syscall.ENOSPC) {
				t.Errorf("write of a replacement: %v, want ENOSPC", err)
			}
			os.Remove(tmp)
			if b, err := os.ReadFile(e.path("kept.txt")); err != nil || string(b) != "old" {
				t.Fatalf("kept.txt on a full volume = %q, %v; want its old content", b, err)
			}
			if _, err := os.ReadDir(e.mnt); err != nil {
				t.Fatalf("list on a full volume: %v", err)
			}
			// A mount started on the full volume passes its health probe
			// (the projection answers ENOSPC as it should) and serves.
			var late *Mounted
			dir := mountAt(t, e.ws, filepath.Join(t.TempDir(), "late"), Options{Audit: e.sink}, &late)
			if err := late.Probe(context.Background()); err != nil {
				t.Fatalf("health probe of a mount started on a full volume: %v", err)
			}
			if b, err := os.ReadFile(filepath.Join(dir, "kept.txt")); err != nil || string(b) != "old" {
				t.Fatalf("kept.txt through the late mount = %q, %v", b, err)
			}
			if ev := e.sink.find("create", "refused", "new.txt"); len(ev) == 0 && len(e.sink.find("write", "refused", "new.txt")) == 0 {
				t.Errorf("the refusal of new.txt is not in the audit: %+v", e.sink.events)
			}

			free()
			if err := os.WriteFile(e.path("new.txt"), []byte("room again"), 0o600); err != nil {
				t.Fatalf("write once room came back: %v", err)
			}
			if b, err := os.ReadFile(e.host("new.txt")); err != nil || string(b) != "room again" {
				t.Fatalf("new.txt in the store = %q, %v", b, err)
			}
		})
	}
}
