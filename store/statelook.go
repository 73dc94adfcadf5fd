package store

import (
	"context"
	"errors"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// The look a holder of the scope lock owes the scope's state directory.
//
// Whoever takes the scope lock acts on what an earlier holder that died
// left there: an execution marker or a session marker nobody's lease
// covers (the scope is quarantined), a change set cut midway (it is
// finished); and a change is refused while the quarantine flag is there.
// That is four lookups in the state directory for every tool write, and
// on a shared filesystem each is a round trip to its metadata server
// (0.15–0.5 ms on ceph-fuse). None of the four can appear or go without
// changing the directory's entries, and so its change time. So when a
// look finds none of them, the directory's stat taken before the look is
// kept, and a later holder that finds the directory's stat the same knows
// all four are still absent: one stat instead of four lookups.
//
// A change time is only as fine as the clock that stamped it: where
// stamps are coarser than the time between two changes, a change made
// just after a look can leave the change time as it was. As git does for
// its index ("racy git"), a stat whose change time is less than racyStamp
// before the look is not kept; the directory is trusted again once it has
// been quiet that long. On a shared volume the stamp may come from another
// node's clock (CephFS) or the server's (NFS), so this assumes the clocks
// agree within racyStamp (DEPLOY.md).
//
// A look is kept only where a directory's stat shows another client's
// change as soon as a lookup of the name would (Volume.freshDirStats: a
// local filesystem, CephFS). An NFS client answers a directory's stat from
// its attribute cache for up to actimeo seconds while, with DEPLOY.md's
// lookupcache=positive, it asks the server again for a name it did not
// find; there every holder makes the four lookups.

// racyStamp is how long a state directory's change time must lie before a
// look for the look's finding to be kept (a variable for tests).
var racyStamp = time.Second

// stateLook remembers the state directory as it was before a look that
// found it clear.
type stateLook struct {
	mu    sync.Mutex
	clear stamp // zero when no clear look is kept
}

// errLockMoved: the lock taken was on a file that is no longer the
// scope's lock file.
var errLockMoved = errors.New("the scope lock file was replaced")

// lookAtState takes the look (above) right after the scope lock is taken
// through lf. clear says that none of the four was there, so the holder's
// own quarantine check is done as well.
//
// A Workspace keeps its lock file open from one Lock to the next
// (lock.go), so where the directory changed the look also makes sure a
// kept lf is still the file named LockFile (retention may have cleared the
// state directory, and someone made it anew), answering errLockMoved if
// not: a lock on a file nobody else opens excludes nobody. A lock file
// removed or replaced changes the directory, so an unchanged directory
// vouches for lf as well.
func (w *Workspace) lookAtState(ctx context.Context, lf *lockFile) (clear bool, err error) {
	var st unix.Stat_t
	statErr := unix.Fstat(int(w.state.Fd()), &st)
	before := stampOf(&st)
	w.look.mu.Lock()
	kept := w.look.clear
	w.look.mu.Unlock()
	if w.vol.freshDirStats && statErr == nil && kept == before {
		return true, nil
	}
	if lf.idle && !w.stillNamed(lf) {
		w.look.mu.Lock()
		w.look.clear = stamp{}
		w.look.mu.Unlock()
		return false, errLockMoved
	}
	marker, err := w.quarantineStaleMarker()
	if err != nil {
		return false, err
	}
	session, err := w.quarantineStaleSession()
	if err != nil {
		return false, err
	}
	changes, err := w.recoverChanges(ctx)
	if err != nil {
		return false, err
	}
	quarantined := w.quarantineFlagged()
	if quarantined {
		if quarantined, err = w.quarantineInForce(); err != nil {
			return false, err
		}
	}
	clear = !marker && !session && !changes && !quarantined
	keep := stamp{}
	// Only a look through a lock file it checked vouches for the file;
	// a process's first Lock opened its file by name just now, and the
	// next one checks it (one request fewer for a process of one call).
	if w.vol.freshDirStats && lf.idle && clear && statErr == nil && time.Since(time.Unix(st.Ctim.Unix())) >= racyStamp {
		keep = before
	}
	w.look.mu.Lock()
	w.look.clear = keep
	w.look.mu.Unlock()
	return clear, nil
}
