package fusefs

import (
	"context"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// staleRetry is how long after answering a thread ESTALE the next ESTALE
// for the same thread is taken for the kernel's retry of that call. The
// kernel retries at once, within the same system call, but on a loaded
// machine the daemon may serve the retry's lookup and open tens of
// milliseconds later (10 ms was once too short under the race detector).
// A thread that meets two replaced paths within it, with no read served
// between, gets ENOENT for the second without the kernel's retry.
const staleRetry = time.Second

// staleReads remembers the threads recently answered ESTALE for a read
// (an open for reading, a link's target in a path walk) of a node whose
// path now holds another object: replaced by rename, removed, a link now
// or no longer one. ESTALE makes the kernel look the path up again and
// retry the call once, which is what one replace needs; but a name
// replaced again within that retry (a file and a link swapped in a loop)
// would get the program itself "stale file handle", which no program
// expects of a local disk. So a read's retry that meets a replaced path
// again is answered ENOENT, what open(2) says of a name removed under it.
// Writes are not: ENOENT would tell an open with O_CREAT (which the
// request does not show) that it can't create. A thread's read that is
// served forgets its ESTALE, so only the retry itself is answered so.
type staleReads struct {
	pending atomic.Int32 // threads remembered: 0 keeps readServed free
	mu      sync.Mutex
	recent  [16]staleAnswer // a ring; ESTALE is rare, a few slots do
	next    int
}

type staleAnswer struct {
	tid uint32
	at  time.Time
}

// staleRead answers the read in ctx ESTALE, or ENOENT when it is the
// kernel's retry of a read this thread was answered ESTALE for just
// before.
func (f *fsys) staleRead(ctx context.Context) syscall.Errno {
	c, ok := fuse.FromContext(ctx)
	if !ok || c.Pid == 0 {
		return syscall.ESTALE
	}
	s := &f.staleReads
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.recent {
		if r := &s.recent[i]; r.tid == c.Pid && now.Sub(r.at) < staleRetry {
			s.forget(r)
			return syscall.ENOENT
		}
	}
	if r := &s.recent[s.next]; r.tid != 0 {
		s.forget(r)
	}
	s.recent[s.next] = staleAnswer{tid: c.Pid, at: now}
	s.pending.Add(1)
	s.next = (s.next + 1) % len(s.recent)
	return syscall.ESTALE
}

// readServed forgets the ESTALE of the thread whose read in ctx was
// served: its retry found the path as it looked.
func (f *fsys) readServed(ctx context.Context) {
	s := &f.staleReads
	if s.pending.Load() == 0 {
		return
	}
	c, ok := fuse.FromContext(ctx)
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.recent {
		if r := &s.recent[i]; r.tid == c.Pid {
			s.forget(r)
		}
	}
}

// forget empties slot r; s.mu is held.
func (s *staleReads) forget(r *staleAnswer) {
	*r = staleAnswer{}
	s.pending.Add(-1)
}
