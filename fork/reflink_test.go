package fork_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/fork"
	"github.com/agentloom/loomfs/snapshot"
	"github.com/agentloom/loomfs/store"
)

// xfsVolume makes an XFS with reflink=1 on a loop device, mounted for the
// test's life, and returns its mountpoint.
func xfsVolume(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to attach a loop device and mount it")
	}
	if _, err := exec.LookPath("mkfs.xfs"); err != nil {
		t.Fatal("mkfs.xfs is missing: install xfsprogs (scripts/setup does)")
	}
	dir := t.TempDir()
	img := filepath.Join(dir, "xfs.img")
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	// XFS wants 300 MiB at least; the image is sparse.
	if err := f.Truncate(512 << 20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if out, err := exec.Command("mkfs.xfs", "-q", "-m", "reflink=1", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.xfs: %v: %s", err, out)
	}
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount the XFS image: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", mnt, err, out)
		}
	})
	return mnt
}

// used is the bytes in use on the filesystem holding path.
func used(t *testing.T, path string) int64 {
	t.Helper()
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		t.Fatal(err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize
}

// TestForkReflink forks 200 files of 64 KiB on XFS with reflinks: every
// file is cloned from its blob and the fork takes almost no new space;
// the same fork with cloning turned off copies and takes it all.
func TestForkReflink(t *testing.T) {
	root := xfsVolume(t)
	v := newVolume(t, root)
	main := v.open(t, mainScope, nil)
	const n, size = 200, 64 << 10
	for i := range n {
		write(t, main, fmt.Sprintf("src/f%03d.bin", i), strings.Repeat(string(rune('a'+i%26)), size-1)+fmt.Sprint(i%10))
	}
	data := int64(n * size)
	tests := []struct {
		name    string
		to      store.Scope
		opt     fork.Options
		clone   string
		maxUsed int64
		minUsed int64
	}{
		{name: "reflinked from the blobs", to: childA, clone: "reflink", maxUsed: data / 8},
		{name: "copied when told not to clone", to: childB, opt: fork.Options{NoClone: true}, clone: "copy", minUsed: data},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// Snapshot first, so only the fork is measured.
			m, err := snapshot.Create(context.Background(), main, snapshot.Options{})
			if err != nil {
				t.Fatal(err)
			}
			tc.opt.Snapshot = m.ID
			dst := v.open(t, tc.to, nil)
			before := used(t, root)
			res, err := fork.Fork(context.Background(), main, dst, tc.opt)
			if err != nil {
				t.Fatal(err)
			}
			grew := used(t, root) - before
			if res.Clone != tc.clone || res.Files != n {
				t.Fatalf("fork %+v, want %d files by %s", res, n, tc.clone)
			}
			if tc.maxUsed > 0 && grew > tc.maxUsed {
				t.Errorf("the fork took %d bytes, want at most %d (shared extents)", grew, tc.maxUsed)
			}
			if tc.minUsed > 0 && grew < tc.minUsed {
				t.Errorf("the fork took %d bytes, want at least %d (a copy)", grew, tc.minUsed)
			}
			got, _ := read(t, v, tc.to, "src/f007.bin")
			if want := strings.Repeat("h", size-1) + "7"; got != want {
				t.Errorf("src/f007.bin in the fork has %d bytes, not its content", len(got))
			}
		})
	}
}
