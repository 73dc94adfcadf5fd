package fusefs

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// handle is one open regular file: the backing fd the store opened and
// checked, and what the release record summarises. Size-changing calls go
// through its node's lock and the scope's usage counter.
type handle struct {
	node *node
	// fd is the backing file, held bare (no *os.File: one per open(2)
	// served would add an fcntl and a cleanup to each).
	fd int
	// shared is the node's kept reader when fd is its descriptor, shared
	// with the node and its other read-only opens (reader.go); nil when
	// fd is the handle's own.
	shared *keptReader
	// flockFD is the open file description of its own that a handle
	// sharing a kept reader takes flock locks on, opened at its first;
	// 0 until then. Guarded by fdMu.
	flockFD  int
	rel      string // path when opened, for records
	flags    uint32
	writable bool
	// passthrough: the kernel reads this file from the backing fd itself.
	passthrough bool
	// foreign: the node's path held another file when it was opened,
	// which this open reads (fsys.readsCurrent).
	foreign bool
	// keptPages: the kernel kept the file's pages from an earlier open
	// (FOPEN_KEEP_CACHE), so reads it answers from them never come here.
	keptPages bool
	// throttleWaits and throttled count the waits for the scope's I/O
	// limits and their nanoseconds (throttle.go).
	throttleWaits, throttled atomic.Int64
	// noflush: the kernel sends no FLUSH at close(2) (see lock.go).
	noflush bool
	// fdMu keeps fd open while a request on the node, not on this open,
	// uses it (node.openFD); close takes it to close the fd.
	fdMu    sync.RWMutex
	opened  time.Time
	read    atomic.Int64
	written atomic.Int64
	// change is the open in the change journal, for a writable open: the
	// journal covers every write until the release ends it.
	change *store.Open
}

var (
	_ = (fs.FileReader)((*handle)(nil))
	_ = (fs.FileWriter)((*handle)(nil))
	_ = (fs.FileWritever)((*handle)(nil))
	_ = (fs.FileFsyncer)((*handle)(nil))
	_ = (fs.FileReleaser)((*handle)(nil))
	_ = (fs.FileLseeker)((*handle)(nil))
	_ = (fs.FileAllocater)((*handle)(nil))
)

// passthroughHandle is a file opened read-only on a passthrough mount: the
// kernel reads it from the backing file. go-fuse registers the first one's
// fd as the node's backing file.
type passthroughHandle struct{ *handle }

var _ = (fs.FilePassthroughFder)(passthroughHandle{})

func (p passthroughHandle) PassthroughFd() (int, bool) { return p.fd, true }

// directHandle is a file opened for writing on a passthrough mount. It has
// the node's backing file too (the kernel requires every open of a node
// that has one to use it, and go-fuse counts a backing reference for every
// open of such a node), but it is answered FOPEN_DIRECT_IO, which overrides
// passthrough for read(2) and write(2): every write comes to the daemon.
type directHandle struct{ *handle }

var _ = (fs.FilePassthroughFder)(directHandle{})

func (d directHandle) PassthroughFd() (int, bool) { return d.fd, true }

func handleOf(fh fs.FileHandle) *handle {
	switch h := fh.(type) {
	case *handle:
		return h
	case passthroughHandle:
		return h.handle
	case directHandle:
		return h.handle
	}
	return nil
}

// newHandle wraps an opened backing file, fd, which the handle now owns,
// and returns the FOPEN flags to answer with. foreign: fd is not the
// node's own file (fsys.readsCurrent).
func newHandle(n *node, fd int, rel string, flags uint32, created, foreign bool) (*handle, uint32) {
	return newSharedHandle(n, fd, nil, rel, flags, created, foreign)
}

