package fusefs

import (
	"context"
	"os"
	"sync"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
)

// dirHandle is one open directory: the backing directory fd the store
// opened, read a buffer at a time. Its entries carry the backing
// filesystem's own offsets (d_off), so a read that goes on where the last
// one stopped, in this handle or in a new one (openlessDirs), seeks the
// backing directory there: an entry unlinked or added between two reads
// moves no other entry, as rm -r of a large directory needs.
//
// The backing directory is opened at the first request that needs it (a
// read, a READDIRPLUS lookup, an fsync), not at OPENDIR, when the kernel
// holds the directory's listing (FOPEN_CACHE_DIR) and answers a warm
// readdir from it: the open would be a path resolution, a statx and a
// close per opendir that nothing reads from (find and git status open
// every directory of the tree).
type dirHandle struct {
	node *node
	rel  string

	mu   sync.Mutex
	file *os.File // nil until opened (backing)
	fd   int      // -1 until then
	buf  []byte   // a getdents buffer
	todo []byte   // what is left of it to hand out
	// seen is the regular file Readdirent last described, and seenSx
	// what statx said of it then.
	seen   string
	seenSx unix.Statx_t
}

var (
	_ = (fs.FileReaddirenter)((*dirHandle)(nil))
	_ = (fs.FileSeekdirer)((*dirHandle)(nil))
	_ = (fs.FileLookuper)((*dirHandle)(nil))
	_ = (fs.FileFsyncdirer)((*dirHandle)(nil))
	_ = (fs.FileReleasedirer)((*dirHandle)(nil))
)

// openFD returns the backing fd of an open file or directory, or -1 (a
// directory not read from yet).
func openFD(fh fs.FileHandle) int {
	if d, ok := fh.(*dirHandle); ok {
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.fd
	}
	if h := handleOf(fh); h != nil {
		return h.fd
	}
	return -1
}

// OpendirHandle opens the backing directory at once unless the kernel
// may hold the directory's listing: then it answers from the policy and
// what the node last saw of the directory (its permission bits), and the
// backing directory is opened if a request needs it (dirHandle.backing).
// A directory replaced behind the mount is thus still answered ESTALE at
// the opendir, which the kernel retries with a fresh lookup, once the
// follower has dropped what the kernel held of it (node.listed). Where
// the kernel opens directories itself (openlessDirs) this is called for
// each read it could not answer from a listing it holds.
func (n *node) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	f := n.fsys
	rel, ok := n.relPath()
	if !ok {
		return nil, 0, syscall.ENOENT
	}
	if err := f.admit(policy.OpList, rel); err != nil {
		return nil, 0, f.refused(ctx, f.event(ctx, "readdir", rel), err)
	}
	d := &dirHandle{node: n, fd: -1, rel: rel}
	cache := f.dirCache()
	if cache == 0 || !n.listed.Load() {
		d.mu.Lock()
		defer d.mu.Unlock()
		if e := d.backing(ctx); e != 0 {
			return nil, 0, e
		}
		return d, cache, 0
	}
	if err := f.access(ctx, rel, n.object(), policy.MayRead); err != nil {
		return nil, 0, f.refused(ctx, f.event(ctx, "readdir", rel), err)
	}
	return d, cache, 0
}

// backing opens the backing directory if it is not open yet: the node's
// own object, at its path now. d.mu is held.
func (d *dirHandle) backing(ctx context.Context) syscall.Errno {
	if d.fd >= 0 {
		return 0
	}
	n, f := d.node, d.node.fsys
	rel, ok := n.relPath()
	if !ok {
		return syscall.ENOENT
	}
	file, _, err := f.ws.Open(policy.OpList, rel, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		if policy.CodeOf(err) == policy.NotFound {
			return syscall.ESTALE
		}
		return policy.Errno(err)
	}
	fd := int(file.Fd())
	sx, err := statAt(fd, "")
	if err != nil {
		file.Close()
		return policy.Errno(err)
	}
	if !sameObject(n.StableAttr(), &sx) {
		file.Close()
		return syscall.ESTALE
	}
	n.perm.Store(uint32(sx.Mode) & 0o7777)
	if err := f.access(ctx, rel, objectOf(&sx), policy.MayRead); err != nil {
		file.Close()
		return f.refused(ctx, f.event(ctx, "readdir", rel), err)
	}
	d.file, d.fd, d.rel = file, fd, rel
	f.dirOpens.Add(1)
	return 0
}

