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
	"time"

	"golang.org/x/sync/errgroup"
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
//
// Each ceph command costs a process start and a round trip to the
// cluster (about a second on a loaded node), so a fence asks as little
// as it can and asks at once what does not depend on another answer:
// the client list with the OSD map's epoch before the entries, and the
// next pass's client list while the barrier rises. The OSD map that
// carries the entries is also where their expiries are read back.
func (c *Ceph) Fence(ctx context.Context, node string, expire time.Duration) (Result, error) {
	var res Result
	fenced := map[string]bool{}
	var list []Instance
	var before int64
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() (err error) { list, err = c.Clients(gctx); return err })
	g.Go(func() (err error) { before, err = c.osdEpoch(gctx); return err })
	if err := g.Wait(); err != nil {
		return res, fmt.Errorf("fence node %s: %w", node, err)
	}
	unlabelled := 0
	for round := 0; ; round++ {
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
		if round > 0 {
			var err error
			if before, err = c.osdEpoch(ctx); err != nil {
				return res, fmt.Errorf("fence node %s: %w", node, err)
			}
		}
		// Blocklist first, so each entry has the fence's expiry; the
		// eviction then closes the session at once and sets the barrier.
		for _, in := range todo {
			if err := c.Blocklist(ctx, in.Addr, expire); err != nil {
				return res, fmt.Errorf("fence node %s: blocklist client.%d: %w", node, in.ID, err)
			}
			fenced[in.Addr] = true
		}
		epoch, entries, err := c.epochWith(ctx, before, todo)
		if err != nil {
			return res, fmt.Errorf("fence node %s: %w", node, err)
		}
		res.OSDEpoch = max(res.OSDEpoch, epoch)
		res.Warnings = append(res.Warnings, entryWarnings(todo, entries, expire)...)
		res.Instances = append(res.Instances, todo...)
		for _, in := range todo {
			if err := c.Evict(ctx, in.ID); err != nil {
				return res, fmt.Errorf("fence node %s: evict client.%d (already blocklisted): %w", node, in.ID, err)
			}
		}
		// Whether another instance of the node appeared meanwhile is
		// asked while the barrier rises.
		g, gctx := errgroup.WithContext(ctx)
		g.Go(func() (err error) { list, err = c.Clients(gctx); return err })
		g.Go(func() error { return c.waitBarrier(gctx, &res) })
		if err := g.Wait(); err != nil {
			return res, fmt.Errorf("fence node %s: %w", node, err)
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
	return res, nil
}

// waitBarrier waits until the MDS's OSD epoch barrier has reached the
// OSD map that carries the fence's entries (res.OSDEpoch): from then on
// the MDS hands out no capability to the objects the evicted instances
// were writing without that map, so no write of theirs can land after
// the new owner's.
func (c *Ceph) waitBarrier(ctx context.Context, res *Result) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		barrier, err := c.barrier(ctx)
		if err != nil {
			return err
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

// entryWarnings reads each fenced instance's entry back from the OSD map
// that carries it, and warns of one made before the fence (the MDS
// evicted the instance on its own a moment earlier): it keeps its
// shorter expiry, which the fence can't extend without lifting it. It
// sets each instance's BlocklistedUntil.
func entryWarnings(todo []Instance, entries map[string]time.Time, expire time.Duration) []string {
	var warnings []string
	for i, in := range todo {
		until := entries[in.Addr]
		todo[i].BlocklistedUntil = until
		if until.Before(time.Now().Add(expire / 2)) {
			warnings = append(warnings, fmt.Sprintf("client.%d's blocklist entry lapses at %s, as set before this fence (by the MDS's own eviction); after that the instance, if it still runs, is no longer refused: make sure it is stopped before then", in.ID, until.UTC().Format(time.RFC3339)))
		}
	}
	return warnings
}