// newSharedHandle is newHandle for a handle that shares fd, the kept
// reader shared, when shared is not nil (reader.go).
func newSharedHandle(n *node, fd int, shared *keptReader, rel string, flags uint32, created, foreign bool) (*handle, uint32) {
	h := &handle{
		node:     n,
		fd:       fd,
		shared:   shared,
		rel:      rel,
		flags:    flags,
		writable: int(flags)&unix.O_ACCMODE != unix.O_RDONLY || flags&unix.O_TRUNC != 0,
		foreign:  foreign,
		opened:   time.Now(),
	}
	if h.writable {
		// The open's line says create for a file it made; the line of
		// its end says write, for the change feed.
		by := n.fsys.by(store.OpWrite, rel)
		if created {
			by.Op = store.OpCreate
		}
		h.change = n.fsys.ws.NoteOpenBy(h.path, by)
	}
	n.opened(h)
	n.fsys.open.Store(h, struct{}{})
	// The kernel need not send FLUSH at each close(2) (writes are noted
	// from the open to the release), and it would cost a round trip per
	// file closed; only a file that has held POSIX locks needs it, to
	// release the closing owner's locks.
	var fuseFlags uint32
	if n.locks.Load() == nil {
		fuseFlags = fuse.FOPEN_NOFLUSH
		h.noflush = true
	}
	if n.fsys.opts.Passthrough {
		if h.writable {
			// Every write(2) must reach the checks below.
			fuseFlags |= fuse.FOPEN_DIRECT_IO
		} else {
			h.passthrough = true
		}
	}
	return h, fuseFlags
}

func (h *handle) fileHandle() fs.FileHandle {
	switch {
	case !h.node.fsys.opts.Passthrough:
		return h
	case h.passthrough:
		return passthroughHandle{h}
	}
	return directHandle{h}
}

// close closes the backing file; a handle closed here is no longer open
// for the unmount's summary either.
func (h *handle) close() {
	h.node.fsys.open.Delete(h)
	h.node.closing(h)
	h.fdMu.Lock()
	defer h.fdMu.Unlock()
	if h.shared == nil {
		unix.Close(h.fd)
		return
	}
	h.shared.release()
	if h.flockFD > 0 {
		unix.Close(h.flockFD)
	}
}

// flockOn returns the descriptor the handle's flock locks are taken on:
// its own fd, or, for a handle that shares its node's kept reader, an
// open file description of its own of the same file, opened at the first
// flock (a flock belongs to the description, which other opens must not
// share).
func (h *handle) flockOn() (int, error) {
	if h.shared == nil {
		return h.fd, nil
	}
	h.fdMu.Lock()
	defer h.fdMu.Unlock()
	if h.flockFD == 0 {
		fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(h.fd), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, err
		}
		h.flockFD = fd
	}
	return h.flockFD, nil
}

// path is where the file is now, or where it was opened if it was removed.
func (h *handle) path() string {
	if rel, ok := h.node.relPath(); ok {
		return rel
	}
	return h.rel
}

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	rel, ok := n.relPath()
	if !ok {
		// The node left the tree: most often its name was looked up again
		// after a replace by rename and now leads to the new file's node.
		// ESTALE makes the kernel look the path up again and open that.
		return nil, 0, n.fsys.staleOpen(ctx, flags)
	}
	h, fuseFlags, e := n.open(ctx, rel, flags)
	if e != 0 {
		return nil, 0, e
	}
	if readOnly(flags) {
		n.fsys.readServed(ctx)
	}
	return h.fileHandle(), fuseFlags, 0
}

// readOnly reports whether an open with flags only reads.
func readOnly(flags uint32) bool {
	return int(flags)&unix.O_ACCMODE == unix.O_RDONLY && flags&unix.O_TRUNC == 0
}

// staleOpen answers an open whose node's path holds another object now:
// ESTALE, or to the retry of a read, ENOENT (stale.go).
func (f *fsys) staleOpen(ctx context.Context, flags uint32) syscall.Errno {
	if readOnly(flags) {
		return f.staleRead(ctx)
	}
	return syscall.ESTALE
}

