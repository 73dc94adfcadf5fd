package fusefs

import (
	"sync"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/store"
)

// The kernel keeps what the mount told it for long (Options.CacheTimeout),
// failed lookups and directory listings included, and a file's pages from
// one open to the next, because the follower (follow.go) drops exactly
// what the change journals say another writer changed. The mount's own
// changes need nothing dropped: the kernel saw them happen. So each line
// the mount writes to the journal is counted here first, and the follower
// skips as many lines of that path.

// selfNotes counts, per path, the journal lines of the mount's own changes
// the follower has not read yet.
type selfNotes struct {
	mu sync.Mutex
	m  map[selfKey]*selfCount
}

type selfKey struct {
	path    string
	subtree bool
}

type selfCount struct {
	n    int
	last time.Time
}

// selfExpiry is how long a count waits for its line. A line the store
// could not write (a journal being abandoned) never comes; after this the
// path is invalidated again like any other.
const selfExpiry = 10 * time.Second

func (s *selfNotes) add(path string, subtree bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[selfKey]*selfCount{}
	}
	k := selfKey{path, subtree}
	c := s.m[k]
	if c == nil {
		c = &selfCount{}
		s.m[k] = c
	}
	c.n++
	c.last = time.Now()
}

// take reports whether a line for path is the mount's own, and counts it
// off.
func (s *selfNotes) take(path string, subtree bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := selfKey{path, subtree}
	c := s.m[k]
	if c == nil {
		return false
	}
	if c.n--; c.n == 0 {
		delete(s.m, k)
	}
	return true
}

// expire drops the counts whose lines did not come.
func (s *selfNotes) expire(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, c := range s.m {
		if now.Sub(c.last) > selfExpiry {
			delete(s.m, k)
		}
	}
}

// noteChange notes a change the mount made in the change journal
// (store.Workspace.NoteChange), counted as the mount's own.
func (f *fsys) noteChange(rel string, subtree bool) {
	if f.coherent {
		f.self.add(rel, subtree)
	}
	f.ws.NoteChange(rel, subtree)
}

// noteOpen notes an open for writing (store.Workspace.NoteOpen); every line
// the store writes for it (the open, a rotation, the release) is counted
// as the mount's own.
func (f *fsys) noteOpen(path func() string) *store.Open {
	if !f.coherent {
		return f.ws.NoteOpen(path)
	}
	return f.ws.NoteOpen(func() string {
		p := path()
		f.self.add(p, false)
		return p
	})
}

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