// next returns the next backing entry the mount shows, nil at the end:
// never loomfs's own files or hidden paths, nor names the tools could not
// address, nor the files loomfs places at the top itself
// (fsys.placedHere). The end of the directory marks the node listed.
// d.mu is held.
func (d *dirHandle) next(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	f := d.node.fsys
	if e := d.backing(ctx); e != 0 {
		return nil, e
	}
	for {
		if len(d.todo) == 0 {
			if d.buf == nil {
				d.buf = make([]byte, 32<<10)
			}
			if rel, ok := d.node.relPath(); ok {
				d.rel = rel // renamed since it was opened
			}
			n, err := unix.Getdents(d.fd, d.buf)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return nil, policy.Errno(err)
			}
			if n == 0 {
				d.node.listed.Store(true)
				return nil, 0
			}
			d.todo = d.buf[:n]
		}
		var de fuse.DirEntry
		d.todo = d.todo[de.Parse(d.todo):]
		if de.Name != "." && de.Name != ".." {
			if policy.CheckName(d.rel, de.Name, f.pol.MainScope) != nil || !f.pol.Listed(policy.Join(d.rel, de.Name)) {
				continue
			}
			if d.node == f.root && f.placedHere(de.Name) {
				continue
			}
		}
		return &de, 0
	}
}

func (d *dirHandle) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	d.mu.Lock()
	defer d.mu.Unlock()
	de, e := d.next(ctx)
	if de == nil || e != 0 {
		return nil, e
	}
	if de.Mode == unix.S_IFREG {
		// An emulated link is a regular file on the backing store: readdir
		// gives it the DT_LNK lstat will show. A READDIRPLUS looks the
		// entry up next (Lookup), which takes this stat instead of its own.
		d.seen = ""
		if sx, err := statAt(d.fd, de.Name); err == nil {
			d.seen, d.seenSx = de.Name, sx
			if isLink(&sx) {
				de.Mode = unix.S_IFLNK
			}
		}
	}
	return de, 0
}

// Seekdir moves to a backing offset an entry carried (0: the start, which
// sees the directory as it is now).
func (d *dirHandle) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	d.mu.Lock()
	defer d.mu.Unlock()
	if e := d.backing(ctx); e != 0 {
		return e
	}
	if _, err := unix.Seek(d.fd, int64(off), 0); err != nil {
		return policy.Errno(err)
	}
	d.todo = nil
	return 0
}

// Lookup serves the lookups of READDIRPLUS from the open directory fd, so
// listing a directory costs one fstatat per entry and no path walk. An
// entry refused here is only left for a LOOKUP of its own, which records
// the refusal.
func (d *dirHandle) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	f := d.node.fsys
	d.mu.Lock()
	if e := d.backing(ctx); e != 0 {
		d.mu.Unlock()
		return nil, e
	}
	dir, fd := d.rel, d.fd
	sx, seen := d.seenSx, d.seen == name
	d.seen = ""
	d.mu.Unlock()
	rel := policy.Join(dir, name)
	if err := policy.CheckName(dir, name, f.pol.MainScope); err != nil {
		return nil, lookupRefused(err)
	}
	err := d.node.checkDir(ctx, rel, policy.MayExec)
	if err == nil {
		err = f.admit(policy.OpStat, rel)
	}
	if err != nil {
		return nil, policy.Errno(err)
	}
	if !seen {
		var err error
		if sx, err = statAt(fd, name); err != nil {
			return nil, policy.Errno(err)
		}
	}
	if err := f.lookFIFO(ctx, rel, &sx); err != nil {
		return nil, policy.Errno(err)
	}
	return d.node.child(ctx, rel, &sx, out)
}

