package retention

import (
	"context"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// ClearOptions say how ClearTemporary runs.
type ClearOptions struct {
	// Locked says the caller already holds the scope lock; otherwise
	// ClearTemporary takes it, waiting as long as ctx allows.
	Locked bool
}

// ClearTemporary empties the subtrees the policy marks clear_at_run_end
// (tmp/ in the standard policy), keeping the directories themselves; the
// runtime calls it at the end of a run. It refuses while a command runs
// in the scope or the scope is quarantined, and returns what it removed.
func ClearTemporary(ctx context.Context, ws *store.Workspace, opt ClearOptions) (policy.Usage, error) {
	var total policy.Usage
	dirs := ws.Policy().TemporaryDirs()
	if len(dirs) == 0 {
		return total, nil
	}
	if err := ws.CheckIdle(); err != nil {
		return total, err
	}
	if !opt.Locked {
		unlock, err := ws.Lock(ctx)
		if err != nil {
			return total, err
		}
		defer unlock()
		if err := ws.CheckIdle(); err != nil {
			return total, err
		}
	}
	for _, d := range dirs {
		u, err := ws.Unfiltered().ClearDir(ctx, d)
		total.Bytes += u.Bytes
		total.Files += u.Files
		if err != nil {
			return total, err
		}
	}
	ws.RefreshUsage(ctx)
	return total, nil
}
