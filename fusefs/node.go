package fusefs

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// node is one object of the scope as the kernel knows it. It holds no fd
// and no host path: every operation takes the node's path inside the
// scope, asks the policy, and reaches the backing object through the
// store's fd-based resolution.
type node struct {
	fs.Inode
	fsys *fsys

	// mu serialises the operations that change this file's size (write,
	// truncate, fallocate, copy_file_range), so each one is checked and
	// counted against the size it really starts from.
	mu sync.Mutex

	// perm is the mode's permission bits as last read from the backing
	// object: what the kernel would have checked from its attribute
	// cache, and what access checks on this directory use.
	perm atomic.Uint32

	// listed is set when the mount served the directory's listing to its
	// end, which the kernel may then keep, and cleared when the follower
	// drops what the kernel holds of the node: while it is set an opendir
	// needs no backing open (OpendirHandle).
	listed atomic.Bool

	// made is what the mount knows of the directory it made (newdir.go):
	// the names made in it since, nil when it knows nothing.
	made atomic.Pointer[madeNames]

	// locks is the POSIX locks held through the mount on this file, nil
	// until its first (lock.go).
	locks atomic.Pointer[nodeLocks]

	// reader is the node's file kept open for reading (reader.go), nil
	// when there is none.
	reader atomic.Pointer[keptReader]

	// stamp is what the file looked like at its last open, nil until
	// then and after the follower dropped its pages (cache.go).
	stamp atomic.Pointer[pageStamp]
	// attr is what the mount last told the kernel of the node's own
	// object, for an open that reads another (cache.go) and a stat that
	// races its replace (Getattr).
	attr atomic.Pointer[fuse.Attr]
	// held is what the opens of this file keep counted in the quota
	// (unnamed.go); guarded by mu.
	held held
	// fresh is the open of the create that just made the file here,
	// empty, until the first change of its size or its release (sizeNow);
	// guarded by mu.
	fresh *handle
}

var (
	_ = (fs.NodeLookuper)((*node)(nil))
	_ = (fs.NodeGetattrer)((*node)(nil))
	_ = (fs.NodeSetattrer)((*node)(nil))
	_ = (fs.NodeOpener)((*node)(nil))
	_ = (fs.NodeCreater)((*node)(nil))
	_ = (fs.NodeMkdirer)((*node)(nil))
	_ = (fs.NodeMknoder)((*node)(nil))
	_ = (fs.NodeSymlinker)((*node)(nil))
	_ = (fs.NodeLinker)((*node)(nil))
	_ = (fs.NodeReadlinker)((*node)(nil))
	_ = (fs.NodeUnlinker)((*node)(nil))
	_ = (fs.NodeRmdirer)((*node)(nil))
	_ = (fs.NodeRenamer)((*node)(nil))
	_ = (fs.NodeOpendirHandler)((*node)(nil))
	_ = (fs.NodeStatfser)((*node)(nil))
	_ = (fs.NodeCopyFileRanger)((*node)(nil))
	_ = (fs.NodeIoctler)((*node)(nil))
	_ = (fs.NodeAccesser)((*node)(nil))
)

// object describes the node for an access check, from what was last seen
// of it.
func (n *node) object() policy.Object {
	var st unix.Stat_t
	st.Mode = n.StableAttr().Mode | n.perm.Load()
	st.Nlink = 1
	return policy.ObjectOf(&st)
}

// checkDir asks whether the caller may have want on this directory (search
// it, or change its entries), as the kernel would have asked before
// sending the request; rel is the path of the entry the request names.
func (n *node) checkDir(ctx context.Context, rel string, want policy.Access) error {
	dir, _ := policy.Split(rel)
	return n.fsys.access(ctx, dir, n.object(), want)
}

// relPath returns the node's cleaned path inside the scope ("." for the
// root), or false for a node that is no longer in the tree. It is on the
// path of nearly every request, so it makes one allocation at most.
func (n *node) relPath() (string, bool) {
	in := n.EmbeddedInode()
	root := in.Root()
	var buf [16]string
	names := buf[:0]
	size := -1
	for in != root {
		name, parent := in.Parent()
		if parent == nil {
			return "", false
		}
		names = append(names, name)
		size += len(name) + 1
		in = parent
	}
	switch len(names) {
	case 0:
		return ".", true
	case 1:
		return names[0], true
	}
	var b strings.Builder
	b.Grow(size)
	for i := len(names) - 1; i >= 0; i-- {
		b.WriteString(names[i])
		if i > 0 {
			b.WriteByte('/')
		}
	}
	return b.String(), true
}

