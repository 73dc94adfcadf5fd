package loom

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// FenceCheckEvery is how often WatchFence asks the volume whether this
// node was fenced.
const FenceCheckEvery = 2 * time.Second

// WatchFence asks the volume every interval whether this node was fenced
// (its storage client answers ESHUTDOWN, or the volume records its fence)
// until ctx ends. Once it was, the node fences itself: its session
// sandboxes are stopped and their calls refused (process.Service.Fence),
// and every container the engine runs for this node, one-shot commands
// included, is removed; it then returns the fence. A fenced node serves
// again only after an administrator re-admits it (loomfs fence --readmit)
// and it is started afresh.
func (n *Node) WatchFence(ctx context.Context, interval time.Duration) error {
	if n.cfg.Store.Backend != store.BackendSharedPOSIX {
		<-ctx.Done() // only a shared volume is fenced
		return nil
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		vol, err := store.OpenVolume(ctx, n.cfg.Store)
		if err == nil {
			vol.Close()
			continue
		}
		if !policy.IsFenced(err) {
			continue // the volume's other troubles are the self-check's
		}
		return n.fenced(ctx, err)
	}
}

// fenced stops everything this node runs on the volume after its fence.
func (n *Node) fenced(ctx context.Context, cause error) error {
	start := time.Now()
	n.cfg.Log.Error("this node was fenced from the volume: stopping its session sandboxes and containers", zap.Error(cause))
	ctx = context.WithoutCancel(ctx)
	var stopErr error
	if n.svc != nil {
		stopErr = n.svc.Fence(ctx, cause)
	}
	removed := 0
	if n.runner != nil {
		cs, err := n.runner.RemoveNode(ctx)
		removed = len(cs)
		if err != nil {
			n.cfg.Log.Error("fenced: remove this node's containers", zap.Error(err))
		}
	}
	n.cfg.Log.Error("fenced: this node's work is stopped", zap.Int("containers_removed", removed), zap.Duration("took", time.Since(start)), zap.NamedError("sandbox_stop", stopErr))
	return fmt.Errorf("%w (session sandboxes stopped, %d container(s) removed in %s)", cause, removed, time.Since(start).Round(time.Millisecond))
}
