package quota

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/ofdlock"
	"github.com/agentloom/loomfs/policy"
)

// Report is what a reconcile found.
type Report struct {
	Account   policy.Usage `json:"account"`   // as all holders counted it, before any correction
	Walk      policy.Usage `json:"walk"`      // what the scope holds
	Corrected policy.Usage `json:"corrected"` // added to the ledger (walk - account), if it was corrected
	// Busy says the reconcile made no correction because the scope was
	// changing (a holder on another node held a grant or unfolded
	// changes, or the walks disagreed).
	Busy bool `json:"busy,omitempty"`
}

// Reconcile compares the account with walks of the scope and corrects
// the ledger to what they found, logging the correction and its size. It
// corrects only when nothing moves: every holder, this one too, has gone
// Options.Idle without a change and settled, and two walks agree, so a
// change in flight is never taken for drift. A dead holder found is
// folded in first.
func (a *Account) Reconcile(ctx context.Context, log *zap.Logger) (Report, error) {
	return a.reconcile(ctx, log, 2)
}

// Recount is Reconcile after a change the account did not see (a subtree
// cleared, the scope restored): one walk is enough, since the caller knows
// the scope changed, but other holders must still be quiet.
func (a *Account) Recount(ctx context.Context, log *zap.Logger) (Report, error) {
	return a.reconcile(ctx, log, 1)
}

func (a *Account) reconcile(ctx context.Context, log *zap.Logger, walks int) (Report, error) {
	if log == nil {
		log = zap.NewNop()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return Report{}, errClosed
	}
	var rep Report
	err := a.locked(ctx, true, func(l *ledger, live []holder) (bool, error) {
		account := func() policy.Usage {
			u := l.usage()
			u.Bytes += a.r.spent.Bytes
			u.Files += a.r.spent.Files
			for _, h := range live {
				u.Bytes += h.rec.spent.Bytes
				u.Files += h.rec.spent.Files
			}
			return u
		}
		rep.Account = account()
		if walks == 1 {
			// A recount: the caller knows the scope changed; holders on
			// this node are read live.
			rep.Busy = !quiet(live)
		} else {
			// A change is checked, then made, then counted: one whose
			// system call is still running (a fallocate of a large
			// file) is counted and not yet seen by a walk. So every
			// holder must have gone idle and settled, this one too.
			rep.Busy = a.timer != nil || !settled(live)
		}
		for i := 0; i < walks && !rep.Busy; i++ {
			// a.mu is held, so this holder changes nothing meanwhile.
			w, err := a.opts.Walk(ctx)
			if err != nil {
				return false, err
			}
			if i > 0 && w != rep.Walk {
				rep.Busy = true
			}
			rep.Walk = w
		}
		if rep.Busy {
			return false, nil
		}
		if rep.Walk == rep.Account {
			// Counted, and found right: no longer unsure.
			was := l.Unsure
			l.Unsure = false
			return was, nil
		}
		rep.Corrected = policy.Usage{Bytes: rep.Walk.Bytes - rep.Account.Bytes, Files: rep.Walk.Files - rep.Account.Files}
		l.Bytes += rep.Corrected.Bytes
		l.Files += rep.Corrected.Files
		l.Unsure = false
		log.Warn("quota account corrected to a walk of the scope",
			zap.Int64("bytes", rep.Corrected.Bytes), zap.Int64("files", rep.Corrected.Files),
			zap.Int64("account_bytes", rep.Account.Bytes), zap.Int64("account_files", rep.Account.Files),
			zap.Int64("walk_bytes", rep.Walk.Bytes), zap.Int64("walk_files", rep.Walk.Files))
		return true, nil
	}, nil)
	return rep, err
}