// childRel returns the path of a new or existing entry name in this
// directory, refusing a name the tools could not address.
func (n *node) childRel(name string) (string, error) {
	dir, ok := n.relPath()
	if !ok {
		return "", policy.Errorf(policy.NotFound, "the directory was removed")
	}
	if dir == "." && n.fsys.probingName(name) {
		// loomfs's own file, under a name no door may use.
		return name, nil
	}
	if err := policy.CheckName(dir, name, n.fsys.pol.MainScope); err != nil {
		return policy.Join(dir, "?"), err
	}
	return policy.Join(dir, name), nil
}

// stat describes what the node's path holds now. It answers ESTALE when
// that is another object than the node's (replaced by rename, or removed),
// so the kernel looks the path up again.
func (n *node) stat() (unix.Statx_t, syscall.Errno) {
	f := n.fsys
	rel, ok := n.relPath()
	if !ok {
		return unix.Statx_t{}, syscall.ESTALE
	}
	if rel == "." {
		sx, err := statAt(f.ws.DirFD(), "")
		if err != nil {
			return sx, policy.Errno(err)
		}
		return sx, 0
	}
	if sx, ok := n.statKept(); ok {
		return sx, 0
	}
	parent, name, err := f.ws.Parent(rel)
	if err != nil {
		if policy.CodeOf(err) == policy.NotFound {
			return unix.Statx_t{}, syscall.ESTALE
		}
		return unix.Statx_t{}, policy.Errno(err)
	}
	defer parent.Close()
	sx, err := statAt(int(parent.Fd()), name)
	if err == unix.ENOENT || err == nil && !sameObject(n.StableAttr(), &sx) {
		return sx, syscall.ESTALE
	}
	if err != nil {
		return sx, policy.Errno(err)
	}
	return sx, 0
}

// child makes the node for an entry described by sx.
func (n *node) child(ctx context.Context, rel string, sx *unix.Statx_t, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	f := n.fsys
	if err := f.crossMount(rel, sx); err != nil {
		return nil, policy.Errno(err)
	}
	f.fillAttr(sx, &out.Attr)
	f.setEntry(sx, out)
	n.madeEntryAt(rel)
	in := n.NewInode(ctx, &node{fsys: f}, stableAttr(sx))
	c := in.Operations().(*node)
	c.perm.Store(uint32(sx.Mode) & 0o7777)
	c.told(&out.Attr)
	return in, 0
}

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	f := n.fsys
	if n == f.root && name == policy.ReadyFile {
		return n.lookupReady(ctx, out)
	}
	rel, err := n.childRel(name)
	if err != nil {
		return nil, lookupRefused(err)
	}
	err = n.checkDir(ctx, rel, policy.MayExec)
	if err == nil {
		err = f.admit(policy.OpStat, rel)
	}
	if err != nil {
		return nil, f.refused(ctx, f.event(ctx, "lookup", rel), err)
	}
	if n.knownAbsent(name) {
		f.absentLookups.Add(1)
		return nil, syscall.ENOENT
	}
	parent, base, err := n.parentOf(rel)
	if err != nil {
		return nil, policy.Errno(err)
	}
	defer parent.Close()
	sx, err := statAt(int(parent.Fd()), base)
	if err != nil {
		return nil, policy.Errno(err)
	}
	if err := f.lookFIFO(ctx, rel, &sx); err != nil {
		return nil, f.refused(ctx, f.event(ctx, "lookup", rel), err)
	}
	return n.child(ctx, rel, &sx, out)
}

// lookupRefused answers the lookup of a name the tools can't address:
// ENAMETOOLONG for one over the bounds, as any filesystem answers; any
// other, loomfs's own among them, is simply not there.
func lookupRefused(err error) syscall.Errno {
	if policy.CodeOf(err) == policy.NameTooLong {
		return policy.Errno(err)
	}
	return syscall.ENOENT
}

