package fusefs

import (
	"path"
	"sync"
	"time"
)

// A directory the mount made is empty when it is made, and the mount sees
// every entry made in it after that: a lookup there of a name the mount
// did not make is answered "no such entry" from memory, with no request
// to the backing store. That is the lookup which comes before every create
// of a new name (tar, git checkout, unzip, a compiler writing its output),
// a parent open and a statx, each a round trip to the server on a shared
// filesystem.
//
// What the mount knows holds only while no other writer changes the
// scope: any change the follower reads from another door, mount or node,
// wherever it is, ends it (fsys.drops), so within one node it ends at once
// and across nodes within the poll interval, as the kernel's negative
// entries do. It also ends after the entry timeout, since a change made
// behind loomfs's back has no journal line. Only a lookup is answered so:
// a create still goes to the backing store, and meets a name someone else
// made meanwhile (EEXIST, or the open of what is there). Under "cache:
// strict" nothing is kept.

// madeNames is what the mount knows of a directory it made: the names made
// in it through the mount since, while the follower's drops stay at gen.
type madeNames struct {
	gen   int64
	since time.Time
	mu    sync.Mutex
	names map[string]struct{}
}

// madeDir notes that the mount just made the directory of node c, empty.
// gen is the follower's drops read before the directory was made: a line
// of another writer's entry in it can only be read after.
func (f *fsys) madeDir(c *node, gen int64) {
	if f.coherent {
		c.made.Store(&madeNames{gen: gen, since: time.Now(), names: map[string]struct{}{}})
	}
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
	m := n.made.Load()
	if m == nil {
		return false
	}
	if m.gen != n.fsys.drops.Load() || time.Since(m.since) > n.fsys.timeout {
		n.made.CompareAndSwap(m, nil)
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.names[name]
	return !ok
}
