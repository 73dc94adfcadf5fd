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
// opened, and a snapshot of the entries the policy lets the mount show,
// taken at the first read and again after a rewind.
//
// The backing directory is opened at the first request that needs it (a
// read, a READDIRPLUS lookup, an fsync), not at OPENDIR: the kernel keeps
// a directory's listing (FOPEN_CACHE_DIR) and answers a warm opendir and
// readdir from it, so the open would be a path resolution, a statx and a
// close per opendir that nothing reads from (find and git status open
// every directory of the tree).
type dirHandle struct {
	node *node
	rel  string

	mu      sync.Mutex
	file    *os.File // nil until opened (backing)
	fd      int      // -1 until then
	entries []fuse.DirEntry
	loaded  bool
	pos     int
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
// follower has dropped what the kernel held of it (node.listed).
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

// load reads the whole directory, keeping the entries the tools could
// address and the policy lists: never loomfs's own files or hidden paths.
// Nor are the files loomfs places at the top itself (fsys.placedHere).
func (d *dirHandle) load(ctx context.Context) syscall.Errno {
	if e := d.backing(ctx); e != 0 {
		return e
	}
	f := d.node.fsys
	if rel, ok := d.node.relPath(); ok {
		d.rel = rel // renamed since it was opened
	}
	if _, err := unix.Seek(d.fd, 0, 0); err != nil {
		return policy.Errno(err)
	}
	d.entries = d.entries[:0]
	buf := make([]byte, 32<<10)
	for {
		n, err := unix.Getdents(d.fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return policy.Errno(err)
		}
		if n == 0 {
			break
		}
		for b := buf[:n]; len(b) > 0; {
			var de fuse.DirEntry
			b = b[de.Parse(b):]
			if de.Name != "." && de.Name != ".." {
				if policy.CheckName(d.rel, de.Name, f.pol.MainScope) != nil || !f.pol.Listed(policy.Join(d.rel, de.Name)) {
					continue
				}
				if d.node == f.root && f.placedHere(de.Name) {
					continue
				}
			}
			de.Off = uint64(len(d.entries) + 1)
			d.entries = append(d.entries, de)
		}
	}
	d.loaded = true
	d.node.listed.Store(true)
	return 0
}

func (d *dirHandle) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.loaded {
		if e := d.load(ctx); e != 0 {
			return nil, e
		}
	}
	if d.pos >= len(d.entries) {
		return nil, 0
	}
	de := d.entries[d.pos]
	d.pos++
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
	return &de, 0
}

func (d *dirHandle) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	d.mu.Lock()
	defer d.mu.Unlock()
	if off == 0 {
		// A rewind sees the directory as it is now.
		d.loaded = false
	}
	d.pos = int(off)
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
