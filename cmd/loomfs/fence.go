package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/fence"
	"github.com/agentloom/loomfs/nodeid"
	"github.com/agentloom/loomfs/store"
)

func init() { addCommand(newFenceCmd) }

const fenceHelp = `Shuts node N out of the shared volume before another node takes over its
work, so that nothing N left behind (a buffered write, a paused process, a
remount) can land afterwards. Run it from any other node (or an
administrator's host) that sees the volume and may run "ceph" on the cluster.

On CephFS it blocklists every client instance whose mount carries
client_metadata loomfs_node=N (never another node's, never by IP) for
--expire, evicts their sessions, waits for the MDS's OSD epoch barrier,
records the fence on the volume and in the audit, and only then answers.
Each node's mount must carry that metadata and client_reconnect_stale off
(see DEPLOY.md).

Once the fence holds, and before it is recorded, it keeps high-water marks of
what N wrote: the length of each of N's audit files and change journal files
and of every call log, and the scopes where N had a marker or a quarantine.
Whatever N still wrote past them is ignored by every reader: "loomfs audit
query" and "tail" skip it and "audit verify" reports it; a call N finished
after the fence is not replayed, a journal with N's late lines is not trusted
by snapshots, and N's late markers and quarantines are set aside (see
DEPLOY.md).

On any other filesystem loomfs can't fence a node: it refuses and says what
to do instead. Once the operator has made sure N can't write,
--confirm-fenced-externally records the fence without touching the storage.

A node the volume records as fenced serves nothing from it: "loomfs mount",
"serve", "tool", "run" and every command that opens the volume refuse on it,
even through a fresh mount. "loomfs fence --readmit --node N" re-admits it,
once its loomfs processes and containers are stopped and its volume is
mounted afresh: it reads N's fence record (refusing if there is none) and,
run on N itself over ceph-fuse, refuses while N's mount is still one of the
fenced client instances; then it audits the re-admission and lifts the
record.`

// nfsInstead is what an operator must do where loomfs can't fence.
const nfsInstead = `make sure it can no longer write: power it off (or fence it through its power
controller), or remove it from the export at the server and restart the server's
grace period, or, at the least, wait until its NFSv4 lease has expired plus the
server's grace period while it stays cut off; then run again with
--confirm-fenced-externally`

func newFenceCmd(g *globals) *cobra.Command {
	var node, reason string
	var expire time.Duration
	var confirmed, readmit bool
	var ceph fence.Ceph
	cmd := &cobra.Command{
		Use:   "fence --node N [--reason TEXT] | fence --readmit --node N",
		Short: "Shut a node presumed dead out of the volume before its work moves (administrators)",
		Long:  fenceHelp,
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if err := fence.CheckNode(node); err != nil {
				return usagef("--node: %v", err)
			}
			if readmit {
				if confirmed {
					return usagef("--readmit re-admits a fenced node; --confirm-fenced-externally fences one")
				}
				return g.readmit(cmd, node, reason)
			}
			if self, err := nodeid.Name(); err == nil && self == node {
				return usagef("--node %s is this node: a node is fenced from another one", node)
			}
			if expire < time.Hour {
				return usagef("--expire %s: want at least an hour (the default is %s)", expire, fence.DefaultExpire)
			}
			vol, err := store.OpenVolume(ctx, g.storeConfig())
			if err != nil {
				return err
			}
			defer vol.Close()
			by, err := nodeid.Name()
			if err != nil {
				return err
			}
			rec := fence.Record{Node: node, Reason: reason, By: by, Time: time.Now().UTC()}
			fs := store.Filesystem(vol.Path())
			switch {
			case confirmed:
				rec.Method = fence.MethodExternal
			case fs == "ceph" || fs == "fuse.ceph-fuse":
				start := time.Now()
				res, err := ceph.Fence(ctx, node, expire)
				if err != nil {
					if errors.Is(err, fence.ErrNoInstances) {
						return fmt.Errorf("%w; nothing was fenced. If node %s is down for sure, %s", err, node, "run again with --confirm-fenced-externally")
					}
					return fmt.Errorf("%w; the fence is not complete: run it again before any takeover", err)
				}
				rec.Method = fence.MethodCeph
				rec.Instances, rec.OSDEpoch, rec.Barrier, rec.Warnings = res.Instances, res.OSDEpoch, res.Barrier, res.Warnings
				rec.Took = time.Since(start)
			default:
				return fmt.Errorf("the volume is on %s, where loomfs can't fence a node (no API shuts one client out); before another node takes over node %s's work, %s", fs, node, nfsInstead)
			}
			// The takeover's high-water marks: what the node's records
			// held once the fence held (fence.Marks), so readers can tell
			// anything it still wrote after from what it wrote before.
			lengths, err := fenceLengths(vol, node)
			if err == nil {
				_, err = fence.AddMarks(vol.Path(), node, rec.Time, lengths)
			}
			if err != nil {
				return fmt.Errorf("node %s is fenced but %w; run it again before any takeover", node, err)
			}
			rec.AuditMarked, rec.JournalsMarked, rec.CallLogsMarked, rec.MarkerScopes = len(lengths.Audit), len(lengths.Journals), len(lengths.Calls), len(lengths.Markers)
			if err := fence.Write(vol.Path(), rec); err != nil {
				return fmt.Errorf("node %s is fenced but %w; run it again before any takeover", node, err)
			}
			if err := auditFence(cmd, vol.Path(), rec); err != nil {
				return fmt.Errorf("node %s is fenced and recorded on the volume, but the audit log can't be written: %w", node, err)
			}
			return printFence(cmd, g.json, rec)
		},
	}
	f := cmd.Flags()
	f.StringVar(&node, "node", "", "the node to fence, as its mounts' loomfs_node metadata and its $AGENT_LOOM_NODE name it")
	f.StringVar(&reason, "reason", "", "why, for the record and the audit")
	f.DurationVar(&expire, "expire", fence.DefaultExpire, "how long the blocklist entries last (a fence is lifted by a fresh mount, not by this)")
	f.BoolVar(&confirmed, "confirm-fenced-externally", false, "record a fence the operator made outside loomfs (power-off, export removal)")
	f.BoolVar(&readmit, "readmit", false, "re-admit fenced node N once it is stopped and mounted afresh: checks and lifts its fence record")
	f.StringVar(&ceph.Conf, "ceph-conf", os.Getenv("CEPH_CONF"), "ceph.conf of the volume's cluster ($CEPH_CONF)")
	f.StringVar(&ceph.ID, "ceph-id", "", "cephx user that may evict clients and blocklist (default: ceph's own)")
	f.StringVar(&ceph.FS, "ceph-fs", "", "the CephFS file system's name, if the cluster has several")
	cmd.MarkFlagRequired("node")
	return cmd
}

