package fusefs

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
)

// A file whose name is removed while it is open, or made by O_TMPFILE,
// holds its space until its last close: it stays counted in the quota
// until then, and is given back at the release that closes it. That is
// the pattern of tmpfile(3), SQLite's temporary stores and Python's
// tempfile.TemporaryFile; counting the space at unlink and the writes
// after it would leave them counted for ever.

// held is what a node's opens keep counted. It is changed under node.mu;
// the reconcile reads unnamed and elsewhere without it (heldOpen).
type held struct {
	opens int // handles open on the node's file in this mount
	// own is those of them that hold the node's own file (not another
	// that replaced it: handle.foreign), for a request on the node that
	// can be served through one of them (node.openFD).
	own []*handle
	// unnamed is set when the file lost its last name through this mount
	// while open (unlink, rename over it) or was made by O_TMPFILE: it
	// stays counted, at the path it had, until the last release.
	unnamed atomic.Bool
	rel     atomic.Pointer[string] // the path it is counted at (at)
	// elsewhere is what was counted by size changes made here after
	// another door or mount removed the file's name (it counted the file
	// away as it stood then): taken back at the last release.
	elsewhere atomic.Int64
}

// at returns the path the file is counted at, for AdjustAt and for
// heldOpen, which reads it without node.mu.
func (h *held) at() string {
	if p := h.rel.Load(); p != nil {
		return *p
	}
	return ""
}

// countAt sets the path the file is counted at. node.mu is held.
func (h *held) countAt(rel string) { h.rel.Store(&rel) }

// opened counts an open of the node's file.
func (n *node) opened(o *handle) {
	n.mu.Lock()
	n.held.opens++
	if !o.foreign {
		n.held.own = append(n.held.own, o)
	}
	n.mu.Unlock()
}

// openFD returns the fd of an open of the node's own file in this mount,
// kept open until done is called, or false when there is none.
func (n *node) openFD() (fd int, done func(), ok bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.held.own) == 0 {
		return -1, nil, false
	}
	o := n.held.own[0]
	// Taken before mu is let go: close drops o from own under mu before
	// it waits for fdMu to close the fd.
	o.fdMu.RLock()
	return o.fd, o.fdMu.RUnlock, true
}

