package quota

import (
	"context"
	"errors"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

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
	err := a.locked(ctx, func(l *ledger, live []holder) (bool, error) {
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
		if rep.Busy || rep.Walk == rep.Account {
			return false, nil
		}
		rep.Corrected = policy.Usage{Bytes: rep.Walk.Bytes - rep.Account.Bytes, Files: rep.Walk.Files - rep.Account.Files}
		l.Bytes += rep.Corrected.Bytes
		l.Files += rep.Corrected.Files
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
}

// Inspect reads the account kept in the directory dirfd without taking
// its lock or changing anything.
func Inspect(dirfd int) (State, error) {
	return inspect(dirfd, "", localNode(dirfd))
}

// inspect reads the account as it stands, every holder but self counted.
// Read without the lock, a file may be replaced between the listing and
// its reading: then it looks again.
func inspect(dirfd int, self string, node nodeID) (State, error) {
	var s State
	var err error
	for range 3 {
		if s, err = inspectOnce(dirfd, self, node); !errors.Is(err, unix.ENOENT) {
			break
		}
	}
	return s, err
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
	s.Known, s.Ledger, s.Used = ok, l.usage(), l.usage()
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
