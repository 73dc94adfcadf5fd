package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/quota"
)

// QuotaDir holds the scope's quota account (package quota) in its state
// directory: one account for every process and node that opens the scope.
const QuotaDir = "quota"

// scopeQuota is this process's share of the scope's quota account and of
// the accounts of its capped subtrees (subtree.go), each opened on first
// use and shared by the workspace's views (Unfiltered).
type scopeQuota struct {
	mu   sync.Mutex
	acct *quota.Account
	caps map[string]*quota.Account // by subtree prefix

	heldMu sync.Mutex
	held   map[*heldFunc]struct{}

	// built, while set, is the whole tree ReplaceTreeCounted just swapped
	// in: the scope's count is made from it (countBuilt), not walked.
	built atomic.Pointer[[]TreeEntry]
}

type heldFunc struct {
	fn func(under string) policy.Usage
}

// CountHeld adds fn to what a count of the scope, or of a capped subtree,
// finds: what this process holds that a walk can't see (a projection's
// files removed, or never named, while still open; they stay counted
// until their last close) at the cleaned path under or beneath it ("."
// for the whole scope). fn must not wait for a change in progress: it
// runs while the account is held. The returned func removes it.
func (w *Workspace) CountHeld(fn func(under string) policy.Usage) (remove func()) {
	q := w.quota
	if q == nil {
		return func() {}
	}
	h := &heldFunc{fn}
	q.heldMu.Lock()
	if q.held == nil {
		q.held = map[*heldFunc]struct{}{}
	}
	q.held[h] = struct{}{}
	q.heldMu.Unlock()
	return func() {
		q.heldMu.Lock()
		delete(q.held, h)
		q.heldMu.Unlock()
	}
}

// heldUsage sums what the funcs CountHeld was given hold under the
// cleaned path under.
func (w *Workspace) heldUsage(under string) policy.Usage {
	var u policy.Usage
	q := w.quota
	if q == nil {
		return u
	}
	q.heldMu.Lock()
	defer q.heldMu.Unlock()
	for h := range q.held {
		v := h.fn(under)
		u.Bytes += v.Bytes
		u.Files += v.Files
	}
	return u
}

var errNoAccount = errors.New("this view of the scope counts no quota")

