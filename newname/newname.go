// Package newname gives a fully written temporary file a name that does
// not exist yet, in one step: a reader on any node sees no file there or
// the whole one, and an existing name is refused, never replaced.
//
// Every file loomfs makes for other processes and nodes to find (a tool
// door's new file, a call record, a quota ledger's next version, a
// journal, a holder's lock file) is written under a temporary name and
// then placed here. It uses renameat2(RENAME_NOREPLACE) where the
// filesystem has it and, where it answers EINVAL (ceph-fuse, GlusterFS,
// older NFS), a hard link of the temporary name and its removal, which
// refuse an existing name just as well; a filesystem that answered so is
// remembered by device, and not asked again.
//
// A plain rename(2) onto a new name would do on a local disk, but not on
// CephFS: after one ceph-fuse client renames a file onto a name that did
// not exist, another client's first lookup of that name waits in the
// metadata server until its next tick, about five seconds (2–5 ms after a
// link or a create). So nothing loomfs shares across nodes is given a new
// name by rename(2).
package newname

import (
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// renameNoReplace is renameat2(RENAME_NOREPLACE) within one directory.
var renameNoReplace = func(dfd int, tmp, name string) error {
	return unix.Renameat2(dfd, tmp, dfd, name, unix.RENAME_NOREPLACE)
}

// refused holds the devices (st_dev) whose filesystem answered
// RENAME_NOREPLACE with EINVAL or ENOSYS, so Place goes to link(2) there
// at once: on ceph-fuse the refusal is itself a round trip to the client's
// daemon (about half a millisecond), which every call record and new file
// would otherwise pay. anyRefused says whether it holds any, so a process
// that never met such a filesystem asks nothing more than renameat2.
var (
	refused    sync.Map // uint64 → struct{}
	anyRefused atomic.Bool
)

// RenameNoReplace is renameat2(RENAME_NOREPLACE) within dfd alone, as Place
// tries it first: for a probe of whether the filesystem has it (an
// EINVAL or ENOSYS says no).
func RenameNoReplace(dfd int, tmp, name string) error { return renameNoReplace(dfd, tmp, name) }

// Place gives the fully written temporary file tmp in directory dfd the
// name name, which must not exist: an existing name answers EEXIST. On
// success tmp is gone; on an error it may remain, for the caller to
// remove. A file that is open (and locked) keeps its open files and locks.
func Place(dfd int, tmp, name string) error {
	dev, known := refusedHere(dfd)
	if known {
		err := placeByLink(dfd, tmp, name)
		if err != unix.EPERM && err != unix.EOPNOTSUPP {
			return err
		}
		// No hard links here: another filesystem now has the device
		// number the refusing one had.
		refused.Delete(dev)
	}
	err := renameNoReplace(dfd, tmp, name)
	if err != unix.EINVAL && err != unix.ENOSYS {
		return err
	}
	var st unix.Stat_t
	if unix.Fstat(dfd, &st) == nil {
		refused.Store(st.Dev, struct{}{})
		anyRefused.Store(true)
	}
	return placeByLink(dfd, tmp, name)
}

// refusedHere reports whether dfd's filesystem is known to refuse
// RENAME_NOREPLACE, and its device when that was looked at.
func refusedHere(dfd int) (dev uint64, ok bool) {
	if !anyRefused.Load() {
		return 0, false
	}
	var st unix.Stat_t
	if unix.Fstat(dfd, &st) != nil {
		return 0, false
	}
	_, ok = refused.Load(st.Dev)
	return st.Dev, ok
}

// placeByLink is Place where the filesystem refuses RENAME_NOREPLACE: a
// hard link refuses an existing name just as well.
func placeByLink(dfd int, tmp, name string) error {
	if err := unix.Linkat(dfd, tmp, dfd, name, 0); err != nil {
		return err
	}
	unix.Unlinkat(dfd, tmp, 0)
	return nil
}

// WithoutRenameNoReplace makes Place act, until restore is called, as on
// a filesystem that refuses RENAME_NOREPLACE (ceph-fuse, GlusterFS): for
// tests of the fallback. Place must not run meanwhile on other goroutines
// that expect otherwise. What Place learnt meanwhile is forgotten at
// restore.
func WithoutRenameNoReplace() (restore func()) {
	old := renameNoReplace
	renameNoReplace = func(int, string, string) error { return unix.EINVAL }
	return func() {
		renameNoReplace = old
		refused.Clear()
		anyRefused.Store(false)
	}
}
