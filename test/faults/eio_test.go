package faults

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// The kernel these tests run on may lack device-mapper (dm-error,
// dm-flakey), so a failing disk is a FUSE filesystem served by the test:
// a loopback of a directory that answers EIO, while armed, to what a
// failing disk refuses. loomfs meets it through the kernel as it would
// meet a network filesystem's I/O error.

// failing says what a flakyNode refuses.
type failing struct {
	writes atomic.Bool // write, create, mkdir, rename, unlink, allocate: EIO
	fsync  atomic.Bool // fsync: EIO (the writeback was lost)
}

type flakyNode struct {
	*fs.LoopbackNode
	fail *failing
}

var (
	_ = (fs.NodeWriter)((*flakyNode)(nil))
	_ = (fs.NodeFsyncer)((*flakyNode)(nil))
	_ = (fs.NodeCreater)((*flakyNode)(nil))
	_ = (fs.NodeMkdirer)((*flakyNode)(nil))
	_ = (fs.NodeRenamer)((*flakyNode)(nil))
	_ = (fs.NodeUnlinker)((*flakyNode)(nil))
	_ = (fs.NodeAllocater)((*flakyNode)(nil))
	_ = (fs.NodeWrapChilder)((*flakyNode)(nil))
	_ = (fs.NodeTmpfiler)((*flakyNode)(nil))
)

func (n *flakyNode) Write(ctx context.Context, f fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	if n.fail.writes.Load() {
		return 0, syscall.EIO
	}
	return f.(fs.FileWriter).Write(ctx, data, off)
}

func (n *flakyNode) Fsync(ctx context.Context, f fs.FileHandle, flags uint32) syscall.Errno {
	if n.fail.fsync.Load() || n.fail.writes.Load() {
		return syscall.EIO
	}
	if fs, ok := f.(fs.FileFsyncer); ok {
		return fs.Fsync(ctx, flags)
	}
	return 0
}

func (n *flakyNode) Allocate(ctx context.Context, f fs.FileHandle, off, size uint64, mode uint32) syscall.Errno {
	if n.fail.writes.Load() {
		return syscall.EIO
	}
	return f.(fs.FileAllocater).Allocate(ctx, off, size, mode)
}

func (n *flakyNode) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	if n.fail.writes.Load() {
		return nil, nil, 0, syscall.EIO
	}
	return n.LoopbackNode.Create(ctx, name, flags, mode, out)
}

func (n *flakyNode) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if n.fail.writes.Load() {
		return nil, syscall.EIO
	}
	return n.LoopbackNode.Mkdir(ctx, name, mode, out)
}

func (n *flakyNode) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	if n.fail.writes.Load() {
		return syscall.EIO
	}
	return n.LoopbackNode.Rename(ctx, name, newParent, newName, flags)
}

func (n *flakyNode) Unlink(ctx context.Context, name string) syscall.Errno {
	if n.fail.writes.Load() {
		return syscall.EIO
	}
	return n.LoopbackNode.Unlink(ctx, name)
}

// Tmpfile answers ENOSYS: the loopback can't link an unnamed file into
// place, so the kernel is told to fail O_TMPFILE and loomfs uses its
// named temporary files, as on any filesystem without O_TMPFILE.
func (n *flakyNode) Tmpfile(context.Context, uint32, uint32, *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	return nil, nil, 0, syscall.ENOSYS
}

// WrapChild makes every node of the tree fail as the root does.
func (n *flakyNode) WrapChild(_ context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	return &flakyNode{LoopbackNode: ops.(*fs.LoopbackNode), fail: n.fail}
}

// mountFlaky serves a loopback of a fresh directory at dir, failing as
// fail says, until cleanup.
func mountFlaky(t *testing.T, dir string, fail *failing) {
	t.Helper()
	back := t.TempDir()
	n, err := fs.NewLoopbackRoot(back)
	if err != nil {
		t.Fatal(err)
	}
	root := &flakyNode{LoopbackNode: n.(*fs.LoopbackNode), fail: fail}
	server, err := fs.Mount(dir, root, &fs.Options{MountOptions: fuse.MountOptions{FsName: "faults-flaky", Name: "flaky"}})
	if err != nil {
		t.Fatalf("mount the failing disk: %v", err)
	}
	t.Cleanup(func() {
		if server.Unmount() != nil {
			detach(dir)
		}
	})
}

