package fusefs

import (
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// The kernel keeps what the mount told it for long (Options.CacheTimeout),
// failed lookups and directory listings included, and a file's pages from
// one open to the next, because the follower (follow.go) drops exactly
// what the change journals say another writer changed. The mount's own
// changes need nothing dropped: the kernel saw them happen.

// pageStamp is what a file looked like when the kernel last cached its
// pages: an open that finds it so keeps them (FOPEN_KEEP_CACHE).
type pageStamp struct {
	size         uint64
	mtime, ctime unix.StatxTimestamp
}

func stampOf(sx *unix.Statx_t) pageStamp {
	return pageStamp{size: sx.Size, mtime: sx.Mtime, ctime: sx.Ctime}
}

// keepCache answers the FOPEN flag for an open of n, which found its file
// as sx: a plain read keeps the pages the kernel holds when the file has
// not changed since they were read (a change through another door drops
// them at once, through the follower; one behind loomfs's back shows in
// the times). Every open leaves the stamp for the next.
func (n *node) keepCache(sx *unix.Statx_t, flags uint32) uint32 {
	if !n.fsys.coherent {
		return 0
	}
	now := stampOf(sx)
	old := n.stamp.Swap(&now)
	if old == nil || *old != now {
		return 0
	}
	if int(flags)&unix.O_ACCMODE != unix.O_RDONLY || flags&unix.O_TRUNC != 0 {
		return 0
	}
	return fuse.FOPEN_KEEP_CACHE
}

// dirCache answers the FOPEN flags for an open directory: listings are kept
// by the kernel (the follower drops a directory's listing when an entry in
// it changes elsewhere; the kernel drops it itself on a change made here).
func (f *fsys) dirCache() uint32 {
	if !f.coherent {
		return 0
	}
	return fuse.FOPEN_CACHE_DIR | fuse.FOPEN_KEEP_CACHE
}

// told keeps a the attributes just told the kernel of the node's object.
// An open that reads the file which replaced it (fsys.readsCurrent) is
// answered these on fstat: the kernel holds one size per node, and the
// other file's would cut short, or pad with zeros, the reads of an open
// of the node's own file going on at the same time.
func (n *node) told(a *fuse.Attr) {
	c := *a
	n.attr.Store(&c)
}