// lookFIFO refuses to show a FIFO to a caller who may not open it. The
// kernel opens a FIFO itself, as a pipe of its own, without asking the
// daemon: without default_permissions nothing else would stop the open,
// which then waits for a writer. Root still sees it for what it is.
func (f *fsys) lookFIFO(ctx context.Context, rel string, sx *unix.Statx_t) error {
	if sx.Mode&unix.S_IFMT != unix.S_IFIFO {
		return nil
	}
	return f.access(ctx, rel, objectOf(sx), policy.MayRead)
}

func (n *node) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	f := n.fsys
	rel, inTree := n.relPath()
	// Only another user is refused here, one who could not have looked the
	// node up: stat needs no permission on the object itself.
	if err := f.access(ctx, rel, n.object(), 0); err != nil {
		return f.refused(ctx, f.event(ctx, "stat", rel), err)
	}
	if h := handleOf(fh); h != nil && h.foreign {
		if a := n.attr.Load(); a != nil {
			// The open reads the file that replaced the node's: the
			// kernel's attributes stay those of the node's own.
			out.Attr = *a
			out.SetTimeout(f.timeout)
			return 0
		}
	}
	var sx unix.Statx_t
	if fd := openFD(fh); fd >= 0 {
		var err error
		if sx, err = statAt(fd, ""); err != nil {
			return policy.Errno(err)
		}
	} else {
		if inTree {
			if err := f.admit(policy.OpStat, rel); err != nil {
				return policy.Errno(err)
			}
		}
		// A stat that races a replace may see the object as it was, as
		// on a local disk: a node replaced or removed through the mount
		// since the kernel looked it up is answered as the mount last
		// described it, with no link left, and so is the kernel's retry
		// after ESTALE (the node it just looked up) when the name was
		// replaced again meanwhile.
		told := n.attr.Load()
		if !inTree && told != nil {
			out.Attr = *told
			out.Nlink = 0
			out.SetTimeout(f.timeout)
			return 0
		}
		var e syscall.Errno
		if sx, e = n.stat(); e == syscall.ESTALE {
			if e = f.staleRead(ctx); e == syscall.ENOENT && told != nil {
				out.Attr = *told
				out.SetTimeout(f.timeout)
				return 0
			}
			return e
		} else if e != 0 {
			return e
		}
		// Not a served read (f.readServed): under default_permissions
		// this GETATTR may be the kernel's permission check inside the
		// retry of an open answered ESTALE, whose OPEN is still to come
		// and must find that retry remembered (stale.go).
	}
	n.perm.Store(uint32(sx.Mode) & 0o7777)
	f.fillAttr(&sx, &out.Attr)
	n.told(&out.Attr)
	out.SetTimeout(f.timeout)
	return 0
}

// Access answers access(2) and chdir(2), which the kernel asks the daemon
// about when the mount has no default_permissions. Like the kernel's own
// check it answers from what was last seen of the object, without a trip
// to the backing store. It is a question, not an operation, so a "no" is
// not recorded.
func (n *node) Access(ctx context.Context, mask uint32) syscall.Errno {
	rel, ok := n.relPath()
	if !ok {
		return syscall.ENOENT
	}
	return policy.Errno(n.fsys.access(ctx, rel, n.object(), policy.Access(mask&7)))
}

// Readlink answers the target of an emulated link. With links refused
// by the policy, or not followed by this mount, a link is shown but not
// followed, as a symlink planted in the backing store is.
func (n *node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	f := n.fsys
	rel, ok := n.relPath()
	if !ok {
		return nil, syscall.ENOENT
	}
	ev := f.event(ctx, "readlink", rel)
	switch {
	case !f.pol.EmulatesLinks():
		return nil, f.refused(ctx, ev, policy.Errorf(policy.SymlinkRefused, "%s is a symbolic link; the policy refuses symbolic links (symlinks: refuse), so it is not followed", rel))
	case f.opts.NoFollowLinks:
		return nil, f.refused(ctx, ev, policy.Errorf(policy.SymlinkRefused, "%s is a symbolic link; this mount does not follow links", rel))
	}
	// A target is what the link holds: reading it is a read, refused in
	// a write-only subtree as reading a file is.
	if err := f.admit(policy.OpRead, rel); err != nil {
		return nil, f.refused(ctx, ev, err)
	}
	target, info, err := f.ws.ReadLink(rel)
	switch code := policy.CodeOf(err); {
	case code == policy.NotFound, code == policy.InvalidInput:
		// Gone, or (the kernel reads only links) no longer a link: the
		// path was replaced since the kernel looked it up.
		return nil, f.staleRead(ctx)
	case err != nil && refusal(err):
		return nil, f.refused(ctx, ev, err)
	case err != nil:
		return nil, policy.Errno(err)
	case info.Stat.Ino != n.StableAttr().Ino:
		return nil, f.staleRead(ctx)
	}
	f.readServed(ctx)
	return []byte(target), 0
}