// open opens the node's file at rel: read access is asked of the policy as
// OpRead, write access (or O_TRUNC) as OpWrite, the store opens and checks
// the object, and an open for writing is recorded before it is granted.
func (n *node) open(ctx context.Context, rel string, flags uint32) (*handle, uint32, syscall.Errno) {
	f := n.fsys
	ev := f.event(ctx, "open", rel)
	acc := int(flags) & unix.O_ACCMODE
	write := !readOnly(flags)
	op := policy.OpRead
	if acc != unix.O_WRONLY {
		if err := f.admit(policy.OpRead, rel); err != nil {
			return nil, 0, f.refused(ctx, ev, err)
		}
	}
	var want policy.Access
	switch {
	case flags&fuse.FMODE_EXEC != 0:
		// execve(2) opens the file to run it, which asks for x, not r.
		want = policy.MayExec
	case acc != unix.O_WRONLY:
		want = policy.MayRead
	}
	if write {
		want |= policy.MayWrite
		// The node's file is opened for writing: its next reads open
		// it again (reader.go).
		n.dropReader()
	} else if h, fuseFlags, e, ok := n.openKept(ctx, ev, rel, flags, want); ok {
		return h, fuseFlags, e
	}
	if write {
		op = policy.OpWrite
		err := f.admit(policy.OpWrite, rel)
		if err == nil {
			// Opening an existing file for writing changes it: a
			// subtree may ask for a confirmation this door can't give.
			err = f.pol.CheckConfirmable(policy.OpWrite, rel)
		}
		if err != nil {
			return nil, 0, f.refused(ctx, ev, err)
		}
	}
	// The daemon reads and writes at the offsets the kernel gives, so
	// O_APPEND is the kernel's business; O_TRUNC comes as a setattr.
	bflags := acc | int(flags)&(unix.O_SYNC|unix.O_DSYNC)
	if write && acc == unix.O_RDONLY {
		bflags = unix.O_RDWR // O_RDONLY|O_TRUNC: the truncate needs a writable fd
	}
	o, err := f.ws.OpenFD(op, rel, bflags)
	if err != nil {
		e := f.openFailed(ctx, ev, err)
		if e == syscall.ESTALE {
			e = f.staleOpen(ctx, flags)
		}
		return nil, 0, e
	}
	fd, sx := o.FD, o.Statx
	current := sameObject(n.StableAttr(), &sx)
	if !current && !f.readsCurrent(n, &sx, flags) {
		// The path holds another file than this node's: make the kernel
		// look it up again.
		unix.Close(fd)
		return nil, 0, f.staleOpen(ctx, flags)
	}
	n.perm.Store(uint32(sx.Mode) & 0o7777)
	if err := f.access(ctx, rel, objectOf(&sx), want); err != nil {
		unix.Close(fd)
		return nil, 0, f.refused(ctx, ev, err)
	}
	if write {
		detail(&ev, "flags", flags)
		if e := f.begin(ctx, ev); e != 0 {
			unix.Close(fd)
			return nil, 0, e
		}
	}
	var shared *keptReader
	if current && !write && o.Info.Kind == policy.KindRegular {
		shared = f.readers.keep(n, fd)
	}
	h, fuseFlags := newSharedHandle(n, fd, shared, rel, flags, false, !current)
	if !current {
		// Every read(2) comes here, to the file opened, whatever the
		// kernel still believes of the node's size and pages.
		fuseFlags |= fuse.FOPEN_DIRECT_IO
	} else {
		keep := n.keepCache(&sx, flags)
		h.keptPages = keep != 0
		fuseFlags |= keep
	}
	if flags&unix.O_TRUNC != 0 {
		if err := n.resize(ctx, h.fd, rel, 0, func() error { return unix.Ftruncate(h.fd, 0) }); err != nil {
			h.close()
			return nil, 0, policy.Errno(err)
		}
	}
	return h, fuseFlags, 0
}

