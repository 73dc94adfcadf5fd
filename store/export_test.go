package store

import (
	"testing"
	"time"

	"github.com/agentloom/loomfs/newname"
)

// UseNoFollowWalk makes the calling test resolve paths the way a kernel
// without openat2 does (one O_NOFOLLOW component at a time), so that both
// resolvers run the same cases. The test must not run in parallel.
func UseNoFollowWalk(t testing.TB) {
	old := noOpenat2.Load()
	noOpenat2.Store(true)
	t.Cleanup(func() { noOpenat2.Store(old) })
}

// RotateJournalAt makes change journals rotate at size bytes for the
// calling test.
func RotateJournalAt(t testing.TB, size int64) {
	old := journalRotate
	journalRotate = size
	t.Cleanup(func() { journalRotate = old })
}

// LingerJournalOpens makes the lines of opens (o and x) of the calling
// test wait up to d for the next line.
func LingerJournalOpens(t testing.TB, d time.Duration) {
	old := journalLinger
	journalLinger = d
	t.Cleanup(func() { journalLinger = old })
}

// SyncDir is syncDir, for tests.
var SyncDir = syncDir

// RefuseRenameNoReplace makes renameat2(RENAME_NOREPLACE) answer EINVAL
// for the calling test, as ceph-fuse and GlusterFS do. The test must not
// run in parallel.
func RefuseRenameNoReplace(t testing.TB) {
	t.Cleanup(newname.WithoutRenameNoReplace())
}

// MountTypeOf is mountTypeOf, for tests.
var MountTypeOf = mountTypeOf

// MountPointsOf is mountPointsOf, for tests.
var MountPointsOf = mountPointsOf

// JournalFileOpens is how many times this process opened a journal file
// to describe or read it.
func JournalFileOpens() int64 { return journalOpens.Load() }

// QuietAfter makes a state directory count as quiet d after its last
// change (statelook.go) for the calling test.
func QuietAfter(t testing.TB, d time.Duration) {
	old := racyStamp
	racyStamp = d
	t.Cleanup(func() { racyStamp = old })
}

// LookKept tells whether w keeps a clear look at its state directory.
func LookKept(w *Workspace) bool {
	w.look.mu.Lock()
	defer w.look.mu.Unlock()
	return w.look.clear != stamp{}
}

// SetFenceWorkers sets how many scopes FenceLengths measures at once, for
// a benchmark to compare; restore sets it back.
func SetFenceWorkers(n int) (restore func()) {
	old := fenceWorkers
	fenceWorkers = n
	return func() { fenceWorkers = old }
}