// Symlink makes an emulated link (store.Workspace.PlaceLink): the backing
// store gets a marked regular file holding target, never a symlink.
func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	f := n.fsys
	rel, err := n.childRel(name)
	ev := f.event(ctx, "symlink", rel)
	if err == nil {
		err = f.pol.CheckSymlink(rel, target)
	}
	if err == nil {
		err = n.checkDir(ctx, rel, policy.MayWrite|policy.MayExec)
	}
	if err == nil {
		err = f.admit(policy.OpCreate, rel)
	}
	if err != nil {
		return nil, f.refused(ctx, ev, err)
	}
	detail(&ev, "target", target)
	parent, base, err := n.parentOf(rel)
	if err != nil {
		return nil, f.failed(ctx, ev, err)
	}
	defer parent.Close()
	size := int64(len(target))
	if err := f.reserve(ctx, rel, size, 1); err != nil {
		return nil, f.refused(ctx, ev, err)
	}
	if e := f.begin(ctx, ev); e != 0 {
		f.ws.AdjustAt(rel, -size, -1)
		return nil, e
	}
	if _, err := f.ws.PlaceLink(parent.Dir, base, rel, target); err != nil {
		f.ws.AdjustAt(rel, -size, -1)
		return nil, f.failed(ctx, ev, err)
	}
	f.ws.NoteChangeBy(rel, false, f.by(store.OpSymlink, rel))
	sx, err := statAt(int(parent.Fd()), base)
	if err != nil {
		return nil, policy.Errno(err)
	}
	return n.child(ctx, rel, &sx, out)
}

func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	f := n.fsys
	if t, ok := target.(*node); ok {
		// An O_TMPFILE file is given its name (linkat from /proc/self/fd).
		if in, handled, e := n.linkUnnamed(ctx, t, name, out); handled {
			return in, e
		}
	}
	rel, err := n.childRel(name)
	if err == nil {
		err = policy.CheckLink(rel)
	}
	return nil, f.refused(ctx, f.event(ctx, "link", rel), err)
}

func (n *node) refuseCreate(ctx context.Context, op, name string, kind policy.Kind) syscall.Errno {
	f := n.fsys
	rel, err := n.childRel(name)
	if err == nil {
		err = policy.CheckCreateKind(rel, kind)
	}
	return f.refused(ctx, f.event(ctx, op, rel), err)
}

func (n *node) Mknod(ctx context.Context, name string, mode uint32, dev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	var kind policy.Kind
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		child, h, _, e := n.create(ctx, "mknod", name, unix.O_WRONLY, mode, out)
		if h != nil {
			h.close()
		}
		return child, e
	case unix.S_IFIFO:
		kind = policy.KindFIFO
	case unix.S_IFSOCK:
		kind = policy.KindSocket
	default:
		kind = policy.KindDevice
	}
	return nil, n.refuseCreate(ctx, "mknod", name, kind)
}

func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	child, h, fuseFlags, e := n.create(ctx, "create", name, flags, mode, out)
	if e != 0 {
		return nil, nil, 0, e
	}
	return child, h.fileHandle(), fuseFlags, 0
}

