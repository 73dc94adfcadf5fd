package store

import (
	"context"

	"github.com/agentloom/loomfs/policy"
)

// capUsage is what each capped subtree of the policy holds (policy.Subtree
// with MaxBytes or MaxFiles), kept like the scope's usage: walked when
// first needed, then counted from the changes this process makes, and
// forgotten by RefreshUsage. It is guarded by Workspace.usageMu. Unlike
// the scope's quota (package quota), a subtree's cap is counted by each
// process alone.
type capUsage struct {
	known bool
	used  map[string]policy.Usage // by subtree prefix
}

// ReserveAt checks that adding addBytes and addFiles at the cleaned path
// rel stays within the scope quota and the cap of every subtree rel is in
// (tmp/ in the standard policy), and counts them in each. A caller whose
// change then fails gives them back with AdjustAt. Reserve is ReserveAt
// for a change no capped subtree can see.
func (w *Workspace) ReserveAt(rel string, addBytes, addFiles int64) error {
	caps := w.pol.Caps(rel)
	if len(caps) == 0 {
		return w.Reserve(addBytes, addFiles)
	}
	w.usageMu.Lock()
	defer w.usageMu.Unlock()
	if err := w.loadCaps(context.Background()); err != nil {
		return err
	}
	for _, c := range caps {
		if err := c.CheckCap(w.caps.used[c.Prefix], addBytes, addFiles); err != nil {
			return err
		}
	}
	if err := w.Reserve(addBytes, addFiles); err != nil {
		return err
	}
	w.countCaps(caps, addBytes, addFiles)
	return nil
}

// AdjustAt counts a change at rel without checking it (shrinking, or
// undoing a ReserveAt), in the scope and in every capped subtree rel is in.
func (w *Workspace) AdjustAt(rel string, addBytes, addFiles int64) {
	w.Adjust(addBytes, addFiles)
	caps := w.pol.Caps(rel)
	if len(caps) == 0 {
		return
	}
	w.usageMu.Lock()
	defer w.usageMu.Unlock()
	w.countCaps(caps, addBytes, addFiles)
}

// ReserveMove checks and counts a rename of an object holding bytes and
// files (for a directory, everything in it) from one cleaned path to
// another. The scope total does not change, but a move into a capped
// subtree is checked against its cap and a move out of one frees room.
func (w *Workspace) ReserveMove(from, to string, bytes, files int64) error {
	w.usageMu.Lock()
	defer w.usageMu.Unlock()
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
	if len(into) == 0 && len(outOf) == 0 {
		return nil
	}
	if err := w.loadCaps(context.Background()); err != nil {
		return err
	}
	for _, c := range into {
		if err := c.CheckCap(w.caps.used[c.Prefix], bytes, files); err != nil {
			return err
		}
	}
	w.countCaps(into, bytes, files)
	w.countCaps(outOf, -bytes, -files)
	return nil
}

// SubtreeUsage returns what the subtree at the cleaned path rel holds, the
// directory itself included: counted when rel is a capped subtree, else
// walked now.
func (w *Workspace) SubtreeUsage(ctx context.Context, rel string) (policy.Usage, error) {
	w.usageMu.Lock()
	defer w.usageMu.Unlock()
	for _, c := range w.pol.Caps(rel) {
		if c.Prefix == rel {
			if err := w.loadCaps(ctx); err != nil {
				return policy.Usage{}, err
			}
			return w.caps.used[rel], nil
		}
	}
	return w.walkUsage(ctx, rel)
}

// countCaps adds to the kept usage of caps, if it is known.
func (w *Workspace) countCaps(caps []policy.Subtree, addBytes, addFiles int64) {
	if !w.caps.known {
		return
	}
	for _, c := range caps {
		u := w.caps.used[c.Prefix]
		u.Bytes += addBytes
		u.Files += addFiles
		w.caps.used[c.Prefix] = u
	}
}

func (w *Workspace) loadCaps(ctx context.Context) error {
	if w.caps.known {
		return nil
	}
	used := map[string]policy.Usage{}
	for _, s := range w.pol.Subtrees {
		if !s.Capped() {
			continue
		}
		u, err := w.walkUsage(ctx, s.Prefix)
		if err != nil {
			return err
		}
		used[s.Prefix] = u
	}
	w.caps = capUsage{known: true, used: used}
	return nil
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