// readsCurrent reports whether an open of node n whose path now holds
// another regular file, sx (a replace by rename, as the tool door's atomic
// writes do), may read that file instead of answering ESTALE. The kernel
// retries an open that got ESTALE only once, so a reader racing a stream
// of replaces would otherwise see "Stale file handle" now and then. Only
// plain reads qualify: the kernel appends and maps pages by what it knows
// of the node (execve maps the file), and passthrough binds one backing
// file to the node.
func (f *fsys) readsCurrent(n *node, sx *unix.Statx_t, flags uint32) bool {
	return readOnly(flags) && flags&fuse.FMODE_EXEC == 0 &&
		!f.opts.Passthrough &&
		n.StableAttr().Mode == unix.S_IFREG &&
		sx.Mode&unix.S_IFMT == unix.S_IFREG
}

func (h *handle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	h.throttle(ctx, len(dest))
	h.node.fsys.daemonReads.Add(1)
	n := 0
	for n < len(dest) {
		k, err := unix.Pread(h.fd, dest[n:], off+int64(n))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			if n > 0 {
				break
			}
			return nil, policy.Errno(err)
		}
		if k == 0 {
			break
		}
		n += k
	}
	h.read.Add(int64(n))
	return fuse.ReadResultData(dest[:n]), 0
}

func (h *handle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	return h.write(ctx, [][]byte{data}, len(data), off)
}

func (h *handle) Writev(ctx context.Context, data [][]byte, off int64) (uint32, syscall.Errno) {
	size := 0
	for _, b := range data {
		size += len(b)
	}
	return h.write(ctx, data, size, off)
}

