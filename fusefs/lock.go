package fusefs

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/ofdlock"
	"github.com/agentloom/loomfs/policy"
)

// Locks are taken on the backing file, so they hold against every other
// user of it: another mount of the scope, another node, the tool door.
// flock(2) locks are taken on the handle's own fd. POSIX record locks
// belong to the kernel's lock owner (one per process, whatever fd it
// uses), which the backing file can't be told: each owner that holds
// locks on a file gets an open file description of its own on the backing
// file, and its locks are taken there as open file description locks.
// See the package doc.

var (
	_ = (fs.FileGetlker)((*handle)(nil))
	_ = (fs.FileSetlker)((*handle)(nil))
	_ = (fs.FileSetlkwer)((*handle)(nil))
	_ = (fs.FileFlusher)((*handle)(nil))
)

// nodeLocks is the POSIX locks held through this mount on one file.
type nodeLocks struct {
	fsys   *fsys
	mu     sync.Mutex
	owners map[uint64]*ownerLocks // lock owner → its locks
}

// ownerLocks is what one lock owner holds on one file.
type ownerLocks struct {
	fd  int    // its own open of the backing file, which holds the locks
	pid uint32 // the process that last took one, for F_GETLK
	// spans are the ranges held, so the fd is closed when none is left.
	spans []span
	// unflushed are the handles opened before the file was first locked
	// that it took locks through: the kernel sends no FLUSH when they
	// are closed, so their release drops the owner's locks.
	unflushed map[*handle]struct{}
}

// span is a byte range [start, end] held with a lock type.
type span struct {
	start, end uint64
	typ        uint32
}

// locksOf returns the node's lock table, made on first use. From then on
// the node's files are opened without FOPEN_NOFLUSH, so that the kernel
// tells each close(2) and its lock owner.
func (n *node) locksOf() *nodeLocks {
	if nl := n.locks.Load(); nl != nil {
		return nl
	}
	n.locks.CompareAndSwap(nil, &nodeLocks{fsys: n.fsys, owners: map[uint64]*ownerLocks{}})
	return n.locks.Load()
}

func (h *handle) Getlk(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32, out *fuse.FileLock) syscall.Errno {
	var fl syscall.Flock_t
	lk.ToFlockT(&fl)
	// Asked on the owner's own description, the kernel leaves out the
	// owner's own locks, as POSIX does; an owner with none asks on the
	// handle's fd, which holds no record lock.
	fd := h.fd
	nl := h.node.locks.Load()
	if nl != nil {
		nl.mu.Lock()
		defer nl.mu.Unlock()
		if o := nl.owners[owner]; o != nil {
			fd = o.fd
		}
	}
	if err := syscall.FcntlFlock(uintptr(fd), unix.F_OFD_GETLK, &fl); err != nil {
		return policy.Errno(err)
	}
	out.FromFlockT(&fl)
	out.Pid = holderPid(&fl)
	if nl != nil && fl.Type != unix.F_UNLCK && fl.Pid == -1 {
		// An open file description lock: if it is another owner's in
		// this mount, its process is known.
		for id, o := range nl.owners {
			if id != owner && o.holds(out.Start, out.End, out.Typ) {
				out.Pid = o.pid
				break
			}
		}
	}
	return 0
}

// holderPid is the pid F_GETLK reports for a conflicting lock the kernel
// described: a POSIX lock's process, or 0 for an open file description
// lock (which belongs to no process; the kernel answers -1).
func holderPid(fl *syscall.Flock_t) uint32 {
	if fl.Pid < 0 {
		return 0
	}
	return uint32(fl.Pid)
}

func (h *handle) Setlk(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32) syscall.Errno {
	return h.lock(ctx, owner, lk, flags, false)
}

func (h *handle) Setlkw(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32) syscall.Errno {
	return h.lock(ctx, owner, lk, flags, true)
}

// Flush is a close(2) of a file the kernel was asked to tell about: the
// closing lock owner's POSIX locks on the file are released, as POSIX
// says for closing any of the owner's fds.
func (h *handle) Flush(ctx context.Context) syscall.Errno {
	nl := h.node.locks.Load()
	if nl == nil {
		return 0
	}
	if owner, ok := h.node.fsys.flushOwner(ctx); ok {
		nl.mu.Lock()
		nl.drop(owner)
		nl.mu.Unlock()
	}
	return 0
}

// lock takes or releases a lock: flock(2) on the handle's fd for flock
// requests, the owner's POSIX lock for fcntl ones. A waiting lock is
// retried rather than blocked on, so an interrupted caller is answered
// EINTR at once.
func (h *handle) lock(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32, wait bool) syscall.Errno {
	try := func() error {
		if flags&fuse.FUSE_LK_FLOCK != 0 {
			return h.flock(lk.Typ)
		}
		if lk.Typ == unix.F_UNLCK && h.node.locks.Load() == nil {
			return nil // nothing was ever locked here
		}
		return h.node.locksOf().set(h, owner, lk)
	}
	var err error
	if wait {
		err = ofdlock.Poll(ctx, lockBackoff, try)
	} else {
		err = try()
	}
	switch {
	case err == nil:
		return 0
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return syscall.EINTR
	case errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EACCES):
		return syscall.EAGAIN
	}
	return policy.Errno(err)
}

// lockBackoff paces a waiting lock's tries: a millisecond after the
// first, doubling up to 50 ms.
var lockBackoff = ofdlock.Backoff{First: time.Millisecond, Most: 50 * time.Millisecond}