// create makes the regular file name with the owner bits of mode
// (policy.OwnerPerm), and opens it with flags.
func (n *node) create(ctx context.Context, op, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, *handle, uint32, syscall.Errno) {
	f := n.fsys
	rel, err := n.childRel(name)
	ev := f.event(ctx, op, rel)
	if err == nil {
		err = n.checkDir(ctx, rel, policy.MayWrite|policy.MayExec)
	}
	if err != nil {
		return nil, nil, 0, f.refused(ctx, ev, err)
	}
	if err := f.admit(policy.OpCreate, rel); err != nil {
		return nil, nil, 0, f.refused(ctx, ev, err)
	}
	acc := int(flags) & unix.O_ACCMODE
	if acc != unix.O_WRONLY {
		if err := f.pol.Check(policy.OpRead, rel); err != nil {
			return nil, nil, 0, f.refused(ctx, ev, err)
		}
	}
	parent, base, err := n.parentOf(rel)
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
	fd, err := unix.Openat(int(parent.Fd()), base, acc|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, perm)
	if err != nil {
		f.ws.AdjustAt(rel, 0, -1)
		if err == unix.EEXIST && flags&unix.O_EXCL == 0 {
			// Created by someone else since the kernel looked: open
			// what is there, as an open without O_CREAT would.
			f.failed(ctx, ev, err)
			return n.openExisting(ctx, rel, parent, base, flags, out)
		}
		return nil, nil, 0, f.failed(ctx, ev, err)
	}
	// A writable handle puts the new file in the change journal as an
	// open; otherwise (a read-only create, a failure below) it goes in
	// now.
	noted := false
	defer func() {
		if !noted {
			f.ws.NoteChangeBy(rel, false, f.by(store.OpCreate, rel))
		}
	}()
	sx, err := f.setPerm(fd, perm)
	if err != nil {
		unix.Close(fd)
		return nil, nil, 0, f.failed(ctx, ev, err)
	}
	child, e := n.child(ctx, rel, &sx, out)
	if e != 0 {
		unix.Close(fd)
		return nil, nil, 0, e
	}
	c := child.Operations().(*node)
	h, fuseFlags := newHandle(c, fd, rel, flags, true, false)
	c.mu.Lock()
	c.fresh = h
	c.mu.Unlock()
	noted = h.writable
	return child, h, fuseFlags, 0
}

// setPerm gives the object just created as fd the permissions perm, which
// the umask may have narrowed or a setgid parent widened, and describes
// it. The mode is looked at first: it is almost always right already.
func (f *fsys) setPerm(fd int, perm uint32) (unix.Statx_t, error) {
	sx, err := f.statChanged(fd)
	if err != nil || uint32(sx.Mode)&0o7777 == perm {
		return sx, err
	}
	if err := unix.Fchmod(fd, perm); err != nil {
		return sx, err
	}
	return f.statChanged(fd)
}

// openExisting opens the entry base of parent that a create found already
// there.
func (n *node) openExisting(ctx context.Context, rel string, parent parentDir, base string, flags uint32, out *fuse.EntryOut) (*fs.Inode, *handle, uint32, syscall.Errno) {
	sx, err := statAt(int(parent.Fd()), base)
	if err != nil {
		return nil, nil, 0, policy.Errno(err)
	}
	child, e := n.child(ctx, rel, &sx, out)
	if e != 0 {
		return nil, nil, 0, e
	}
	h, fuseFlags, e := child.Operations().(*node).open(ctx, rel, flags&^unix.O_CREAT)
	if e != 0 {
		return nil, nil, 0, e
	}
	return child, h, fuseFlags, 0
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	f := n.fsys
	rel, err := n.childRel(name)
	ev := f.event(ctx, "mkdir", rel)
	if err == nil {
		err = n.checkDir(ctx, rel, policy.MayWrite|policy.MayExec)
	}
	if err != nil {
		return nil, f.refused(ctx, ev, err)
	}
	if err := f.admit(policy.OpCreate, rel); err != nil {
		return nil, f.refused(ctx, ev, err)
	}
	parent, base, err := n.parentOf(rel)
	if err != nil {
		return nil, f.failed(ctx, ev, err)
	}
	defer parent.Close()
	if err := f.reserve(ctx, rel, 0, 1); err != nil {
		return nil, f.refused(ctx, ev, err)
	}
	if e := f.begin(ctx, ev); e != 0 {
		f.ws.AdjustAt(rel, 0, -1)
		return nil, e
	}
	pfd := int(parent.Fd())
	perm := policy.OwnerPerm(mode)
	drops := f.drops.Load()
	if err := unix.Mkdirat(pfd, base, perm); err != nil {
		f.ws.AdjustAt(rel, 0, -1)
		return nil, f.failed(ctx, ev, err)
	}
	fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, f.failed(ctx, ev, err)
	}
	sx, err := f.setPerm(fd, perm)
	f.ws.NoteChangeBy(rel, false, f.by(store.OpMkdir, rel))
	if err != nil {
		unix.Close(fd)
		return nil, f.failed(ctx, ev, err)
	}
	in, e := n.child(ctx, rel, &sx, out)
	if e != 0 {
		unix.Close(fd)
		return nil, e
	}
	f.madeDir(in.Operations().(*node), drops, fd)
	return in, 0
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	return n.remove(ctx, "unlink", name, false)
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	return n.remove(ctx, "rmdir", name, true)
}