// fenceLengths measures node's records for the marks of its fence or
// its re-admission: its audit files, and its records in the scopes' state
// directories.
func fenceLengths(vol *store.Volume, node string) (fence.Lengths, error) {
	l, err := vol.FenceLengths(node)
	if err != nil {
		return l, fmt.Errorf("measure node %s's records: %w", node, err)
	}
	if l.Audit, err = audit.FenceLengths(audit.Dir(vol.Path()), node); err != nil {
		return l, fmt.Errorf("measure node %s's audit files: %w", node, err)
	}
	return l, nil
}

// auditFence records the fence as an administrator's action; unlike
// other admin actions a fence fails when it can't be audited.
func auditFence(cmd *cobra.Command, root string, rec fence.Record) error {
	log, err := audit.Open(root, audit.Options{})
	if err != nil {
		return err
	}
	defer log.Close()
	detail := map[string]any{"node": rec.Node, "method": rec.Method, "reason": rec.Reason, "by": rec.By}
	var addrs []string
	for _, in := range rec.Instances {
		addrs = append(addrs, fmt.Sprintf("client.%d %s", in.ID, in.Addr))
	}
	if len(addrs) > 0 {
		detail["instances"] = addrs
		detail["osd_epoch"] = rec.OSDEpoch
	}
	return log.Record(cmd.Context(), audit.Event{Source: audit.SourceAdmin, Op: "fence", Result: "ok", Duration: rec.Took, Detail: detail})
}

func printFence(cmd *cobra.Command, asJSON bool, rec fence.Record) error {
	out := cmd.OutOrStdout()
	if asJSON {
		return json.NewEncoder(out).Encode(rec)
	}
	switch rec.Method {
	case fence.MethodExternal:
		fmt.Fprintf(out, "node %s recorded as fenced by the operator\n", rec.Node)
	default:
		fmt.Fprintf(out, "node %s fenced in %s: %d client instance(s) blocklisted and evicted, OSD epoch barrier %d\n", rec.Node, rec.Took.Round(time.Millisecond), len(rec.Instances), rec.Barrier)
		for _, in := range rec.Instances {
			fmt.Fprintf(out, "  client.%d %s (boot %s) blocklisted until %s\n", in.ID, in.Addr, in.Boot, in.BlocklistedUntil.Format(time.RFC3339))
		}
	}
	for _, w := range rec.Warnings {
		fmt.Fprintf(cmd.ErrOrStderr(), "loomfs: warning: %s\n", w)
	}
	return nil
}

const fencedClearHelp = `After "loomfs fence --node N", "loomfs quarantine clear --fenced-node N" clears
in one step every quarantine whose record names node N as the node that ran the
command (a scope N's dead worker left marked is settled into its quarantine
first). It needs N's fence record on the volume, and checks no container: N's
containers and the processes that held their projections may still run on N,
but a fenced node writes nothing any more. They must be stopped before N is
re-admitted with a fresh mount.`