func (h *handle) flock(typ uint32) error {
	var op int
	switch typ {
	case syscall.F_RDLCK:
		op = unix.LOCK_SH | unix.LOCK_NB
	case syscall.F_WRLCK:
		op = unix.LOCK_EX | unix.LOCK_NB
	case syscall.F_UNLCK:
		op = unix.LOCK_UN
	default:
		return unix.EINVAL
	}
	fd, err := h.flockOn()
	if err != nil {
		return err
	}
	return unix.Flock(fd, op)
}

// set takes or releases owner's lock lk, on the owner's description of
// the backing file, opened for the first lock and closed when the owner
// holds none.
func (nl *nodeLocks) set(h *handle, owner uint64, lk *fuse.FileLock) error {
	nl.mu.Lock()
	defer nl.mu.Unlock()
	o := nl.owners[owner]
	if o == nil {
		if lk.Typ == unix.F_UNLCK {
			return nil
		}
		fd, err := reopen(h.fd)
		if err != nil {
			return err
		}
		o = &ownerLocks{fd: fd}
		if len(nl.owners) == 0 {
			nl.fsys.locked.Store(nl, struct{}{})
		}
		nl.owners[owner] = o
	}
	var fl syscall.Flock_t
	lk.ToFlockT(&fl)
	err := syscall.FcntlFlock(uintptr(o.fd), unix.F_OFD_SETLK, &fl)
	if err == nil {
		o.spans = setSpan(o.spans, lk.Start, lk.End, lk.Typ)
		if lk.Typ != unix.F_UNLCK {
			o.pid = lk.Pid
			if h.noflush {
				if o.unflushed == nil {
					o.unflushed = map[*handle]struct{}{}
				}
				o.unflushed[h] = struct{}{}
			}
		}
	}
	if len(o.spans) == 0 {
		nl.drop(owner)
	}
	return err
}

// drop releases every lock owner holds on the file by closing its
// description. The caller holds nl.mu.
func (nl *nodeLocks) drop(owner uint64) {
	o := nl.owners[owner]
	if o == nil {
		return
	}
	unix.Close(o.fd)
	delete(nl.owners, owner)
	if len(nl.owners) == 0 {
		nl.fsys.locked.Delete(nl)
	}
}

// released drops the locks taken through h, a handle the kernel opened
// without FLUSH, now that its open file description is gone.
func (nl *nodeLocks) released(h *handle) {
	nl.mu.Lock()
	defer nl.mu.Unlock()
	for id, o := range nl.owners {
		if _, ok := o.unflushed[h]; ok {
			nl.drop(id)
		}
	}
}

// dropAll releases every lock held through the mount on the file.
func (nl *nodeLocks) dropAll() {
	nl.mu.Lock()
	defer nl.mu.Unlock()
	for id := range nl.owners {
		nl.drop(id)
	}
}

// reopen opens a new open file description of the file open as fd:
// through the process's own fd table, never by a path in the store. It is
// read-write where the daemon may, since one owner may take read and write
// locks through different fds (the kernel checks each against the
// caller's fd).
func reopen(fd int) (int, error) {
	p := "/proc/self/fd/" + strconv.Itoa(fd)
	nfd, err := unix.Open(p, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err == nil {
		return nfd, nil
	}
	acc, ferr := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if ferr != nil {
		return -1, err
	}
	return unix.Open(p, acc&unix.O_ACCMODE|unix.O_CLOEXEC, 0)
}

// holds reports whether the owner holds [start, end] with type typ, in
// part.
func (o *ownerLocks) holds(start, end uint64, typ uint32) bool {
	for _, s := range o.spans {
		if s.start <= end && start <= s.end && s.typ == typ {
			return true
		}
	}
	return false
}

// setSpan returns spans with [start, end] set to typ (F_UNLCK: not held),
// splitting the ranges it cuts.
func setSpan(spans []span, start, end uint64, typ uint32) []span {
	out := make([]span, 0, len(spans)+1)
	for _, s := range spans {
		if s.end < start || s.start > end {
			out = append(out, s)
			continue
		}
		if s.start < start {
			out = append(out, span{s.start, start - 1, s.typ})
		}
		if s.end > end {
			out = append(out, span{end + 1, s.end, s.typ})
		}
	}
	if typ != unix.F_UNLCK {
		out = append(out, span{start, end, typ})
	}
	return out
}

// flushOwners tells the handles' Flush the lock owner closing the file,
// which go-fuse's bridge does not pass on: it keeps each FLUSH's owner by
// the request's cancel channel, which the bridge hands the handle as
// fuse.Context.Cancel.
type flushOwners struct {
	fuse.RawFileSystem
	f *fsys
}

func (r flushOwners) Flush(cancel <-chan struct{}, in *fuse.FlushIn) fuse.Status {
	r.f.flushCount.Add(1)
	r.f.flushes.Store(cancel, in.LockOwner)
	defer r.f.flushes.Delete(cancel)
	return r.RawFileSystem.Flush(cancel, in)
}

// flushOwner returns the lock owner of the FLUSH being served in ctx.
func (f *fsys) flushOwner(ctx context.Context) (uint64, bool) {
	c, ok := ctx.(*fuse.Context)
	if !ok || c.Cancel == nil {
		return 0, false
	}
	v, ok := f.flushes.Load(c.Cancel)
	if !ok {
		return 0, false
	}
	return v.(uint64), true
}