// remove deletes the entry name: a file (unlink) or an empty directory
// (rmdir), never anything that may not be touched.
func (n *node) remove(ctx context.Context, op, name string, dir bool) syscall.Errno {
	f := n.fsys
	rel, err := n.childRel(name)
	ev := f.event(ctx, op, rel)
	if err == nil {
		err = n.checkDir(ctx, rel, policy.MayWrite|policy.MayExec)
	}
	if err != nil {
		return f.refused(ctx, ev, err)
	}
	err = f.admit(policy.OpDelete, rel)
	if err == nil {
		err = f.pol.CheckConfirmable(policy.OpDelete, rel)
	}
	if err != nil {
		return f.refused(ctx, ev, err)
	}
	parent, base, err := n.parentOf(rel)
	if err != nil {
		return f.failed(ctx, ev, err)
	}
	defer parent.Close()
	pfd := int(parent.Fd())
	sx, err := statAt(pfd, base)
	if err != nil {
		return f.failed(ctx, ev, err)
	}
	obj := objectOf(&sx)
	switch {
	case dir && obj.Kind != policy.KindDir:
		return f.failed(ctx, ev, unix.ENOTDIR)
	case !dir && obj.Kind == policy.KindDir:
		return f.failed(ctx, ev, unix.EISDIR)
	}
	if err := policy.CheckObject(policy.OpDelete, rel, obj); err != nil {
		return f.refused(ctx, ev, err)
	}
	ev.Bytes = obj.Size
	if e := f.begin(ctx, ev); e != 0 {
		return e
	}
	flags := 0
	if dir {
		flags = unix.AT_REMOVEDIR
	}
	// A file still open keeps its space until its last release.
	done := n.removing(base, &sx, rel)
	if err := unix.Unlinkat(pfd, base, flags); err != nil {
		done(false)
		return f.failed(ctx, ev, err)
	}
	held := done(true)
	f.ws.NoteChangeBy(rel, false, f.by(store.OpDelete, rel))
	switch {
	case dir:
		f.ws.AdjustAt(rel, 0, -1)
	case !held:
		f.ws.AdjustAt(rel, -obj.Size, -1)
	}
	return 0
}