// clearFenced clears every quarantine node left, once node is fenced:
// what its containers could still do to the volume, the fence stops.
func (g *globals) clearFenced(cmd *cobra.Command, node string) error {
	ctx := cmd.Context()
	if err := fence.CheckNode(node); err != nil {
		return usagef("--fenced-node: %v", err)
	}
	vol, err := store.OpenVolume(ctx, g.storeConfig())
	if err != nil {
		return err
	}
	defer vol.Close()
	rec, err := fence.Read(vol.Path(), node)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("node %s has no fence record on this volume: fence it first (loomfs fence --node %s); nothing cleared", node, node)
	}
	if err != nil {
		return err
	}
	if err := g.settleMarkers(ctx, vol); err != nil {
		return err
	}
	ms, err := vol.Quarantines()
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	n := 0
	for _, m := range ms {
		if m.Node != node {
			continue
		}
		sc, err := parseScopeFlag(m.Scope)
		if err != nil {
			return err
		}
		if err := vol.ClearQuarantine(sc, m.Container); err != nil {
			return fmt.Errorf("cleared %d quarantine(s) of node %s, then: %w", n, node, err)
		}
		g.auditAdmin(ctx, "quarantine_clear", sc, map[string]any{"container": m.Container, "fenced_node": node, "fenced_at": rec.Time})
		fmt.Fprintf(out, "cleared the quarantine of %s (container %s of fenced node %s)\n", sc, m.Container, node)
		n++
	}
	fmt.Fprintf(out, "%d quarantine(s) of node %s cleared (fenced %s, %s); no other marker, lock or file was touched\n", n, node, rec.Time.Format(time.RFC3339), rec.Method)
	return nil
}

// readmit lifts node's fence record after checking it, so that the node
// may serve the volume again through a fresh mount. Run on the node
// itself over ceph-fuse, it refuses while the node's mount is one of the
// fenced instances: that mount can never serve again.
func (g *globals) readmit(cmd *cobra.Command, node, reason string) error {
	ctx := cmd.Context()
	cfg := g.storeConfig()
	cfg.IgnoreFence = true
	vol, err := store.OpenVolume(ctx, cfg)
	if err != nil {
		return err
	}
	defer vol.Close()
	rec, err := fence.Read(vol.Path(), node)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("node %s has no fence record on this volume: nothing to re-admit", node)
	}
	if err != nil {
		return err
	}
	checked := "its mount was not checked (run on node " + node + " itself to have it checked)"
	if self, _ := nodeid.Name(); self == node && store.Filesystem(vol.Path()) == "fuse.ceph-fuse" {
		m, err := fence.FindMount(ctx, store.MountPoints(vol.Path()))
		if err != nil {
			return fmt.Errorf("node %s not re-admitted: can't tell whether its mount is a fresh one: %w", node, err)
		}
		fenced := m.Blocklisted
		for _, in := range rec.Instances {
			fenced = fenced || m.Addr == in.Addr
		}
		if fenced {
			return fmt.Errorf("node %s not re-admitted: its mount is still a fenced client instance (client.%d %s), which can never serve again: stop this node's loomfs processes and containers, unmount it and mount afresh, then re-admit", node, m.ID, m.Addr)
		}
		checked = fmt.Sprintf("its mount is a fresh client instance (client.%d)", m.ID)
	}
	// The window of bytes written after the fence closes here, before
	// anything of the re-admission is written (run on the node, its
	// audit record goes to the node's own chain): the node's old
	// processes are stopped, so what follows is the re-admitted node's.
	lengths, err := fenceLengths(vol, node)
	if err == nil {
		_, err = fence.Readmitted(vol.Path(), node, lengths)
	}
	if err != nil {
		return fmt.Errorf("node %s not re-admitted: %w", node, err)
	}
	log, err := audit.Open(vol.Path(), audit.Options{})
	if err != nil {
		return fmt.Errorf("node %s not re-admitted: the audit log can't be written: %w", node, err)
	}
	defer log.Close()
	by, _ := nodeid.Name()
	detail := map[string]any{"node": node, "by": by, "reason": reason, "fenced_at": rec.Time, "fenced_by": rec.By, "method": rec.Method}
	if err := log.Record(ctx, audit.Event{Source: audit.SourceAdmin, Op: "readmit", Result: "ok", Detail: detail}); err != nil {
		return fmt.Errorf("node %s not re-admitted: the audit log can't be written: %w", node, err)
	}
	if err := fence.Remove(vol.Path(), node); err != nil {
		return err
	}
	if g.json {
		return json.NewEncoder(cmd.OutOrStdout()).Encode(map[string]any{"node": node, "readmitted": true, "fenced_at": rec.Time, "checked": checked})
	}
	fmt.Fprintf(cmd.OutOrStdout(), "node %s re-admitted (fenced %s by %s, %s); %s\n", node, rec.Time.Format(time.RFC3339), rec.By, rec.Method, checked)
	return nil
}
