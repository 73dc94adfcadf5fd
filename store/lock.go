package store

import (
	"context"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/ofdlock"
	"github.com/agentloom/loomfs/policy"
)

// scopeLockBackoff paces a wait for the scope lock: a tool write holds it
// for milliseconds, a command for up to its whole timeout.
var scopeLockBackoff = ofdlock.Backoff{First: time.Millisecond, Most: 64 * time.Millisecond}

// LockFile is the scope lock's name in the scope's state directory,
// .agentloom-locks/<scope-hash>/, outside every projection (SPEC §7.2).
const LockFile = "scope.lock"

// Lock takes the scope's exclusive lock, waiting until ctx is done. It is a
// POSIX open-file-description lock, so it excludes other goroutines of this
// process as well as other processes and, on a filesystem with working
// POSIX locks (NFSv4, CephFS), other nodes. The returned func releases it.
//
// Whoever takes the lock and finds an execution marker knows its owner is
// gone (a running command holds the lock throughout), so the scope is
// quarantined then and there.
//
// The wait is bounded by ctx even when a system call on the way does not
// return: opening the lock file on CephFS waits in the kernel for the
// metadata server while the client that last held it is dead. Lock then
// answers timeout, and a lock taken after that is released at once.
func (w *Workspace) Lock(ctx context.Context) (unlock func(), err error) {
	unlock, err = within(ctx, &w.late, func() (func(), error) { return w.lock(ctx) }, func(unlock func()) { unlock() })
	if overBudget(err) {
		return nil, policy.Errorf(policy.Timeout, "scope %s is busy (another write or command holds its lock, or its storage did not answer in time); retry later", w.scope)
	}
	return unlock, err
}

func (w *Workspace) lock(ctx context.Context) (unlock func(), err error) {
	// Every write tool and every command holds this lock, so the shared
	// volume's marker is checked here once the lock is ours, in case it
	// was swapped while we waited (SPEC §2.2), and before the lock file is
	// made where there is none yet, so that nothing is made on a volume
	// that is not ours. A lock file already there is opened without a
	// check of its own: on a shared filesystem each check is at least a
	// round trip to its server.
	fd, err := unix.Openat(int(w.state.Fd()), LockFile, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err == unix.ENOENT {
		if err := w.vol.recheck(); err != nil {
			return nil, err
		}
		fd, err = unix.Openat(int(w.state.Fd()), LockFile, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, policy.FilePerm)
	}
	if err != nil {
		return nil, policy.FromErrno(err, "open lock", LockFile)
	}
	f := os.NewFile(uintptr(fd), LockFile)
	lk := unix.Flock_t{Type: unix.F_WRLCK}
	if err := ofdlock.Wait(ctx, f.Fd(), lk, scopeLockBackoff); err != nil {
		f.Close()
		if ctx.Err() != nil {
			return nil, policy.WaitEnded(ctx, "scope %s is busy (another write or command holds its lock); retry later", w.scope)
		}
		return nil, policy.FromErrno(err, "lock", w.scope.String())
	}
	unlock = func() {
		un := unix.Flock_t{Type: unix.F_UNLCK}
		unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &un)
		f.Close()
	}
	if err := w.vol.recheck(); err != nil {
		unlock()
		return nil, err
	}
	if err := w.quarantineStaleMarker(); err != nil {
		unlock()
		return nil, err
	}
	if err := w.quarantineStaleSession(); err != nil {
		unlock()
		return nil, err
	}
	// A change set a crash cut midway is finished before anything else
	// (intent.go).
	if err := w.recoverChanges(ctx); err != nil {
		unlock()
		return nil, err
	}
	return unlock, nil
}
