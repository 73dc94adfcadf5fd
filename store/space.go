package store

import (
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Free space of the volume, for the policy's watermarks by priority
// (policy.CheckVolume). The figure is the filesystem's own (statfs), so
// every process and node that shares the volume sees the same one; it is
// read at most once a second per filesystem in this process, whichever
// door asks (both reserve growth through Workspace.Reserve), and what this
// process grew by since the last reading is taken off it, so a burst of
// writes between two readings can't run past a watermark.

// SpaceInterval is the longest a reading of the free space is used.
const SpaceInterval = time.Second

type spaceReading struct {
	mu    sync.Mutex
	at    time.Time
	free  int64 // bytes available to unprivileged writers, less this process's growth since at
	total int64
}

var spaces sync.Map // filesystem device -> *spaceReading

// forgetSpace drops the reading of device dev, as a volume on it closes:
// a filesystem mounted later may get the same device number, and must not
// inherit its figure. Another volume open on dev only reads it again.
func forgetSpace(dev uint64) { spaces.Delete(dev) }

// growVolume asks check whether the filesystem holding fd (device dev)
// may grow by add, given its free and total bytes, reading them if the
// last reading is older than SpaceInterval; growth check allows is taken
// off the free figure for the next asker.
func growVolume(fd int, dev uint64, add int64, check func(free, total int64) error) error {
	v, _ := spaces.LoadOrStore(dev, &spaceReading{})
	s := v.(*spaceReading)
	s.mu.Lock()
	defer s.mu.Unlock()
	if now := time.Now(); s.at.IsZero() || now.Sub(s.at) >= SpaceInterval {
		var st unix.Statfs_t
		if err := unix.Fstatfs(fd, &st); err != nil {
			return err
		}
		s.at = now
		s.free = int64(st.Bavail) * st.Bsize
		s.total = int64(st.Blocks) * st.Bsize
	}
	if err := check(s.free, s.total); err != nil {
		return err
	}
	if add > 0 {
		s.free -= add
	}
	return nil
}
