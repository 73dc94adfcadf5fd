package fusefs

import (
	"path"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/store"
)

// A directory the mount made is empty when it is made, and the mount sees
// every entry made in it after that: a lookup there of a name the mount
// did not make is answered "no such entry" from memory, with no request
// to the backing store. That is the lookup which comes before every create
// of a new name (tar, git checkout, unzip, a compiler writing its output),
// a parent open and a statx, each a round trip to the server on a shared
// filesystem.
//
// The mount also keeps the directory open, and a request naming an entry
// in it (create, mkdir, lookup, symlink, unlink, rename) makes its *at
// call on that descriptor instead of resolving the directory's path from
// the scope again: on a shared filesystem whose client caches no entry
// (ceph-fuse answers every lookup with a zero timeout) that resolution is
// a round trip per request, half of what a mount added to tar -x there.
// The descriptor names the directory the mount made wherever it is, as an
// NFS file handle does; a directory moved meanwhile by a request through
// the mount keeps its descriptor, and its node's path follows it.
//
// What the mount knows holds only while no other writer changes the
// scope: any change the follower reads from another door, mount or node,
// wherever it is, ends it (fsys.drops), so within one node it ends at once
// and across nodes within the poll interval, as the kernel's negative
// entries do. It also ends after the entry timeout, since a change made
// behind loomfs's back has no journal line. Only a lookup is answered from
// memory: a create still goes to the backing store, and meets a name
// someone else made meanwhile (EEXIST, or the open of what is there).
// Under "cache: strict" nothing is kept.
//
// Within that window a request through a kept descriptor may reach a
// directory another node has just moved: it lands in the directory, at
// its new place, as if made just before the move. No door moves a
// directory into a read-only or hidden part (the policy refuses either
// end of such a move), nor out of the scope, but for the old tree a
// restore sets aside beside the scope and removes (a restore runs with no
// command running, and what lands there goes with the old tree, as a
// change made just before the restore would). The request's journal line
// names the old path, though. So when the follower
// reads another writer's line for a moved, removed or restored tree while
// kept descriptors were used, it waits for the requests still using them
// and notes that tree again as the mount's own change (echoTrees): every
// other mount then drops what it holds beneath the tree's new place after
// the entries made there. Another mount's echo moved nothing and is not
// echoed back (follow.go, echoed).

// maxKeptDirs bounds the directories a mount keeps open: tar and a build
// fill a few directories at a time; the oldest is closed past this.
const maxKeptDirs = 64

// madeNames is what the mount knows of a directory it made: the names made
// in it through the mount since, while the follower's drops stay at gen,
// and the directory itself, open.
type madeNames struct {
	gen   int64
	since time.Time
	mu    sync.Mutex
	names map[string]struct{}
	// fd is the directory, open since it was made; -1 once closed.
	// Guarded by mu.
	fd int
}

// close closes the kept directory; what it knows of the names is
// unchanged, and holds while the node's made pointer does.
func (m *madeNames) close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fd >= 0 {
		unix.Close(m.fd)
		m.fd = -1
	}
}

// dup returns a descriptor of the kept directory of the caller's own, or
// false once it is closed.
func (m *madeNames) dup() (int, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fd < 0 {
		return -1, false
	}
	fd, err := unix.FcntlInt(uintptr(m.fd), unix.F_DUPFD_CLOEXEC, 0)
	return fd, err == nil
}

// keptDirs is what the mount knows of the directory descriptors it keeps.
type keptDirs struct {
	mu   sync.Mutex
	dirs []*madeNames // oldest first, at most maxKeptDirs

	// used is set by a request about to look at a kept descriptor, before
	// it looks whether the descriptor still holds; the follower clears it.
	used atomic.Bool
	// inFlight counts the requests looking at a kept descriptor or
	// holding one of its duplicates.
	inFlight atomic.Int64
	// opens counts the duplicates handed out; tests use it.
	opens atomic.Int64
}

// add keeps m, closing the oldest kept directory past maxKeptDirs.
func (k *keptDirs) add(m *madeNames) {
	k.mu.Lock()
	k.dirs = append(k.dirs, m)
	var old *madeNames
	if len(k.dirs) > maxKeptDirs {
		old = k.dirs[0]
		k.dirs = append(k.dirs[:0], k.dirs[1:]...)
	}
	k.mu.Unlock()
	if old != nil {
		old.close()
	}
}

// closeAll closes every kept directory (the mount is going).
func (k *keptDirs) closeAll() {
	k.mu.Lock()
	dirs := k.dirs
	k.dirs = nil
	k.mu.Unlock()
	for _, m := range dirs {
		m.close()
	}
}

