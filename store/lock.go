package store

import (
	"context"
	"fmt"
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
// quarantined then and there (statelook.go).
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
	for range 3 {
		unlock, moved, err := w.lockOnce(ctx)
		if !moved {
			return unlock, err
		}
	}
	return nil, fmt.Errorf("lock scope %s: its lock file was replaced each time it was locked", w.scope)
}

// lockFile is an open scope lock file, and which file it is. A Workspace
// keeps the one it last unlocked open for its next Lock (idleLock): on a
// shared filesystem an open and a close are two round trips to its server.
type lockFile struct {
	f        *os.File
	idle     bool   // kept from an earlier Lock, not opened by name just now
	dev, ino uint64 // which file f is, once asked (zero until then)
}

// lockOnce takes the lock through the idle lock file or a new one. moved
// says that the idle file was no longer the scope's lock file (the state
// directory was made anew): it was let go, and the caller tries again.
func (w *Workspace) lockOnce(ctx context.Context) (unlock func(), moved bool, err error) {
	lf := w.idleLock.Swap(nil)
	if lf != nil {
		lf.idle = true
	} else {
		if lf, err = w.openLock(); err != nil {
			return nil, false, err
		}
	}
	lk := unix.Flock_t{Type: unix.F_WRLCK}
	if err := ofdlock.Wait(ctx, lf.f.Fd(), lk, scopeLockBackoff); err != nil {
		lf.f.Close()
		if ctx.Err() != nil {
			return nil, false, policy.WaitEnded(ctx, "scope %s is busy (another write or command holds its lock); retry later", w.scope)
		}
		return nil, false, policy.FromErrno(err, "lock", w.scope.String())
	}
	keep := true
	unlock = func() {
		w.clearHeld.Store(false)
		un := unix.Flock_t{Type: unix.F_UNLCK}
		unix.FcntlFlock(lf.f.Fd(), unix.F_OFD_SETLK, &un)
		if !keep || !w.idleLock.CompareAndSwap(nil, lf) {
			lf.f.Close()
		}
	}
	if err := w.vol.recheck(); err != nil {
		unlock()
		return nil, false, err
	}
	// A dead holder's marker quarantines the scope, a change set a crash
	// cut midway is finished (intent.go), before anything else.
	clear, err := w.lookAtState(ctx, lf)
	if err == errLockMoved {
		keep = false
		unlock()
		return nil, true, nil
	}
	if err != nil {
		unlock()
		return nil, false, err
	}
	w.clearHeld.Store(clear)
	return unlock, false, nil
}

// openLock opens the scope's lock file. Every write tool and every
// command holds the lock, so the shared volume's marker is checked once
// the lock is ours (lockOnce), in case it was swapped while we waited
// (SPEC §2.2), and here before the lock file is made where there is none
// yet, so that nothing is made on a volume that is not ours. A lock file
// already there is opened without a check of its own: on a shared
// filesystem each check is at least a round trip to its server.
func (w *Workspace) openLock() (*lockFile, error) {
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
	return &lockFile{f: os.NewFile(uintptr(fd), LockFile)}, nil
}

// stillNamed tells whether lf is still the file named LockFile.
func (w *Workspace) stillNamed(lf *lockFile) bool {
	if lf.ino == 0 {
		var st unix.Stat_t
		if unix.Fstat(int(lf.f.Fd()), &st) != nil {
			return false
		}
		lf.dev, lf.ino = st.Dev, st.Ino
	}
	var named unix.Stat_t
	err := unix.Fstatat(int(w.state.Fd()), LockFile, &named, unix.AT_SYMLINK_NOFOLLOW)
	return err == nil && named.Dev == lf.dev && named.Ino == lf.ino
}

// closeIdleLock closes the lock file kept for the next Lock.
func (w *Workspace) closeIdleLock() {
	if lf := w.idleLock.Swap(nil); lf != nil {
		lf.f.Close()
	}
}