// TestIOError puts the workspace root on a disk that fails: every write
// (as under dm-error), or only fsync (writeback lost). Each change of the
// tool door is refused with a JSON error and leaves the old content; a
// mount answers EIO and stays up; once the disk heals, the same mount and
// the tools work again.
func TestIOError(t *testing.T) {
	for _, mode := range []string{"writes", "fsync"} {
		t.Run(mode, func(t *testing.T) {
			c := newCell(t)
			fail := &failing{}
			mountFlaky(t, c.root, fail)
			seed(c, map[string]string{"x.txt": oldText, "z.txt": "to be deleted\n"})
			mnt := filepath.Join(c.dir, "mnt")
			os.Mkdir(mnt, 0o755)
			d, ready := startMount(c.plain("mount", "--scope", scope, mnt), mnt)
			if !ready {
				d.stop(10 * time.Second)
				t.Fatalf("mount: %s", d.stderr.String())
			}
			flag := &fail.writes
			if mode == "fsync" {
				flag = &fail.fsync
			}
			flag.Store(true)
			before := c.tree()
			for _, call := range []struct {
				tool  string
				input map[string]any
			}{
				{"workspace_write", map[string]any{"path": "x.txt", "content": newText}},
				{"workspace_write", map[string]any{"path": "new.txt", "content": newText}},
				{"workspace_edit", map[string]any{"path": "x.txt", "old_text": "beta", "new_text": "BETA"}},
				{"workspace_apply_patch", map[string]any{"patch": patch}},
				{"workspace_mkdir", map[string]any{"path": "d"}},
				{"workspace_delete", map[string]any{"path": "z.txt"}},
			} {
				o := c.tool(call.tool, call.input)
				held := true
				if s := crashed(o, false); s != "" {
					t.Errorf("%s on a failing disk: %s: %s", call.tool, s, o)
					held = false
				} else if _, p := answer(o); p != "" {
					t.Errorf("%s on a failing disk: %s", call.tool, p)
					held = false
				} else if o.exit == 0 && mode == "writes" {
					t.Errorf("%s on a disk that fails every write answered done: %s", call.tool, o)
					held = false
				}
				tally.add("failing disk ("+mode+")", "tool", held)
			}
			if got := c.tree(); !got.equal(before) && mode == "writes" {
				t.Errorf("the scope changed on a disk that fails every write: %s, was %s", got, before)
			}
			err, hung := within(20*time.Second, func() error {
				f, err := os.Create(filepath.Join(mnt, "m.txt"))
				if err != nil {
					return err
				}
				_, err = f.WriteString("through the mount\n")
				return errors.Join(err, f.Sync(), f.Close())
			})
			mountHeld := !hung && errors.Is(err, syscall.EIO)
			if !mountHeld {
				t.Errorf("a fsynced write through the mount on a failing disk: %v (hung %v), want EIO", err, hung)
			}
			if b, err := os.ReadFile(filepath.Join(mnt, "x.txt")); err != nil || (mode == "writes" && string(b) != oldText) {
				t.Errorf("a read through the mount on a failing disk: %q, %v", b, err)
				mountHeld = false
			}
			tally.add("failing disk ("+mode+")", "fuse", mountHeld)
			// The disk heals: the same mount and the tools work again.
			flag.Store(false)
			if o := c.tool("workspace_write", map[string]any{"path": "x.txt", "content": newText}); o.exit != 0 {
				t.Errorf("a write once the disk healed: %s", o)
			}
			err, hung = within(20*time.Second, func() error {
				return os.WriteFile(filepath.Join(mnt, "healed.txt"), []byte("healed\n"), 0o600)
			})
			if hung || err != nil {
				t.Errorf("a write through the mount once the disk healed: %v (hung %v)", err, hung)
			}
			if o := d.stop(30 * time.Second); o.exit != 0 || crashed(o, false) != "" {
				t.Errorf("the mount: %s", o)
			}
			if mounted(mnt) {
				t.Error("a mount is left")
				detach(mnt)
			}
			for _, p := range c.scopeHeld() {
				t.Error(p)
			}
		})
	}
}
