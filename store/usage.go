package store

import (
	"context"

	"github.com/agentloom/loomfs/policy"
)

// Usage returns what the scope holds, computing it by a walk the first time
// and keeping it up to date from the changes this process makes.
func (w *Workspace) Usage(ctx context.Context) (policy.Usage, error) {
	w.usageMu.Lock()
	defer w.usageMu.Unlock()
	if err := w.loadUsage(ctx); err != nil {
		return policy.Usage{}, err
	}
	return w.usage, nil
}

// RefreshUsage forgets the kept usage so the next check walks the scope
// again (after a change made outside this process).
func (w *Workspace) RefreshUsage() {
	w.usageMu.Lock()
	w.usageKnown = false
	w.caps.known = false // the capped subtrees too (subtree.go)
	w.usageMu.Unlock()
}

func (w *Workspace) loadUsage(ctx context.Context) error {
	if w.usageKnown {
		return nil
	}
	var u policy.Usage
	err := w.Walk(ctx, ".", func(rel string, info Info) error {
		u.Files++
		if info.Kind == policy.KindRegular || info.Kind == policy.KindLink {
			u.Bytes += info.Size
		}
		return nil
	})
	if err != nil {
		return err
	}
	w.usage, w.usageKnown = u, true
	return nil
}

// Reserve checks that adding addBytes and addFiles stays within the scope
// quota and counts them. A caller whose change then fails gives them back
// with Adjust.
func (w *Workspace) Reserve(addBytes, addFiles int64) error {
	w.usageMu.Lock()
	defer w.usageMu.Unlock()
	if err := w.loadUsage(context.Background()); err != nil {
		return err
	}
	if err := w.pol.Limits.CheckQuota(w.usage, addBytes, addFiles); err != nil {
		return err
	}
	w.usage.Bytes += addBytes
	w.usage.Files += addFiles
	return nil
}

// Adjust counts a change without checking it (shrinking, or undoing a
// Reserve).
func (w *Workspace) Adjust(addBytes, addFiles int64) {
	w.usageMu.Lock()
	defer w.usageMu.Unlock()
	if !w.usageKnown {
		return
	}
	w.usage.Bytes += addBytes
	w.usage.Files += addFiles
}