// State is the account as Inspect reads it.
type State struct {
	Known   bool         `json:"known"`   // the ledger exists and reads back
	Ledger  policy.Usage `json:"ledger"`  // what holders folded in
	Used    policy.Usage `json:"used"`    // the ledger plus what every holder spent and not folded in
	Granted policy.Usage `json:"granted"` // held by live holders, not spent yet
	Holders int          `json:"holders"` // live holders
	Dead    int          `json:"dead"`    // records of holders gone, not folded in yet
	// Unsure says the ledger may count more than the scope holds: a
	// holder on another node died with a grant, counted as spent, while
	// another node's holder was changing the scope. The next holder to
	// fold or reconcile with no other node's holder active counts the
	// scope again.
	Unsure bool `json:"unsure,omitempty"`
	// Unlocked says the account was read without the ledger's lock,
	// which a holder kept longer than the reader waits (a reconcile
	// walking a large scope, a client of a stalled node): a share being
	// folded into the ledger just then may be counted twice or missed.
	Unlocked bool `json:"unlocked,omitempty"`
}

// Inspect reads the account kept in the directory dirfd without joining
// it or changing anything. It reads under a shared lock of the ledger,
// waiting for it at most a couple of seconds (State.Unlocked).
func Inspect(dirfd int) (State, error) {
	fd, err := unix.Openat(dirfd, ledgerLock, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	switch {
	case err == unix.ENOENT:
		// No holder ever joined: nothing to read, nothing to race.
		fd = -1
	case err != nil:
		return State{}, fmt.Errorf("open quota ledger lock: %w", err)
	default:
		defer unix.Close(fd)
	}
	return inspect(dirfd, fd, "", localNode(dirfd))
}

// inspectWait is how long a reader of the account waits for the ledger's
// lock before it reads without it.
var inspectWait = 2 * time.Second

// inspect reads the account as it stands, every holder but self counted,
// under a shared lock of the ledger's lock file lockfd (-1: none yet). A
// holder folds what it spent into the ledger and then clears its record,
// both under the exclusive lock: read between the two, without the lock,
// its share would be counted twice, or, with the ledger read before the
// fold and the record after, not at all. Spending, which takes no lock,
// only moves a live holder's own figures, so what is read under the lock
// is the account as it stood at some moment.
func inspect(dirfd, lockfd int, self string, node nodeID) (State, error) {
	locked := lockfd >= 0 && shareLock(lockfd, inspectWait)
	if locked {
		defer unlockFD(lockfd)
	}
	var s State
	var err error
	// Even under the lock a holder's own record may be replaced between
	// the listing and its reading (its sync): then look again.
	for range 3 {
		if s, err = inspectOnce(dirfd, self, node); !errors.Is(err, unix.ENOENT) {
			break
		}
	}
	s.Unlocked = lockfd >= 0 && !locked
	return s, err
}

// shareLock takes a shared OFD lock on all of fd, trying for up to wait
// (package ofdlock: a wait in the kernel can't be bounded), and reports
// whether it did.
func shareLock(fd int, wait time.Duration) bool {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	lk := unix.Flock_t{Type: unix.F_RDLCK}
	return ofdlock.Wait(ctx, uintptr(fd), lk, ofdlock.Backoff{First: time.Millisecond, Most: 50 * time.Millisecond}) == nil
}

func inspectOnce(dirfd int, self string, node nodeID) (State, error) {
	var s State
	names, err := listDir(dirfd)
	if err != nil {
		return s, err
	}
	l, ok, err := readLedger(dirfd, versionOf(names, LedgerFile))
	if err != nil {
		return s, err
	}
	s.Known, s.Ledger, s.Used, s.Unsure = ok, l.usage(), l.usage(), l.Unsure
	hs, err := holders(dirfd, names, self, node)
	if err != nil {
		return s, err
	}
	for _, h := range hs {
		s.Used.Bytes += h.rec.spent.Bytes
		s.Used.Files += h.rec.spent.Files
		if h.live {
			s.Holders++
			s.Granted.Bytes += h.rec.grant.Bytes
			s.Granted.Files += h.rec.grant.Files
		} else {
			s.Dead++
		}
	}
	return s, nil
}