func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	f := n.fsys
	np, ok := newParent.(*node)
	if !ok {
		return syscall.EXDEV
	}
	oldRel, err := n.childRel(name)
	newRel, nerr := np.childRel(newName)
	ev := f.event(ctx, "rename", oldRel)
	ev.NewPath = newRel
	if flags != 0 {
		detail(&ev, "flags", flags)
	}
	if err == nil {
		err = nerr
	}
	if err == nil {
		err = n.checkDir(ctx, oldRel, policy.MayWrite|policy.MayExec)
	}
	if err == nil && np != n {
		err = np.checkDir(ctx, newRel, policy.MayWrite|policy.MayExec)
	}
	if err == nil {
		err = checkRenameFlags(flags)
	}
	if err == nil {
		err = f.admit(policy.OpRename, oldRel)
	}
	if err == nil {
		err = f.admit(policy.OpRename, newRel)
	}
	exchange := flags&unix.RENAME_EXCHANGE != 0
	if err == nil {
		err = f.pol.CheckMove(oldRel, newRel, exchange)
	}
	if err == nil {
		// Moving a file away deletes it from its place; a subtree may ask
		// for a confirmation this door can't give.
		err = f.pol.CheckConfirmable(policy.OpDelete, oldRel)
	}
	if err == nil && exchange {
		err = f.pol.CheckConfirmable(policy.OpDelete, newRel)
	}
	if err != nil {
		return f.refused(ctx, ev, err)
	}

	oldDir, oldBase, err := n.parentOf(oldRel)
	if err != nil {
		return f.failed(ctx, ev, err)
	}
	defer oldDir.Close()
	newDir, newBase, err := np.parentOf(newRel)
	if err != nil {
		return f.failed(ctx, ev, err)
	}
	defer newDir.Close()

	src, err := statAt(int(oldDir.Fd()), oldBase)
	if err != nil {
		return f.failed(ctx, ev, err)
	}
	err = policy.CheckObject(policy.OpRename, oldRel, objectOf(&src))
	if err == nil && np != n && src.Mode&unix.S_IFMT == unix.S_IFDIR {
		// A directory moved to another parent has its ".." rewritten.
		err = f.access(ctx, oldRel, objectOf(&src), policy.MayWrite)
	}
	if err != nil {
		return f.refused(ctx, ev, err)
	}
	dst, err := statAt(int(newDir.Fd()), newBase)
	replaced := err == nil
	switch {
	case replaced:
		// The object at the destination is replaced (or, exchanged, moved):
		// it must be one loomfs may change too, without confirmation.
		err := policy.CheckObject(policy.OpRename, newRel, objectOf(&dst))
		if err == nil {
			err = f.pol.CheckConfirmable(policy.OpWrite, newRel)
		}
		if err == nil && exchange {
			err = f.pol.CheckConfirmable(policy.OpWrite, oldRel)
		}
		if err != nil {
			return f.refused(ctx, ev, err)
		}
		if flags&unix.RENAME_NOREPLACE != 0 {
			return f.failed(ctx, ev, unix.EEXIST)
		}
	case err != unix.ENOENT || exchange:
		return f.failed(ctx, ev, err)
	}

	// Capped subtrees (tmp/) count what moves in and out of them.
	undo, err := n.reserveMove(ctx, oldRel, newRel, &src, &dst, replaced && exchange)
	if err != nil {
		if refusal(err) || policy.CodeOf(err) == policy.QuotaExceeded {
			return f.refused(ctx, ev, err)
		}
		return f.failed(ctx, ev, err)
	}
	if e := f.begin(ctx, ev); e != 0 {
		undo()
		return e
	}
	// A file replaced while still open keeps its space until its last
	// release.
	done := func(bool) bool { return false }
	if replaced && !exchange && dst.Ino != src.Ino {
		done = np.removing(newBase, &dst, newRel)
	}
	np.madeEntry(newBase)
	if err := unix.Renameat2(int(oldDir.Fd()), oldBase, int(newDir.Fd()), newBase, uint(flags)); err != nil {
		done(false)
		undo()
		return f.failed(ctx, ev, err)
	}
	held := done(true)
	// A directory moves with everything in it.
	subtree := src.Mode&unix.S_IFMT == unix.S_IFDIR || replaced && dst.Mode&unix.S_IFMT == unix.S_IFDIR
	moved := f.by(store.OpRename, oldRel)
	moved.To = newRel
	f.ws.NoteChangeBy(oldRel, subtree, moved)
	moved.To, moved.From = "", oldRel
	f.ws.NoteChangeBy(newRel, subtree, moved)
	if replaced && !exchange && dst.Ino != src.Ino && !held {
		obj := objectOf(&dst)
		if obj.Kind == policy.KindRegular || obj.Kind == policy.KindLink {
			f.ws.AdjustAt(newRel, -obj.Size, -1)
		} else {
			f.ws.AdjustAt(newRel, 0, -1)
		}
	}
	return 0
}

