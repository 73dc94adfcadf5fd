// Package fence shuts a node presumed dead out of a shared CephFS volume
// before its work moves to another node, so that nothing it left behind
// (a buffered write flushed late, a process that was only paused) lands
// after the takeover.
//
// Only the storage can refuse those bytes: a lock lapses at the server
// while descriptors already open keep working, and a record loomfs keeps
// is checked by nobody at the moment the bytes land. CephFS can: an
// instance blocklisted at the OSDs has every operation refused, and the
// MDS's OSD epoch barrier keeps the next owner from racing the evicted
// one's in-flight writes. A fence finds the node's instances by the
// client metadata its mount carries (NodeKey), never by IP, blocklists
// each for a long expiry first (the monitor does not extend an entry, so
// the MDS's own eviction would leave the default hour), then evicts its
// sessions and waits for the barrier. The evicted client answers ESHUTDOWN
// from then on and, with client_reconnect_stale off, never comes back on
// its own: only a fresh mount makes a new instance.
package fence

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// DefaultExpire is how long a fence's blocklist entries last unless the
// operator says otherwise: five years, as ceph-csi's fences, since Ceph
// has no entry that never lapses. A fence is lifted by re-admitting the
// node with a fresh mount, never by the entry's expiry.
const DefaultExpire = 5 * 365 * 24 * time.Hour

// Methods of a fence.
const (
	// MethodCeph: the node's CephFS client instances were blocklisted and
	// evicted by this command.
	MethodCeph = "ceph_evict"
	// MethodExternal: the operator confirmed the node can no longer write
	// (powered off, cut from the export) where loomfs can't fence it.
	MethodExternal = "confirmed_externally"
)

// ErrNoInstances is a fence that found no instance of the node to evict.
var ErrNoInstances = errors.New("no client instance of the node has a session with the MDS")

// Result is what a Ceph fence did.
type Result struct {
	Instances []Instance
	// OSDEpoch is the OSD map epoch that carries the blocklist entries,
	// and Barrier the MDS's epoch barrier once it reached it.
	OSDEpoch, Barrier int64
	// Warnings say what the fence could not make sure of.
	Warnings []string
}

// rounds bounds the list-and-evict passes: an instance of the node that
// appears while it is fenced (a remount) is fenced by the next pass; one
// that keeps appearing means something remounts it.
const rounds = 3

// Fence blocklists every client instance whose metadata names node for
// expire, evicts their sessions, and returns once the MDS's epoch
// barrier has reached the OSD map that carries the entries. It never
// touches an instance of another node, and fails with ErrNoInstances if
// it finds none of node's.
func (c *Ceph) Fence(ctx context.Context, node string, expire time.Duration) (Result, error) {
	var res Result
	fenced := map[string]bool{}
	unlabelled := 0
	for round := 0; ; round++ {
		list, err := c.Clients(ctx)
		if err != nil {
			return res, err
		}
		var todo []Instance
		unlabelled = 0
		for _, in := range list {
			switch {
			case in.Node == "":
				unlabelled++
			case in.Node == node && !fenced[in.Addr]:
				todo = append(todo, in)
			}
		}
		if len(todo) == 0 {
			break
		}
		if round == rounds {
			return res, fmt.Errorf("fence node %s: its client instances keep appearing (%d new after %d passes): something remounts it; stop it first", node, len(todo), rounds)
		}
		// Blocklist first, so each entry has the fence's expiry; the
		// eviction then closes the session at once and sets the barrier.
		before, err := c.osdEpoch(ctx)
		if err != nil {
			return res, fmt.Errorf("fence node %s: %w", node, err)
		}
		var addrs []string
		for _, in := range todo {
			addrs = append(addrs, in.Addr)
		}
		for _, in := range todo {
			if err := c.Blocklist(ctx, in.Addr, expire); err != nil {
				return res, fmt.Errorf("fence node %s: blocklist client.%d: %w", node, in.ID, err)
			}
			fenced[in.Addr] = true
			res.Instances = append(res.Instances, in)
		}
		// The barrier must reach the first OSD map that carries the
		// entries, and no more: another change of the map meanwhile (any
		// blocklist entry lapsing) has a later epoch, which the barrier
		// the evictions set need not reach (a wait for it never ended).
		after, err := c.osdEpoch(ctx)
		if err == nil {
			var epoch int64
			epoch, err = c.firstEpochWith(ctx, before, after, addrs)
			res.OSDEpoch = max(res.OSDEpoch, epoch)
		}
		if err != nil {
			return res, fmt.Errorf("fence node %s: %w", node, err)
		}
		for _, in := range todo {
			if err := c.Evict(ctx, in.ID); err != nil {
				return res, fmt.Errorf("fence node %s: evict client.%d (already blocklisted): %w", node, in.ID, err)
			}
		}
	}
	if len(res.Instances) == 0 {
		why := fmt.Sprintf("it is not mounted, or its mount carries no %s metadata", NodeKey)
		if unlabelled > 0 {
			why += fmt.Sprintf(" (%d instance(s) carry none, and could be its)", unlabelled)
		}
		return res, fmt.Errorf("fence node %s: %w: %s, or the MDS evicted it already (for the monitor's default blocklist expiry, an hour)", node, ErrNoInstances, why)
	}
	if unlabelled > 0 {
		res.Warnings = append(res.Warnings, fmt.Sprintf("%d client instance(s) of the file system carry no %s metadata; if one is node %s's, it was not fenced", unlabelled, NodeKey, node))
	}
	if err := c.waitBarrier(ctx, &res); err != nil {
		return res, fmt.Errorf("fence node %s: %w", node, err)
	}
	return res, c.checkBlocklist(ctx, &res, expire)
}

// waitBarrier waits until the MDS's OSD epoch barrier has reached the
// OSD map that carries the fence's entries: from then on the MDS hands
// out no capability to the objects the evicted instances were writing
// without that map, so no write of theirs can land after the new owner's.
func (c *Ceph) waitBarrier(ctx context.Context, res *Result) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		osdmap, barrier, err := c.Epochs(ctx)
		if err != nil {
			return err
		}
		if res.OSDEpoch == 0 {
			res.OSDEpoch = osdmap
		}
		res.Barrier = barrier
		if barrier >= res.OSDEpoch {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the MDS's OSD epoch barrier is %d after 30 s, below the blocklist's epoch %d", barrier, res.OSDEpoch)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// checkBlocklist reads each fenced instance's entry back: present, and
// with its expiry. An entry made before the fence (the MDS evicted the
// instance on its own a moment earlier) keeps its shorter expiry, which
// the fence can't extend without lifting it: that is a warning.
func (c *Ceph) checkBlocklist(ctx context.Context, res *Result, expire time.Duration) error {
	list, err := c.Blocklisted(ctx)
	if err != nil {
		return err
	}
	var missing []string
	for i, in := range res.Instances {
		until, ok := list[in.Addr]
		if !ok {
			missing = append(missing, in.Addr)
			continue
		}
		res.Instances[i].BlocklistedUntil = until
		if until.Before(time.Now().Add(expire / 2)) {
			res.Warnings = append(res.Warnings, fmt.Sprintf("client.%d's blocklist entry lapses at %s, as set before this fence (by the MDS's own eviction); after that the instance, if it still runs, is no longer refused: make sure it is stopped before then", in.ID, until.UTC().Format(time.RFC3339)))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("blocklist entries missing after the fence: %s", strings.Join(missing, ", "))
	}
	return nil
}
