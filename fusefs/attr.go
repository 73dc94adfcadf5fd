package fusefs

import (
	"context"
	"sync"
	"syscall"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// Setattr serves chmod, truncate and utimes, on an open file (fchmod,
// ftruncate) or on the node's path. Ownership is fixed: the mount shows
// every object as the sandbox user's.
func (n *node) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	f := n.fsys
	h := handleOf(fh)
	rel, inTree := n.relPath()
	// fchmod and futimens on a file that was unlinked while open come
	// without the file: they change it through one of its opens.
	unlinked := -1
	switch {
	case !inTree && h == nil:
		fd, openRel, ok := n.dupOpen()
		if !ok {
			return syscall.ENOENT
		}
		defer unix.Close(fd)
		unlinked, rel = fd, openRel
	case !inTree:
		rel = h.rel
	}
	mode, setMode := in.GetMode()
	size, setSize := in.GetSize()
	uid, setUID := in.GetUID()
	gid, setGID := in.GetGID()
	setTimes := in.Valid&(fuse.FATTR_ATIME|fuse.FATTR_MTIME) != 0

	ev := f.event(ctx, "setattr", rel)
	if setMode {
		detail(&ev, "mode", mode)
	}
	if setSize {
		ev.Op = "truncate"
		ev.Bytes = int64(size)
	}
	if setTimes {
		detail(&ev, "times", true)
	}

	// Ask the policy first, before touching anything. Only the owner
	// (or root) changes attributes, as the kernel would require.
	if err := f.access(ctx, rel, n.object(), 0); err != nil {
		return f.refused(ctx, ev, err)
	}
	// Setting the owner already shown is a no-op (cp -p, install, tar,
	// rsync -a and shutil.copy2 do it); any other owner is refused.
	if setUID && uid != f.uid || setGID && gid != f.gid {
		return f.refused(ctx, ev, policy.CheckChown(rel))
	}
	if setMode {
		if n.StableAttr().Mode == unix.S_IFLNK {
			// As on Linux's own filesystems: a symlink's mode can't be
			// changed. Here it would also take the link's marker away.
			return f.refused(ctx, ev, policy.Errorf(policy.Unsupported, "%s is a symbolic link; its mode can't be changed", rel))
		}
		if err := policy.CheckChmod(rel, mode); err != nil {
			return f.refused(ctx, ev, err)
		}
	}
	op := policy.OpSetattr
	if setSize {
		op = policy.OpWrite
		if int64(size) < 0 {
			return policy.Errno(syscall.EINVAL)
		}
		// Truncating a file by name changes an existing file: a subtree
		// may ask for confirmation, which this door can't give. Through
		// an open file it was asked when the file was opened.
		if h == nil {
			if err := f.pol.CheckConfirmable(policy.OpWrite, rel); err != nil {
				return f.refused(ctx, ev, err)
			}
		}
	}
	if !setMode && !setSize && !setTimes {
		// Nothing to change (the owner shown, ctime, kill-suid): describe
		// the file.
		if unlinked >= 0 {
			return n.describe(unlinked, false, out)
		}
		return n.Getattr(ctx, fh, out)
	}
	var err error
	if inTree {
		err = f.admit(op, rel)
	} else {
		err = f.writable()
	}
	if err != nil {
		return f.refused(ctx, ev, err)
	}

	// The object: the open file, or the node's path opened and checked by
	// the store (and found to still be this node's object). A mode or
	// times need no open file: an O_PATH fd saves the store's checks
	// before an open, and its fcntls.
	fd := -1
	pathFD := false
	if h != nil {
		fd = h.fd
	} else if unlinked >= 0 {
		fd = unlinked
	} else if ofd, done, ok := n.ownOpen(setSize); ok {
		// The file is open in this mount (tar, cp -p and install set the
		// times and mode of the file they are writing, by futimens and
		// fchmod, which come without the open): change it through that
		// open, which pins the node's own object and was checked when it
		// was opened, as ftruncate is. That saves resolving the path again,
		// an O_PATH open and a statx: three round trips to a shared
		// filesystem's server per file.
		defer done()
		fd = ofd
	} else if !setSize && pathChanges() {
		pfd, sx, err := f.ws.OpenPath(op, rel)
		if err != nil {
			return f.openFailed(ctx, ev, err)
		}
		defer unix.Close(pfd)
		if !sameObject(n.StableAttr(), &sx) {
			return syscall.ESTALE
		}
		fd, pathFD = pfd, true
	} else {
		flags := unix.O_RDONLY
		if setSize {
			flags = unix.O_WRONLY
		}
		file, _, err := f.ws.Open(op, rel, flags)
		if err != nil {
			return f.openFailed(ctx, ev, err)
		}
		defer file.Close()
		fd = int(file.Fd())
		sx, err := statAt(fd, "")
		if err != nil {
			return policy.Errno(err)
		}
		if !sameObject(n.StableAttr(), &sx) {
			return syscall.ESTALE
		}
		if setSize {
			// truncate(2) by name needs write permission; ftruncate(2)
			// was granted it when the file was opened.
			if err := f.access(ctx, rel, objectOf(&sx), policy.MayWrite); err != nil {
				return f.refused(ctx, ev, err)
			}
		}
	}

	if setSize {
		if e := n.truncate(ctx, ev, fd, h, rel, int64(size)); e != 0 {
			return e
		}
	} else if e := f.begin(ctx, ev); e != 0 {
		return e
	}
	defer f.ws.NoteChangeBy(rel, false, f.by(store.OpSetattr, rel))
	if setMode {
		if err := fchmod(fd, policy.OwnerPerm(mode), pathFD); err != nil {
			return f.failed(ctx, ev, err)
		}
		if n.IsDir() && f.pol.KernelOpensDirs() {
			// The listing the kernel keeps is served without asking
			// here (openlessDirs): drop it, so the next read of the
			// directory is checked against its new permission bits.
			n.NotifyContent(0, 0)
		}
	}
	if setTimes {
		if err := futimens(fd, in, pathFD); err != nil {
			return f.failed(ctx, ev, err)
		}
	}
	return n.describe(fd, true, out)
}

