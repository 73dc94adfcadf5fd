package loom

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/agentloom/loomfs/store"
	"github.com/agentloom/loomfs/tools"
)

// WatchFence asks the volume every interval whether this node was fenced
// (store.WatchFence) until ctx ends. Once it was, the node fences itself:
// its session sandboxes are stopped and their calls refused
// (process.Service.Fence), and every container the engine runs for this
// node, one-shot commands included, is removed; it then returns the
// fence. The containers prepared for the sessions' next commands are
// removed, and no more are made. A fenced node serves again only after
// an administrator re-admits it (loomfs fence --readmit) and it is
// started afresh.
func (n *Node) WatchFence(ctx context.Context, interval time.Duration) error {
	if err := store.WatchFence(ctx, n.cfg.Store, interval); err != nil {
		return n.fenced(ctx, err)
	}
	return nil
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
	// The sessions' containers prepared for their next commands, and
	// their idle projections, go first: the pools take no command after.
	if err := n.closePools(); err != nil {
		n.cfg.Log.Error("fenced: close the command pools", zap.Error(err))
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

// exitKilled is the exit code of a command whose container was killed
// (128 + SIGKILL).
const exitKilled = 128 + 9

// fencedAfter answers a command that was killed, or failed, on a node the
// volume now records as fenced with the fence: its container was removed
// by the node's own service (WatchFence), not by the command or its
// timeout, and the caller must hear why.
func (n *Node) fencedAfter(ctx context.Context, res tools.CommandResult, err error) (tools.CommandResult, error) {
	if err == nil && (res.TimedOut || res.ExitCode != exitKilled) {
		return res, err
	}
	if fence := store.FencedNow(context.WithoutCancel(ctx), n.cfg.Store); fence != nil {
		return tools.CommandResult{}, fence
	}
	return res, err
}