// write checks a write of size bytes at off against the per-file limit and
// the scope quota (counting the growth of the file's apparent size, so a
// write far past the end counts in full) and makes it.
func (h *handle) write(ctx context.Context, data [][]byte, size int, off int64) (uint32, syscall.Errno) {
	if taken := h.throttleWrite(ctx, size); taken < size {
		data, size = firstBytes(data, taken), taken
	}
	n := h.node
	f := n.fsys
	if err := f.writable(); err != nil {
		return 0, f.refused(ctx, f.event(ctx, "write", h.path()), err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	st, err := n.sizeNow(h.fd, h)
	if err != nil {
		return 0, policy.Errno(err)
	}
	end := off + int64(size)
	grow := end - st.Size
	rel := h.rel
	if grow > 0 {
		rel = h.path()
		if err := f.grow(ctx, rel, end, grow); err != nil {
			ev := f.event(ctx, "write", rel)
			ev.Bytes = int64(size)
			detail(&ev, "offset", off)
			return 0, f.refused(ctx, ev, err)
		}
	}
	var written int
	if len(data) == 1 {
		written, err = unix.Pwrite(h.fd, data[0], off)
	} else {
		written, err = unix.Pwritev(h.fd, data, off)
	}
	written = max(written, 0)
	if grow > 0 {
		got := max(off+int64(written)-st.Size, 0)
		if got != grow {
			f.ws.AdjustAt(rel, got-grow, 0)
		}
		n.resized(&st, rel, got)
	}
	h.written.Add(int64(written))
	if err != nil && written == 0 {
		return 0, policy.Errno(err)
	}
	return uint32(written), 0
}

// grow checks that the file at rel may grow to end bytes, by grow bytes,
// and reserves the growth in the usage the tools count too: the scope's
// and that of every capped subtree rel is in.
func (f *fsys) grow(ctx context.Context, rel string, end, grow int64) error {
	if err := f.pol.Limits.CheckFileSize(rel, end); err != nil {
		return err
	}
	return f.reserve(ctx, rel, grow, 0)
}

// sizeNow describes, for a change of its size through via (nil for none),
// the node's file open as fd: its size, type and links. n.mu is held. The
// first change through the open of the create that made the file here
// takes size 0 without asking (the fstat is a round trip per file on a
// shared filesystem, and tar writes each file once): another writer
// getting to a file that new in between could only make the growth
// counted larger than it is, never smaller, until the quota's reconcile.
func (n *node) sizeNow(fd int, via *handle) (unix.Stat_t, error) {
	var st unix.Stat_t
	fresh := via != nil && n.fresh == via
	n.fresh = nil
	if fresh {
		st.Mode, st.Nlink = unix.S_IFREG, 1
		return st, nil
	}
	err := unix.Fstat(fd, &st)
	return st, err
}

// resize sets the size of the file open as fd to size by apply, checking
// and counting growth first and counting shrinkage after. The caller has
// admitted the change.
func (n *node) resize(ctx context.Context, fd int, rel string, size int64, apply func() error) error {
	f := n.fsys
	n.mu.Lock()
	defer n.mu.Unlock()
	st, err := n.sizeNow(fd, nil)
	if err != nil {
		return policy.FromErrno(err, "truncate", rel)
	}
	delta := size - st.Size
	if delta > 0 {
		if err := f.grow(ctx, rel, size, delta); err != nil {
			return err
		}
	}
	if err := apply(); err != nil {
		if delta > 0 {
			f.ws.AdjustAt(rel, -delta, 0)
		}
		return policy.FromErrno(err, "truncate", rel)
	}
	if delta < 0 {
		f.ws.AdjustAt(rel, delta, 0)
	}
	n.resized(&st, rel, delta)
	return nil
}

func (h *handle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	var err error
	if flags&1 != 0 { // FUSE_FSYNC_FDATASYNC
		err = unix.Fdatasync(h.fd)
	} else {
		err = unix.Fsync(h.fd)
	}
	if err != nil {
		return policy.Errno(err)
	}
	return 0
}

func (h *handle) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	n, err := unix.Seek(h.fd, int64(off), int(whence))
	if err != nil {
		return 0, policy.Errno(err)
	}
	return uint64(n), 0
}

// Release closes the backing file and records what was read and written
// through it.
func (h *handle) Release(ctx context.Context) syscall.Errno {
	f := h.node.fsys
	f.releasing.Add(1)
	defer f.releasing.Add(-1)
	if _, ok := f.open.LoadAndDelete(h); ok {
		h.release(ctx, "")
	}
	return 0
}

// release closes the backing file and records what was read and written
// through this open. why says what ended it when the kernel did not (an
// unmount with the file still open).
func (h *handle) release(ctx context.Context, why string) {
	if nl := h.node.locks.Load(); nl != nil && h.noflush {
		nl.released(h)
	}
	h.close()
	h.node.fsys.ws.NoteClose(h.change)
	h.recordThrottle(ctx)
	read, written := h.read.Load(), h.written.Load()
	f := h.node.fsys
	if !h.writable && read == 0 && !h.passthrough && !h.keptPages {
		// An open that read nothing keeps no record; a traced call
		// still gets its span, from the open to now.
		f.traceUnrecorded(ctx, "open", h.path(), time.Since(h.opened))
		return
	}
	ev := f.event(ctx, "release", h.path())
	ev.Bytes = read + written
	ev.Duration = time.Since(h.opened)
	ev.Result = "ok"
	detail(&ev, "read", read)
	detail(&ev, "written", written)
	if h.passthrough {
		detail(&ev, "passthrough", true)
	}
	if h.keptPages {
		// Reads the kernel answered from pages it kept are not counted.
		detail(&ev, "kept_pages", true)
	}
	if why != "" {
		detail(&ev, "ended_by", why)
	}
	_ = f.sink.Record(ctx, ev)
}

// Fallocate modes loomfs serves. Space reserved past the end of a file
// (FALLOC_FL_KEEP_SIZE) is invisible to a quota on apparent size, so such a
// reservation is refused with EOPNOTSUPP (a program then writes instead)
// rather than granted short in silence; within the file it is served.
// Collapsing and inserting ranges never come here: the kernel's FUSE
// client answers them EOPNOTSUPP itself.
const allocModes = unix.FALLOC_FL_KEEP_SIZE | unix.FALLOC_FL_PUNCH_HOLE | unix.FALLOC_FL_ZERO_RANGE

func (h *handle) Allocate(ctx context.Context, off uint64, size uint64, mode uint32) syscall.Errno {
	n := h.node
	f := n.fsys
	ev := f.event(ctx, "fallocate", h.path())
	ev.Bytes = int64(size)
	detail(&ev, "offset", off)
	detail(&ev, "mode", mode)
	if mode&^allocModes != 0 || mode&unix.FALLOC_FL_PUNCH_HOLE != 0 && mode&unix.FALLOC_FL_KEEP_SIZE == 0 {
		return f.refused(ctx, ev, policy.Errorf(policy.Unsupported, "fallocate mode %#x is not supported", mode))
	}
	if err := f.writable(); err != nil {
		return f.refused(ctx, ev, err)
	}
	start, end := int64(off), int64(off+size)
	if start < 0 || end < start {
		return policy.Errno(syscall.EINVAL)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	st, err := n.sizeNow(h.fd, h)
	if err != nil {
		return policy.Errno(err)
	}
	if mode&unix.FALLOC_FL_KEEP_SIZE != 0 {
		if mode&unix.FALLOC_FL_PUNCH_HOLE == 0 && end > st.Size {
			return f.refused(ctx, ev, policy.Errorf(policy.Unsupported, "%s: fallocate can't reserve space past the end of a file (FALLOC_FL_KEEP_SIZE): the quota counts apparent size", ev.Path))
		}
		err := unix.Fallocate(h.fd, mode, start, end-start)
		return policy.Errno(err)
	}
	grow := end - st.Size
	if grow > 0 {
		if err := f.grow(ctx, ev.Path, end, grow); err != nil {
			return f.refused(ctx, ev, err)
		}
	}
	err = unix.Fallocate(h.fd, mode, start, end-start)
	if err != nil {
		if grow > 0 {
			f.ws.AdjustAt(ev.Path, -grow, 0)
		}
		return policy.Errno(err)
	}
	if grow > 0 {
		n.resized(&st, ev.Path, grow)
	}
	return 0
}

// CopyFileRange copies between two files open in the mount inside the
// backing store, under the same size and quota checks as a write.
func (n *node) CopyFileRange(ctx context.Context, fhIn fs.FileHandle, offIn uint64, out *fs.Inode, fhOut fs.FileHandle, offOut uint64, length uint64, flags uint64) (uint32, syscall.Errno) {
	in, dst := handleOf(fhIn), handleOf(fhOut)
	if in == nil || dst == nil || flags != 0 {
		return 0, policy.Errno(syscall.EINVAL)
	}
	on := dst.node
	f := on.fsys
	ev := f.event(ctx, "copy_file_range", dst.path())
	detail(&ev, "from", in.path())
	if err := f.writable(); err != nil {
		return 0, f.refused(ctx, ev, err)
	}
	on.mu.Lock()
	defer on.mu.Unlock()
	var src unix.Stat_t
	if err := unix.Fstat(in.fd, &src); err != nil {
		return 0, policy.Errno(err)
	}
	cur, err := on.sizeNow(dst.fd, dst)
	if err != nil {
		return 0, policy.Errno(err)
	}
	// What will really be copied: the source may end before length.
	size := min(int64(min(length, 1<<30)), max(src.Size-int64(offIn), 0))
	if size == 0 {
		return 0, 0
	}
	end := int64(offOut) + size
	grow := end - cur.Size
	if grow > 0 {
		ev.Bytes = size
		if err := f.grow(ctx, ev.Path, end, grow); err != nil {
			return 0, f.refused(ctx, ev, err)
		}
	}
	ri, wo := int64(offIn), int64(offOut)
	k, err := unix.CopyFileRange(in.fd, &ri, dst.fd, &wo, int(size), 0)
	k = max(k, 0)
	if grow > 0 {
		got := max(int64(offOut)+int64(k)-cur.Size, 0)
		if got != grow {
			f.ws.AdjustAt(ev.Path, got-grow, 0)
		}
		on.resized(&cur, ev.Path, got)
	}
	in.read.Add(int64(k))
	dst.written.Add(int64(k))
	if err != nil && k == 0 {
		return 0, policy.Errno(err)
	}
	return uint32(k), 0
}