// reserveMove checks and counts, in the capped subtrees of the policy,
// the move of src from oldRel to newRel and, for an exchange, of dst the
// other way. It returns how to take the counts back.
func (n *node) reserveMove(ctx context.Context, oldRel, newRel string, src, dst *unix.Statx_t, exchange bool) (undo func(), err error) {
	f := n.fsys
	undo = func() {}
	if len(f.pol.Caps(oldRel)) == 0 && len(f.pol.Caps(newRel)) == 0 {
		return undo, nil
	}
	usageOf := func(rel string, sx *unix.Statx_t) (policy.Usage, error) {
		if sx.Mode&unix.S_IFMT == unix.S_IFDIR {
			return f.ws.SubtreeUsage(ctx, rel)
		}
		return policy.Usage{Bytes: int64(sx.Size), Files: 1}, nil
	}
	su, err := usageOf(oldRel, src)
	if err != nil {
		return undo, err
	}
	if err := f.ws.ReserveMove(ctx, oldRel, newRel, su.Bytes, su.Files); err != nil {
		return undo, err
	}
	// An undo gives back what was counted; the request's end must not cut
	// it short.
	back := context.WithoutCancel(ctx)
	undo = func() { f.ws.ReserveMove(back, newRel, oldRel, su.Bytes, su.Files) }
	if !exchange {
		return undo, nil
	}
	du, err := usageOf(newRel, dst)
	if err == nil {
		err = f.ws.ReserveMove(ctx, newRel, oldRel, du.Bytes, du.Files)
	}
	if err != nil {
		undo()
		return func() {}, err
	}
	return func() {
		f.ws.ReserveMove(back, oldRel, newRel, du.Bytes, du.Files)
		f.ws.ReserveMove(back, newRel, oldRel, su.Bytes, su.Files)
	}, nil
}

func checkRenameFlags(flags uint32) error {
	if flags&unix.RENAME_WHITEOUT != 0 {
		return policy.Errorf(policy.Unsupported, "rename with RENAME_WHITEOUT is refused: it creates a device node")
	}
	if flags&^uint32(unix.RENAME_NOREPLACE|unix.RENAME_EXCHANGE) != 0 {
		return policy.Errorf(policy.InvalidInput, "unknown rename flags %#x", flags)
	}
	return nil
}

func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	f := n.fsys
	var st unix.Statfs_t
	if err := unix.Fstatfs(f.ws.DirFD(), &st); err != nil {
		return policy.Errno(err)
	}
	out.Blocks, out.Bfree, out.Bavail = st.Blocks, st.Bfree, st.Bavail
	out.Files, out.Ffree = st.Files, st.Ffree
	out.Bsize, out.Frsize = uint32(st.Bsize), uint32(st.Frsize)
	out.NameLen = policy.MaxNameBytes
	// Show the scope's quota where it is the tighter bound, so df in the
	// sandbox tells the agent what it really has.
	lim := f.pol.Limits
	if lim.ScopeBytes <= 0 && lim.ScopeFiles <= 0 {
		return 0
	}
	used, err := f.ws.Usage(ctx)
	if err != nil {
		return 0
	}
	if bs := int64(st.Bsize); lim.ScopeBytes > 0 && bs > 0 {
		total := uint64(lim.ScopeBytes / bs)
		free := uint64(max(lim.ScopeBytes-used.Bytes, 0) / bs)
		if total < out.Blocks {
			out.Blocks = total
		}
		out.Bfree, out.Bavail = min(out.Bfree, free), min(out.Bavail, free)
	}
	if lim.ScopeFiles > 0 {
		out.Files = min(out.Files, uint64(lim.ScopeFiles))
		out.Ffree = min(out.Ffree, uint64(max(lim.ScopeFiles-used.Files, 0)))
	}
	return 0
}

// Ioctl refuses every ioctl: they would reach the backing file with
// arguments loomfs can't check. Terminal queries (isatty on every open
// by some runtimes) are answered without a record.
func (n *node) Ioctl(ctx context.Context, fh fs.FileHandle, cmd uint32, arg uint64, input []byte, output []byte) (int32, syscall.Errno) {
	if cmd>>8&0xff != 'T' {
		f := n.fsys
		rel, _ := n.relPath()
		ev := f.event(ctx, "ioctl", rel)
		detail(&ev, "cmd", cmd)
		f.refused(ctx, ev, policy.Errorf(policy.Unsupported, "ioctl %#x refused", cmd))
	}
	return 0, policy.Errno(syscall.ENOTTY)
}
