package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/quota"
)

// A capped subtree of the policy (policy.Subtree with MaxBytes or
// MaxFiles; tmp/ in the standard policy) keeps an account of its own in
// package quota, like the scope: every process and node that changes the
// scope draws on it, so that together they never hold more than the cap.
// Each lives in a directory of the scope's QuotaDir named from its prefix
// (capDirName), is joined on the first change in the subtree, and counts
// the subtree with walkUsage when its ledger is new.

// capDirName names the directory of QuotaDir that holds the account of
// the subtree at prefix: a short hash, so that no prefix, however long or
// odd, makes a name the directory can't hold.
func capDirName(prefix string) string {
	sum := sha256.Sum256([]byte(prefix))
	return "cap-" + hex.EncodeToString(sum[:8])
}

// capAccount returns the account of the capped subtree s, joining it on
// first use.
func (w *Workspace) capAccount(s policy.Subtree) (*quota.Account, error) {
	a, err := w.joinCap(s, true)
	if err != nil {
		return nil, policy.Unavailable(policy.VolumeUnavailable, "the quota account of "+s.Prefix+"/", err)
	}
	return a, nil
}

// joinCap returns the account of s, joining it if this process has not.
// Unless create is set, an account no process made yet is nil: there is
// nothing in it to correct.
func (w *Workspace) joinCap(s policy.Subtree, create bool) (*quota.Account, error) {
	q := w.quota
	if q == nil {
		return nil, errNoAccount
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if a := q.caps[s.Prefix]; a != nil {
		return a, nil
	}
	a, err := w.openCapAccount(s, create)
	if err != nil || a == nil {
		return nil, err
	}
	if q.caps == nil {
		q.caps = map[string]*quota.Account{}
	}
	q.caps[s.Prefix] = a
	return a, nil
}

// openCapAccount joins the account of s. Unless create is set, an account
// nobody made yet is (nil, nil): there is nothing in it to correct.
func (w *Workspace) openCapAccount(s policy.Subtree, create bool) (*quota.Account, error) {
	qfd, err := w.stateSubdir(QuotaDir)
	if err != nil {
		return nil, err
	}
	defer unix.Close(qfd)
	name := capDirName(s.Prefix)
	if create {
		if err := unix.Mkdirat(qfd, name, policy.DirPerm); err != nil && err != unix.EEXIST {
			return nil, fmt.Errorf("quota dir of %s/: %w", s.Prefix, err)
		}
	}
	dfd, err := unix.Openat(qfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err == unix.ENOENT && !create {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("quota dir of %s/: %w", s.Prefix, err)
	}
	defer unix.Close(dfd)
	return quota.Open(dfd, quota.Options{
		Limits: policy.Limits{ScopeBytes: s.MaxBytes, ScopeFiles: s.MaxFiles},
		Walk:   func(ctx context.Context) (policy.Usage, error) { return w.countCap(ctx, s.Prefix) },
		Check:  s.CheckCap,
	})
}

// openCaps returns the accounts this process has joined, by prefix.
func (w *Workspace) openCaps() map[string]*quota.Account {
	q := w.quota
	if q == nil {
		return nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	out := make(map[string]*quota.Account, len(q.caps))
	for p, a := range q.caps {
		out[p] = a
	}
	return out
}

// recountCaps counts every capped subtree again after a change its
// account did not see (quota.Account.Recount): those this process joined,
// and those of w's policy that another process made, so that a subtree
// cleared by another process (loomfs gc) is not left counted full.
func (w *Workspace) recountCaps(ctx context.Context) {
	for _, s := range w.pol.Subtrees {
		if s.Capped() {
			w.joinCap(s, false)
		}
	}
	for _, a := range w.openCaps() {
		a.Recount(ctx, nil)
	}
}

// closeCaps folds this process's share of every subtree account into it
// and leaves them. q.mu is held.
func (q *scopeQuota) closeCaps() error {
	var err error
	for p, a := range q.caps {
		if cerr := a.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("fold this process's share into the quota account of %s/: %w", p, cerr))
		}
		delete(q.caps, p)
	}
	return err
}

// ReserveAt checks that adding addBytes and addFiles at the cleaned path
// rel stays within the scope quota and the cap of every subtree rel is in
// (tmp/ in the standard policy), as all holders count them, and counts
// them in each. A refusal gives back what was taken. A caller whose
// change then fails gives them back with AdjustAt. Reserve is ReserveAt
// for a change no capped subtree can see.
func (w *Workspace) ReserveAt(ctx context.Context, rel string, addBytes, addFiles int64) error {
	caps := w.pol.Caps(rel)
	if len(caps) == 0 {
		return w.Reserve(ctx, addBytes, addFiles)
	}
	taken, err := w.reserveCaps(ctx, caps, addBytes, addFiles)
	if err != nil {
		return err
	}
	if err := w.Reserve(ctx, addBytes, addFiles); err != nil {
		for _, a := range taken {
			a.Adjust(-addBytes, -addFiles)
		}
		return err
	}
	return nil
}

// reserveCaps reserves a change in the account of each of caps, all or
// none, and returns the accounts.
func (w *Workspace) reserveCaps(ctx context.Context, caps []policy.Subtree, addBytes, addFiles int64) ([]*quota.Account, error) {
	taken := make([]*quota.Account, 0, len(caps))
	for _, c := range caps {
		a, err := w.capAccount(c)
		if err == nil {
			err = accountErr(a.Reserve(ctx, addBytes, addFiles))
		}
		if err != nil {
			for _, a := range taken {
				a.Adjust(-addBytes, -addFiles)
			}
			return nil, err
		}
		taken = append(taken, a)
	}
	return taken, nil
}

// AdjustAt counts a change at rel without checking it (shrinking, or
// undoing a ReserveAt), in the scope and in every capped subtree rel is in.
func (w *Workspace) AdjustAt(rel string, addBytes, addFiles int64) {
	w.Adjust(addBytes, addFiles)
	w.adjustCaps(w.pol.Caps(rel), addBytes, addFiles)
}

func (w *Workspace) adjustCaps(caps []policy.Subtree, addBytes, addFiles int64) {
	for _, c := range caps {
		if a, err := w.capAccount(c); err == nil {
			a.Adjust(addBytes, addFiles)
		}
	}
}

// ReserveMove checks and counts a rename of an object holding bytes and
// files (for a directory, everything in it) from one cleaned path to
// another. The scope total does not change, but a move into a capped
// subtree is checked against its cap and a move out of one frees room.
func (w *Workspace) ReserveMove(ctx context.Context, from, to string, bytes, files int64) error {
	var into, outOf []policy.Subtree
	for _, c := range w.pol.Caps(to) {
		if !c.Contains(from) {
			into = append(into, c)
		}
	}
	for _, c := range w.pol.Caps(from) {
		if !c.Contains(to) {
			outOf = append(outOf, c)
		}
	}
	if _, err := w.reserveCaps(ctx, into, bytes, files); err != nil {
		return err
	}
	w.adjustCaps(outOf, -bytes, -files)
	return nil
}

// SubtreeUsage returns what the subtree at the cleaned path rel holds, the
// directory itself included: as all holders counted it when rel is a
// capped subtree, else walked now.
func (w *Workspace) SubtreeUsage(ctx context.Context, rel string) (policy.Usage, error) {
	for _, c := range w.pol.Caps(rel) {
		if c.Prefix == rel {
			a, err := w.capAccount(c)
			if err != nil {
				return policy.Usage{}, err
			}
			return a.Usage(ctx)
		}
	}
	return w.walkUsage(ctx, rel)
}

// SubtreeQuotaState reads the account of the capped subtree at the
// cleaned path prefix (quota.Inspect) without joining it.
func (w *Workspace) SubtreeQuotaState(prefix string) (quota.State, error) {
	return w.inspectAccount(QuotaDir, capDirName(prefix))
}

// CountSubtree counts the subtree at the cleaned path rel now (a walk),
// for comparing with SubtreeUsage.
func (w *Workspace) CountSubtree(ctx context.Context, rel string) (policy.Usage, error) {
	return w.walkUsage(ctx, rel)
}

// countCap counts the capped subtree at prefix for its account: a walk,
// and what this process holds open there that the walk can't see
// (CountHeld).
func (w *Workspace) countCap(ctx context.Context, prefix string) (policy.Usage, error) {
	u, err := w.walkUsage(ctx, prefix)
	h := w.heldUsage(prefix)
	u.Bytes += h.Bytes
	u.Files += h.Files
	return u, err
}

// walkUsage counts what the subtree at rel holds, as countScope counts the
// scope: files and directories, and the apparent size of regular files.
func (w *Workspace) walkUsage(ctx context.Context, rel string) (policy.Usage, error) {
	info, err := w.Lstat(rel)
	if policy.CodeOf(err) == policy.NotFound {
		return policy.Usage{}, nil
	}
	if err != nil {
		return policy.Usage{}, err
	}
	u := policy.Usage{Files: 1}
	switch info.Kind {
	case policy.KindRegular, policy.KindLink:
		u.Bytes = info.Size
	case policy.KindDir:
		err = w.Walk(ctx, rel, func(_ string, info Info) error {
			u.Files++
			if info.Kind == policy.KindRegular || info.Kind == policy.KindLink {
				u.Bytes += info.Size
			}
			return nil
		})
	}
	return u, err
}