// account returns the scope's quota account, joining it on first use.
func (w *Workspace) account() (*quota.Account, error) {
	q := w.quota
	if q == nil {
		return nil, errNoAccount
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.acct != nil {
		return q.acct, nil
	}
	dfd, err := w.stateSubdir(QuotaDir)
	if err != nil {
		return nil, policy.Unavailable(policy.VolumeUnavailable, "the quota account", err)
	}
	defer unix.Close(dfd)
	a, err := quota.Open(dfd, quota.Options{Limits: w.pol.Limits, Walk: w.countAccount})
	if err != nil {
		return nil, policy.Unavailable(policy.VolumeUnavailable, "the quota account", err)
	}
	q.acct = a
	return a, nil
}

// closeAccount folds this process's share into the scope's account and
// those of its capped subtrees, and leaves them. A share that could not be
// folded in (the ledger's lock not had in time) is left in its record,
// which the next holder folds in.
func (w *Workspace) closeAccount() error {
	q := w.quota
	if q == nil {
		return nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	var err error
	if q.acct != nil {
		if cerr := q.acct.Close(); cerr != nil {
			err = fmt.Errorf("fold this process's share into the quota account: %w", cerr)
		}
		q.acct = nil
	}
	return errors.Join(err, q.closeCaps())
}

// countScope counts the scope: a walk (files and directories, and the
// apparent size of regular files and links) and what this process holds
// open that the walk can't see (CountHeld).
func (w *Workspace) countScope(ctx context.Context) (policy.Usage, error) {
	u := w.heldUsage(".")
	err := w.Walk(ctx, ".", func(rel string, info Info) error {
		u.Files++
		if info.Kind == policy.KindRegular || info.Kind == policy.KindLink {
			u.Bytes += info.Size
		}
		return nil
	})
	return u, err
}

// countAccount is how the scope's account counts the scope: countScope,
// or, right after ReplaceTreeCounted swapped in a tree, the same count
// made from the list of what it holds.
func (w *Workspace) countAccount(ctx context.Context) (policy.Usage, error) {
	if built := w.quota.built.Load(); built != nil {
		u := w.heldUsage(".")
		b := countBuilt(w.pol, *built)
		u.Bytes += b.Bytes
		u.Files += b.Files
		return u, nil
	}
	return w.countScope(ctx)
}

// countBuilt counts a tree from the list of its entries (TreeEntry, each
// directory before what it holds) as countScope's walk would count it
// under pol: an entry is counted when pol lists it and every directory
// above it, a directory as a file with no bytes.
func countBuilt(pol *policy.Policy, built []TreeEntry) policy.Usage {
	var u policy.Usage
	unlisted := map[string]bool{} // directories the walk does not enter
	for _, e := range built {
		if parent, _ := policy.Split(e.Path); unlisted[parent] || !pol.Listed(e.Path) {
			if e.Dir {
				unlisted[e.Path] = true
			}
			continue
		}
		u.Files++
		if !e.Dir {
			u.Bytes += e.Size
		}
	}
	return u
}

// refreshUsageFrom is RefreshUsage after a tree that holds exactly built
// was swapped in: the scope's account is counted from the list.
func (w *Workspace) refreshUsageFrom(ctx context.Context, built []TreeEntry) {
	if q := w.quota; q != nil {
		q.built.Store(&built)
		defer q.built.Store(nil)
	}
	w.RefreshUsage(ctx)
}

// Usage returns what the scope holds as every process and node that opened
// it counted it: counted by a walk the first time the scope's account is
// made, and kept up to date from every change since.
func (w *Workspace) Usage(ctx context.Context) (policy.Usage, error) {
	a, err := w.account()
	if err != nil {
		return policy.Usage{}, err
	}
	return a.Usage(ctx)
}

// CountUsage counts the scope now (a walk, and what this process holds
// open that the walk can't see), for comparing with Usage.
func (w *Workspace) CountUsage(ctx context.Context) (policy.Usage, error) {
	return w.countScope(ctx)
}

// Reconcile compares the account with walks of the scope and corrects it
// when they disagree and nothing is changing (quota.Account.Reconcile),
// and so the account of every capped subtree this process has joined;
// each correction is logged with its size. The report is the scope's.
func (w *Workspace) Reconcile(ctx context.Context, log *zap.Logger) (quota.Report, error) {
	a, err := w.account()
	if err != nil {
		return quota.Report{}, err
	}
	rep, err := a.Reconcile(ctx, log)
	if log == nil {
		log = zap.NewNop()
	}
	for prefix, c := range w.openCaps() {
		if _, cerr := c.Reconcile(ctx, log.With(zap.String("subtree", prefix))); cerr != nil {
			err = errors.Join(err, fmt.Errorf("quota account of %s/: %w", prefix, cerr))
		}
	}
	return rep, err
}

// ReconcileSubtree is Reconcile for the account of the capped subtree at
// the cleaned path prefix alone.
func (w *Workspace) ReconcileSubtree(ctx context.Context, prefix string, log *zap.Logger) (quota.Report, error) {
	for _, c := range w.pol.Caps(prefix) {
		if c.Prefix == prefix {
			a, err := w.capAccount(c)
			if err != nil {
				return quota.Report{}, err
			}
			return a.Reconcile(ctx, log)
		}
	}
	return quota.Report{}, policy.Errorf(policy.InvalidInput, "%s/ is not a capped subtree", prefix)
}

// QuotaState reads the scope's account (quota.Inspect) without joining it.
func (w *Workspace) QuotaState() (quota.State, error) {
	return w.inspectAccount(QuotaDir)
}

// ScopeQuotaState reads scope s's quota account without opening the scope,
// joining the account or making anything: the zero State for a scope no
// holder has joined yet. Metrics read it for every scope active lately.
func (v *Volume) ScopeQuotaState(s Scope) (quota.State, error) {
	if err := s.Validate(); err != nil {
		return quota.State{}, err
	}
	st, err := v.Area(LocksDir+"/"+s.Hash(), false)
	if errors.Is(err, fs.ErrNotExist) || policy.CodeOf(err) == policy.NotFound {
		return quota.State{}, nil
	}
	if err != nil {
		return quota.State{}, err
	}
	defer st.Close()
	return (&Workspace{state: st}).inspectAccount(QuotaDir)
}

// inspectAccount reads the account in the directory of the state
// directory that names lead to, one component at a time; one not made yet
// is the zero State.
func (w *Workspace) inspectAccount(names ...string) (quota.State, error) {
	dfd := int(w.state.Fd())
	for i, name := range names {
		fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if i > 0 {
			unix.Close(dfd)
		}
		if err == unix.ENOENT {
			return quota.State{}, nil
		}
		if err != nil {
			return quota.State{}, err
		}
		dfd = fd
	}
	defer unix.Close(dfd)
	return quota.Inspect(dfd)
}

// RefreshUsage counts the scope again after a change the account did not
// see (made outside loomfs, or a whole tree swapped in): the account is
// corrected to a walk when no other holder is changing the scope, and
// otherwise by the next reconcile. So are the accounts of the capped
// subtrees (subtree.go). A wait for an account's lock ends with ctx, and
// the reconcile then corrects what the recount could not.
func (w *Workspace) RefreshUsage(ctx context.Context) {
	if a, err := w.account(); err == nil {
		a.Recount(ctx, nil)
	}
	w.recountCaps(ctx)
}

// Reserve checks that adding addBytes and addFiles stays within the scope
// quota and counts them. A caller whose change then fails gives them back
// with Adjust.
func (w *Workspace) Reserve(ctx context.Context, addBytes, addFiles int64) error {
	a, err := w.account()
	if err != nil {
		return err
	}
	if err := w.checkVolume(addBytes, addFiles); err != nil {
		return err
	}
	return accountErr(a.Reserve(ctx, addBytes, addFiles))
}

// accountErr is a quota account's error as the policy answers it: its
// refusals as they are, and storage trouble (a ledger or a record it
// could not write, a full volume) as the account being unavailable.
func accountErr(err error) error {
	var pe *policy.Error
	if err == nil || errors.As(err, &pe) {
		return err
	}
	return policy.Unavailable(policy.VolumeUnavailable, "the quota account", err)
}

// checkVolume refuses growth of a scope whose priority class is below its
// watermark on the volume (policy.CheckVolume), from the filesystem's free
// space read at most once a second (space.go). Growth of a class with no
// watermark (high) is counted too, so the others' figure stays true; a
// policy with no watermark at all reads nothing.
func (w *Workspace) checkVolume(addBytes, addFiles int64) error {
	if (addBytes <= 0 && addFiles <= 0) || !w.pol.WatchesVolume() {
		return nil
	}
	err := growVolume(int(w.dir.Fd()), w.dev, addBytes, func(free, total int64) error {
		return w.pol.CheckVolume(free, total, addBytes, addFiles)
	})
	if err != nil && policy.CodeOf(err) != policy.VolumeReserved {
		return policy.Unavailable(policy.VolumeUnavailable, "the volume's free space", err)
	}
	return err
}

// Adjust counts a change without checking it (shrinking, or undoing a
// Reserve).
func (w *Workspace) Adjust(addBytes, addFiles int64) {
	if a, err := w.account(); err == nil {
		a.Adjust(addBytes, addFiles)
	}
}