// ownOpen returns, for a change of mode or times (not size: truncate(2)
// by name asks for write permission on the object), the fd of an open of
// the node's own file in this mount, kept open until done is called.
func (n *node) ownOpen(setSize bool) (fd int, done func(), ok bool) {
	if setSize || n.StableAttr().Mode != unix.S_IFREG {
		return -1, nil, false
	}
	return n.openFD()
}

// describe answers with the attributes of the node's file, open as fd;
// changed says they were just changed through fd (fsys.statChanged).
func (n *node) describe(fd int, changed bool, out *fuse.AttrOut) syscall.Errno {
	var sx unix.Statx_t
	var err error
	if changed {
		sx, err = n.fsys.statChanged(fd)
	} else {
		sx, err = statAt(fd, "")
	}
	if err != nil {
		return policy.Errno(err)
	}
	n.perm.Store(uint32(sx.Mode) & 0o7777)
	n.fsys.fillAttr(&sx, &out.Attr)
	n.told(&out.Attr)
	out.SetTimeout(n.fsys.timeout)
	return 0
}

// dupOpen returns a duplicate of the fd of one open of the node's file,
// which the caller closes, and the path it was opened at. It is asked only
// for a node that left the tree, so walking every open file is rare. The
// fd is duplicated first and the open looked for again after: a handle
// still open then was not closed yet when its fd was duplicated (close
// drops it from fsys.open before closing the fd), so the duplicate is that
// file and not a reused fd number.
func (n *node) dupOpen() (fd int, rel string, ok bool) {
	f := n.fsys
	var found *handle
	f.open.Range(func(k, _ any) bool {
		if h := k.(*handle); h.node == n {
			found = h
			return false
		}
		return true
	})
	if found == nil {
		return -1, "", false
	}
	fd, err := unix.FcntlInt(uintptr(found.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, "", false
	}
	if _, open := f.open.Load(found); !open {
		unix.Close(fd)
		return -1, "", false
	}
	return fd, found.rel, true
}

// openFailed answers an open of a node's own path that failed: ESTALE
// when the path is gone or holds a link now (the kernel then looks it up
// again), a recorded refusal, or the error.
func (f *fsys) openFailed(ctx context.Context, ev audit.Event, err error) syscall.Errno {
	switch policy.CodeOf(err) {
	case policy.NotFound:
		return syscall.ESTALE
	case policy.SymlinkRefused:
		// The node is a file or a directory (the kernel opens no link),
		// but its path holds a link now: replaced by rename. Looked up
		// again, the link is followed, or refused, as a link.
		return syscall.ESTALE
	}
	if refusal(err) {
		return f.refused(ctx, ev, err)
	}
	return policy.Errno(err)
}

// truncate sets the size of the file open as fd: growth is checked against
// the per-file limit and reserved in the scope quota before the change is
// recorded and made.
func (n *node) truncate(ctx context.Context, ev audit.Event, fd int, via *handle, rel string, size int64) syscall.Errno {
	f := n.fsys
	n.mu.Lock()
	defer n.mu.Unlock()
	st, err := n.sizeNow(fd, via)
	if err != nil {
		return policy.Errno(err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return policy.Errno(policy.Errorf(policy.IsDir, "%s is not a regular file", rel))
	}
	delta := size - st.Size
	if delta > 0 {
		if err := f.grow(ctx, rel, size, delta); err != nil {
			return f.refused(ctx, ev, err)
		}
	}
	if e := f.begin(ctx, ev); e != 0 {
		if delta > 0 {
			f.ws.AdjustAt(rel, -delta, 0)
		}
		return e
	}
	if err := unix.Ftruncate(fd, size); err != nil {
		if delta > 0 {
			f.ws.AdjustAt(rel, -delta, 0)
		}
		return f.failed(ctx, ev, err)
	}
	if delta < 0 {
		f.ws.AdjustAt(rel, delta, 0)
	}
	n.resized(&st, rel, delta)
	return 0
}

// pathChanges reports whether the kernel changes a mode and times through
// an O_PATH fd: fchmodat2 (Linux 6.6) and utimensat with AT_EMPTY_PATH.
// It asks once, with arguments that change nothing: flags fchmodat2
// refuses (EINVAL, not ENOSYS), and an fd utimensat can't use (EBADF,
// not EINVAL for the flag).
var pathChanges = sync.OnceValue(func() bool {
	_, _, e := unix.Syscall6(unix.SYS_FCHMODAT2, ^uintptr(0), uintptr(unsafe.Pointer(&emptyPath[0])), 0, ^uintptr(0), 0, 0)
	if e != unix.EINVAL {
		return false
	}
	_, _, e = unix.Syscall6(unix.SYS_UTIMENSAT, ^uintptr(0), uintptr(unsafe.Pointer(&emptyPath[0])), 0, unix.AT_EMPTY_PATH, 0, 0)
	return e == unix.EBADF
})

// emptyPath is the "" of the *at calls made on an fd itself.
var emptyPath = [1]byte{}

// fchmod sets the permission bits of fd, an O_PATH fd if pathFD.
func fchmod(fd int, mode uint32, pathFD bool) error {
	if !pathFD {
		return unix.Fchmod(fd, mode)
	}
	_, _, e := unix.Syscall6(unix.SYS_FCHMODAT2, uintptr(fd), uintptr(unsafe.Pointer(&emptyPath[0])), uintptr(mode), unix.AT_EMPTY_PATH, 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

// futimens sets the times in asks for on fd: utimensat with a NULL path,
// or with an empty one and AT_EMPTY_PATH for an O_PATH fd.
func futimens(fd int, in *fuse.SetAttrIn, pathFD bool) error {
	ts := [2]unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_OMIT}}
	if in.Valid&fuse.FATTR_ATIME != 0 {
		if in.Valid&fuse.FATTR_ATIME_NOW != 0 {
			ts[0] = unix.Timespec{Nsec: unix.UTIME_NOW}
		} else {
			ts[0] = unix.Timespec{Sec: int64(in.Atime), Nsec: int64(in.Atimensec)}
		}
	}
	if in.Valid&fuse.FATTR_MTIME != 0 {
		if in.Valid&fuse.FATTR_MTIME_NOW != 0 {
			ts[1] = unix.Timespec{Nsec: unix.UTIME_NOW}
		} else {
			ts[1] = unix.Timespec{Sec: int64(in.Mtime), Nsec: int64(in.Mtimensec)}
		}
	}
	var path unsafe.Pointer
	flags := 0
	if pathFD {
		path, flags = unsafe.Pointer(&emptyPath[0]), unix.AT_EMPTY_PATH
	}
	_, _, e := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(fd), uintptr(path), uintptr(unsafe.Pointer(&ts[0])), uintptr(flags), 0, 0)
	if e != 0 {
		return e
	}
	return nil
}