func (d *dirHandle) Fsyncdir(ctx context.Context, flags uint32) syscall.Errno {
	d.mu.Lock()
	defer d.mu.Unlock()
	if e := d.backing(ctx); e != 0 {
		return e
	}
	if err := unix.Fsync(d.fd); err != nil {
		return policy.Errno(err)
	}
	return 0
}

func (d *dirHandle) Releasedir(ctx context.Context, flags uint32) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.file != nil {
		d.file.Close()
	}
}

// openlessDirs serves directories without OPENDIR under "cache:
// journal-dirs" (policy.CacheKernelDirs, the default). It answers the first OPENDIR
// ENOSYS, after which the kernel (Linux 5.1, FUSE 7.29, and later) opens
// directories itself, keeps
// each listing (FOPEN_CACHE_DIR and FOPEN_KEEP_CACHE, its default then)
// and sends neither OPENDIR nor RELEASEDIR again: a warm find or git
// status costs the daemon nothing per directory, where it cost two round
// trips. What the kernel can't answer from a listing it keeps comes as a
// READDIR, READDIRPLUS or FSYNCDIR with no handle (fh 0), served here
// through a handle of its own, opened and released around the request:
// OpendirHandle still checks the policy and the caller's permission for
// every read that reaches the backing directory, and the backing offsets
// the entries carry (dirHandle) let the next read go on where this one
// stopped.
//
// No opendir is refused here, since none comes here: the mount has
// default_permissions, so the kernel checks the owner bits at the open,
// and a directory its owner can't read fails there (EACCES), as a program
// that checks only the open (Python's os.fwalk) expects. Policy refusals
// (hidden names, path rules) are made at lookup, before any open. A
// listing the kernel keeps is given to every process that opens the
// directory without a check here, as an entry it keeps is to every process
// that walks through it; a chmod through the mount drops the listing
// (node.Setattr), so the next read is checked here too.
type openlessDirs struct {
	fuse.RawFileSystem
	f *fsys
	// server is the mount's, set before it serves: its INIT says whether
	// the kernel lets a filesystem go without OPENDIR.
	server *fuse.Server
}

// minorNoOpendir is the first FUSE protocol minor version in which the
// kernel takes ENOSYS from OPENDIR to mean "open directories yourself".
const minorNoOpendir = 29

func (o *openlessDirs) OpenDir(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	o.f.opendirs.Add(1)
	if o.server.KernelSettings().Minor >= minorNoOpendir {
		return fuse.ENOSYS
	}
	return o.RawFileSystem.OpenDir(cancel, in, out)
}

func (o *openlessDirs) ReadDir(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return o.withHandle(cancel, in.InHeader, &in.Fh, func() fuse.Status {
		return o.RawFileSystem.ReadDir(cancel, in, out)
	})
}

func (o *openlessDirs) ReadDirPlus(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return o.withHandle(cancel, in.InHeader, &in.Fh, func() fuse.Status {
		return o.RawFileSystem.ReadDirPlus(cancel, in, out)
	})
}

func (o *openlessDirs) FsyncDir(cancel <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	return o.withHandle(cancel, in.InHeader, &in.Fh, func() fuse.Status {
		return o.RawFileSystem.FsyncDir(cancel, in)
	})
}

// withHandle runs serve with *fh set to a handle of the directory opened
// for it when the kernel sent none, and releases that handle after.
func (o *openlessDirs) withHandle(cancel <-chan struct{}, h fuse.InHeader, fh *uint64, serve func() fuse.Status) fuse.Status {
	if *fh != 0 {
		return serve()
	}
	var opened fuse.OpenOut
	in := fuse.OpenIn{InHeader: h, Flags: unix.O_RDONLY | unix.O_DIRECTORY}
	if st := o.RawFileSystem.OpenDir(cancel, &in, &opened); st != fuse.OK {
		return st
	}
	*fh = opened.Fh
	defer func() {
		o.RawFileSystem.ReleaseDir(&fuse.ReleaseIn{InHeader: h, Fh: opened.Fh})
		*fh = 0
	}()
	return serve()
}