// drain waits, for at most limit, until no request uses a kept
// descriptor: those that looked before the follower's last drop are done
// (their journal lines are noted), and later ones found it ended.
func (k *keptDirs) drain(limit time.Duration) {
	deadline := time.Now().Add(limit)
	for k.inFlight.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
}

// madeDir notes that the mount just made the directory of node c, empty,
// and keeps fd, the directory open; the caller gives fd over. gen is the
// follower's drops read before the directory was made: a line of another
// writer's entry in it can only be read after.
func (f *fsys) madeDir(c *node, gen int64, fd int) {
	if !f.coherent {
		unix.Close(fd)
		return
	}
	m := &madeNames{gen: gen, since: time.Now(), names: map[string]struct{}{}, fd: fd}
	c.made.Store(m)
	f.kept.add(m)
}

// madeNow returns what the mount knows of the directory n, nil when it
// knows nothing or no longer: it made n, and no other writer changed the
// scope since, within the entry timeout.
func (n *node) madeNow() *madeNames {
	m := n.made.Load()
	if m == nil {
		return nil
	}
	if m.gen != n.fsys.drops.Load() || time.Since(m.since) > n.fsys.timeout {
		if n.made.CompareAndSwap(m, nil) {
			m.close()
		}
		return nil
	}
	return m
}

// statKept describes the directory n from the descriptor the mount keeps
// of it, if it keeps one: under default_permissions the kernel asks for a
// directory's attributes again after every create or unlink in it, and
// for a directory the mount made that is an fstat, not a walk of its path
// (a round trip per component on a client that caches no entry).
func (n *node) statKept() (unix.Statx_t, bool) {
	m := n.madeNow()
	if m == nil {
		return unix.Statx_t{}, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fd < 0 {
		return unix.Statx_t{}, false
	}
	sx, err := statAt(m.fd, "")
	return sx, err == nil
}

// madeEntry notes that the entry name of directory n is there: made
// through the mount, moved in, or looked up. The kernel holds the
// directory's lock over a create or rename in it, so no lookup of the name
// through the mount comes between the change and this note.
func (n *node) madeEntry(name string) {
	if m := n.made.Load(); m != nil {
		m.mu.Lock()
		m.names[name] = struct{}{}
		m.mu.Unlock()
	}
}

// madeEntryAt is madeEntry for the entry at rel, a child of n.
func (n *node) madeEntryAt(rel string) { n.madeEntry(path.Base(rel)) }

// knownAbsent reports whether name is not in the directory n as far as the
// mount knows: the mount made n, no other writer changed the scope since,
// and no entry of that name was made in n through the mount.
func (n *node) knownAbsent(name string) bool {
	m := n.madeNow()
	if m == nil {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.names[name]
	return !ok
}

// parentDir is the directory holding an entry, open for a few *at calls;
// a value, so the requests' hot path allocates nothing more for it.
type parentDir struct {
	*store.Dir
	kept *keptDirs // set when it is a kept directory's duplicate
}

// Close closes the directory and, for a kept one's duplicate, lets the
// follower's echo go ahead.
func (d parentDir) Close() error {
	err := d.Dir.Close()
	if d.kept != nil {
		d.kept.inFlight.Add(-1)
	}
	return err
}

// parentOf opens the directory n, which holds the entry at rel, for a few
// *at calls: a duplicate of the descriptor the mount kept if it made n and
// still knows it, else n's path resolved from the scope's descriptor.
func (n *node) parentOf(rel string) (parentDir, string, error) {
	f := n.fsys
	if n.made.Load() != nil {
		k := &f.kept
		k.used.Store(true)
		k.inFlight.Add(1)
		if m := n.madeNow(); m != nil {
			if fd, ok := m.dup(); ok {
				d, name, err := f.ws.ParentIn(fd, rel)
				if err != nil {
					k.inFlight.Add(-1)
					return parentDir{}, "", err
				}
				k.opens.Add(1)
				return parentDir{Dir: d, kept: k}, name, nil
			}
		}
		k.inFlight.Add(-1)
	}
	d, name, err := f.ws.Parent(rel)
	if err != nil {
		return parentDir{}, "", err
	}
	return parentDir{Dir: d}, name, nil
}

// echoTrees is called by the follower after a pass that read lines of
// other writers, with the trees among them that were moved, removed or
// restored. If requests used kept descriptors since the last such pass, it
// waits for those still using one and notes each tree again, as the
// mount's own change: what they made there is then named under the tree's
// new place, after the entries themselves.
func (f *fsys) echoTrees(trees []string) {
	if !f.kept.used.Swap(false) || len(trees) == 0 {
		return
	}
	f.kept.drain(5 * time.Second)
	if slices.Contains(trees, ".") {
		trees = []string{"."}
	}
	for _, rel := range trees {
		f.ws.NoteChangeBy(rel, true, f.by(store.OpTree, rel))
	}
}
