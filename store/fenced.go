package store

import (
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