// closing is told that an open of the node's file, o, is about to be
// closed; at the last one a file with no name gives back what it held.
func (n *node) closing(o *handle) {
	n.mu.Lock()
	defer n.mu.Unlock()
	h := &n.held
	for i, x := range h.own {
		if x == o {
			h.own = slices.Delete(h.own, i, i+1)
			break
		}
	}
	if n.fresh == o {
		n.fresh = nil
	}
	fd := o.fd
	if h.opens--; h.opens > 0 || !h.unnamed.Load() && h.elsewhere.Load() == 0 {
		return
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err == nil && st.Nlink == 0 {
		if h.unnamed.Load() {
			n.fsys.ws.AdjustAt(h.at(), -st.Size, -1)
		} else {
			n.fsys.ws.AdjustAt(h.at(), -h.elsewhere.Load(), 0)
		}
	}
	h.unnamed.Store(false)
	h.elsewhere.Store(0)
}

// heldOpen is what the files open in this mount hold, counted at the
// cleaned path under or beneath it ("." for the whole scope), that a walk
// can't see: those with no name left, counted until their last release.
// The reconcile asks it while it holds the account, so it takes no node's
// lock (a write holding one may be waiting for the account).
func (f *fsys) heldOpen(under string) policy.Usage {
	var u policy.Usage
	seen := map[*node]bool{}
	f.open.Range(func(k, _ any) bool {
		n := k.(*handle).node
		if seen[n] || !n.held.unnamed.Load() && n.held.elsewhere.Load() == 0 {
			return true
		}
		if rel := n.held.at(); under != "." && rel != under && !strings.HasPrefix(rel, under+"/") {
			return true
		}
		seen[n] = true
		fd, _, ok := n.dupOpen()
		if !ok {
			return true
		}
		var st unix.Stat_t
		err := unix.Fstat(fd, &st)
		unix.Close(fd)
		switch {
		case err != nil || st.Nlink != 0:
		case n.held.unnamed.Load():
			u.Bytes += st.Size
			u.Files++
		default:
			u.Bytes += n.held.elsewhere.Load()
		}
		return true
	})
	return u
}

// resized notes a size change of delta bytes counted for the node's file,
// which fstat described as st before it: one made after another door
// removed the file's name is taken back at the last release. n.mu is held.
func (n *node) resized(st *unix.Stat_t, rel string, delta int64) {
	if st.Nlink != 0 || n.held.unnamed.Load() || delta == 0 {
		return
	}
	n.held.elsewhere.Add(delta)
	n.held.countAt(rel)
}

// removing looks for the node of the entry name, which a remove or rename
// over it is about to take away (the object sx), and locks it: the caller
// calls done with whether the name went, and learns whether the space is
// still held by an open (so not to be given back now).
func (n *node) removing(name string, sx *unix.Statx_t, rel string) (done func(removed bool) (held bool)) {
	in := n.GetChild(name)
	if in == nil || in.StableAttr().Ino != sx.Ino {
		return func(bool) bool { return false }
	}
	c, ok := in.Operations().(*node)
	if !ok {
		return func(bool) bool { return false }
	}
	// A kept reader is no open of the program's: it must not keep the
	// removed file's space (reader.go).
	c.dropReader()
	c.mu.Lock()
	return func(removed bool) bool {
		defer c.mu.Unlock()
		if !removed || c.held.opens == 0 || sx.Nlink > 1 {
			return false
		}
		c.held.unnamed.Store(true)
		c.held.countAt(rel)
		return true
	}
}

var (
	_ = (fs.NodeTmpfiler)((*node)(nil))
)

// Tmpfile makes a file with no name in this directory (open(2) with
// O_TMPFILE): an O_TMPFILE file of the backing directory, counted as a
// file from the start and given back at its last release unless linkat(2)
// names it first (Link).
func (n *node) Tmpfile(ctx context.Context, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	f := n.fsys
	dir, ok := n.relPath()
	if !ok {
		return nil, nil, 0, syscall.ENOENT
	}
	// The rules of the directory are asked about an entry in it.
	rel := policy.Join(dir, unnamedName)
	ev := f.event(ctx, "tmpfile", dir)
	err := n.checkDir(ctx, rel, policy.MayWrite|policy.MayExec)
	if err == nil {
		err = f.admit(policy.OpCreate, rel)
	}
	acc := int(flags) & unix.O_ACCMODE
	if err == nil && acc != unix.O_WRONLY {
		err = f.pol.Check(policy.OpRead, rel)
	}
	if err != nil {
		return nil, nil, 0, f.refused(ctx, ev, err)
	}
	if acc == unix.O_RDONLY {
		return nil, nil, 0, syscall.EINVAL
	}
	parent, _, err := n.parentOf(rel)
	if err != nil {
		return nil, nil, 0, f.failed(ctx, ev, err)
	}
	defer parent.Close()
	if err := f.reserve(ctx, rel, 0, 1); err != nil {
		return nil, nil, 0, f.refused(ctx, ev, err)
	}
	if e := f.begin(ctx, ev); e != 0 {
		f.ws.AdjustAt(rel, 0, -1)
		return nil, nil, 0, e
	}
	perm := policy.OwnerPerm(mode)
	// Always linkable in the backing store: O_EXCL (never to be named)
	// is the kernel's to enforce on its own inode.
	fd, err := unix.Openat(int(parent.Fd()), ".", acc|unix.O_TMPFILE|unix.O_CLOEXEC, perm)
	if err != nil {
		f.ws.AdjustAt(rel, 0, -1)
		return nil, nil, 0, f.failed(ctx, ev, err)
	}
	sx, err := f.setPerm(fd, perm)
	if err != nil {
		unix.Close(fd)
		f.ws.AdjustAt(rel, 0, -1)
		return nil, nil, 0, f.failed(ctx, ev, err)
	}
	f.fillAttr(&sx, &out.Attr)
	f.setEntry(&sx, out)
	in := n.NewInode(ctx, &node{fsys: f}, stableAttr(&sx))
	c := in.Operations().(*node)
	c.perm.Store(uint32(sx.Mode) & 0o7777)
	h, fuseFlags := newHandle(c, fd, rel, flags, true, false)
	c.mu.Lock()
	c.held.unnamed.Store(true)
	c.held.countAt(rel)
	c.mu.Unlock()
	return in, h.fileHandle(), fuseFlags, 0
}

// unnamedName stands for a file with no name in records and rule checks.
const unnamedName = "(unnamed)"

// linkUnnamed names the O_TMPFILE file of node t as name in this
// directory (linkat(2) from /proc/self/fd). It stays counted, now as a
// file with a name. ok is false when t is not such a file: then the link
// is refused as every hard link is.
func (n *node) linkUnnamed(ctx context.Context, t *node, name string, out *fuse.EntryOut) (*fs.Inode, bool, syscall.Errno) {
	f := n.fsys
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.held.unnamed.Load() || t.held.opens == 0 {
		return nil, false, 0
	}
	fd, _, ok := t.dupOpen()
	if !ok {
		return nil, false, 0
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Nlink != 0 {
		return nil, false, 0
	}
	rel, err := n.childRel(name)
	ev := f.event(ctx, "link", rel)
	if err == nil {
		err = n.checkDir(ctx, rel, policy.MayWrite|policy.MayExec)
	}
	if err == nil {
		err = f.admit(policy.OpCreate, rel)
	}
	// Moving it from where it was made is a move: the rules of both
	// places must allow it.
	if err == nil {
		err = f.pol.CheckMove(t.held.at(), rel, false)
	}
	if err != nil {
		return nil, true, f.refused(ctx, ev, err)
	}
	parent, base, err := n.parentOf(rel)
	if err != nil {
		return nil, true, f.failed(ctx, ev, err)
	}
	defer parent.Close()
	if err := f.ws.ReserveMove(ctx, t.held.at(), rel, st.Size, 1); err != nil {
		return nil, true, f.refused(ctx, ev, err)
	}
	if e := f.begin(ctx, ev); e != 0 {
		f.ws.ReserveMove(context.WithoutCancel(ctx), rel, t.held.at(), st.Size, 1) // undo
		return nil, true, e
	}
	if err := unix.Linkat(fd, "", int(parent.Fd()), base, unix.AT_EMPTY_PATH); err != nil {
		f.ws.ReserveMove(context.WithoutCancel(ctx), rel, t.held.at(), st.Size, 1) // undo
		return nil, true, f.failed(ctx, ev, err)
	}
	t.held.unnamed.Store(false)
	t.held.countAt("")
	f.ws.NoteChange(rel, false)
	sx, err := statAt(int(parent.Fd()), base)
	if err != nil {
		return nil, true, policy.Errno(err)
	}
	in, e := n.child(ctx, rel, &sx, out)
	return in, true, e
}
