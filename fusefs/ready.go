package fusefs

import (
	"context"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/agentloom/loomfs/policy"
)

// readyIno is the inode number of the ready sentinel: out of the range a
// backing filesystem hands out, so it never collides with a real file.
const readyIno = 1<<63 | 1

// readyNode is policy.ReadyFile at the top of the mount: a read-only file
// that exists only while the mount's last health probe passed (SPEC §6),
// so a process in the sandbox can wait for it before it starts work.
type readyNode struct {
	fs.Inode
	fsys *fsys
}

var (
	_ = (fs.NodeOpener)((*readyNode)(nil))
	_ = (fs.NodeReader)((*readyNode)(nil))
	_ = (fs.NodeGetattrer)((*readyNode)(nil))
)

// readyText is the sentinel's content: when the probe last passed.
func (f *fsys) readyText() []byte {
	t := time.Unix(0, f.readySince.Load()).UTC()
	return []byte("ready " + t.Format(time.RFC3339) + "\n")
}

// setReady records the outcome of a health probe.
func (f *fsys) setReady(ok bool) {
	if ok {
		f.readySince.Store(time.Now().UnixNano())
	} else {
		f.readySince.Store(0)
	}
}

func (f *fsys) ready() bool { return f.readySince.Load() != 0 }

// placedHere reports whether name, an entry at the top of the mount, is a
// file loomfs itself places there and never lists: the sentinel (served by
// the mount alone) and the file of a health probe under way. Both answer
// lookup and stat; git add -A, tar and cp -r, which list, never meet them.
func (f *fsys) placedHere(name string) bool {
	if name == policy.ReadyFile {
		return true
	}
	return f.probingName(name)
}

// probingName reports whether name is the file of a health probe under way.
func (f *fsys) probingName(name string) bool {
	p := f.probing.Load()
	return p != nil && *p == name
}

// lookupReady answers a lookup of the sentinel at the top of the mount.
func (n *node) lookupReady(ctx context.Context, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	f := n.fsys
	if err := n.checkDir(ctx, policy.ReadyFile, policy.MayExec); err != nil {
		return nil, f.refused(ctx, f.event(ctx, "lookup", policy.ReadyFile), err)
	}
	if !f.ready() {
		// Not cached as a failed lookup: the sentinel comes with the
		// next passing probe.
		out.SetEntryTimeout(time.Nanosecond)
		return nil, syscall.ENOENT
	}
	r := &readyNode{fsys: f}
	r.fill(&out.Attr)
	// Short lifetimes: the sentinel goes away when a probe fails.
	out.SetEntryTimeout(0)
	out.SetAttrTimeout(0)
	return n.NewInode(ctx, r, fs.StableAttr{Mode: syscall.S_IFREG, Ino: readyIno}), 0
}

func (r *readyNode) fill(a *fuse.Attr) {
	f := r.fsys
	a.Mode = syscall.S_IFREG | 0o400
	a.Ino = readyIno
	a.Nlink = 1
	a.Size = uint64(len(f.readyText()))
	a.Uid, a.Gid = f.uid, f.gid
	t := time.Unix(0, f.readySince.Load())
	a.SetTimes(&t, &t, &t)
}

func (r *readyNode) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if !r.fsys.ready() {
		return syscall.ENOENT
	}
	r.fill(&out.Attr)
	return 0
}

func (r *readyNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if flags&(syscall.O_WRONLY|syscall.O_RDWR|syscall.O_TRUNC) != 0 {
		return nil, 0, policy.Errno(policy.Errorf(policy.ReadOnly, "%s is read-only", policy.ReadyFile))
	}
	if !r.fsys.ready() {
		return nil, 0, syscall.ENOENT
	}
	obj := policy.Object{Kind: policy.KindRegular, Perm: 0o400, Nlink: 1}
	if err := r.fsys.access(ctx, policy.ReadyFile, obj, policy.MayRead); err != nil {
		return nil, 0, policy.Errno(err)
	}
	return nil, fuse.FOPEN_DIRECT_IO, 0
}

func (r *readyNode) Read(ctx context.Context, fh fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	b := r.fsys.readyText()
	if off >= int64(len(b)) {
		return fuse.ReadResultData(nil), 0
	}
	return fuse.ReadResultData(b[off:]), 0
}
