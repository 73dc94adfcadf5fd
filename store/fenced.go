package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/fence"
	"github.com/agentloom/loomfs/nodeid"
	"github.com/agentloom/loomfs/policy"
)

// refuseFenced refuses a shared volume that records this node as fenced
// (loomfs fence wrote its record there), until an administrator re-admits
// it. The fenced mount itself answers ESHUTDOWN to everything; this is
// what keeps a fresh mount of the node (a remount, a restart) from
// serving again on its own: the new client instance is not on the
// blocklist, but the record is on the volume.
func refuseFenced(root string) error {
	node, err := nodeid.Name()
	if err != nil || fence.CheckNode(node) != nil {
		return nil // no record can name this node
	}
	rec, err := fence.Read(root, node)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case errors.Is(err, unix.ESHUTDOWN):
		return policy.AsError(err)
	case err != nil:
		return policy.Errorf(policy.VolumeUnavailable, "shared volume unavailable: this node's fence record %s can't be read (%v); loomfs serves nothing from a volume that may record this node as fenced", filepath.Join(fence.Dir, node+".json"), errors.Unwrap(err))
	}
	return FencedError(rec)
}

// FencedError is the refusal of a node the volume records as fenced: the
// model's message is policy.FencedMessage, and the operator's names the
// fence and the way back.
func FencedError(rec fence.Record) error {
	return fmt.Errorf("node %s was fenced from this volume at %s by node %s (%s; record %s): it serves nothing from it until an administrator re-admits it (unmount, mount afresh, then loomfs fence --readmit --node %s): %w",
		rec.Node, rec.Time.UTC().Format(time.RFC3339), rec.By, rec.Method, filepath.Join(fence.Dir, rec.Node+".json"), rec.Node, policy.Fenced(nil))
}

// FenceCheckEvery is how often a long-running door asks the volume
// whether this node was fenced (WatchFence).
const FenceCheckEvery = 2 * time.Second

// FencedNow returns the refusal of this node if the volume of cfg now
// shuts it out (its storage client answers ESHUTDOWN, or the volume
// records its fence), and nil otherwise, the volume's other troubles
// included: those are the self-check's.
func FencedNow(ctx context.Context, cfg Config) error {
	if cfg.Backend != BackendSharedPOSIX {
		return nil // only a shared volume is fenced
	}
	vol, err := OpenVolume(ctx, cfg)
	if err == nil {
		vol.Close()
		return nil
	}
	if policy.IsFenced(err) {
		return err
	}
	return nil
}

// WatchFence asks every interval whether this node was fenced from the
// volume of cfg (FencedNow), and returns the fence once it was; nil when
// ctx ends first.
func WatchFence(ctx context.Context, cfg Config, interval time.Duration) error {
	if cfg.Backend != BackendSharedPOSIX {
		<-ctx.Done()
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
		if err := FencedNow(ctx, cfg); err != nil {
			return err
		}
	}
}
