package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/sandbox"
	"github.com/agentloom/loomfs/store"
)

func init() { addCommand(newCheckCmd) }

func newCheckCmd(g *globals) *cobra.Command {
	var probe bool
	var peer, scope string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "check [--probe]",
		Short: "Check this node's workspace root before serving from it",
		Long: `Check the workspace root this node is configured for (SPEC §7.1). Only the
explicit flags and their AGENT_LOOM_* variables are read (--backend, --root,
--volume-id); no .env file, and no default root: without --root it refuses.

By default the check only looks: the root exists and is a directory; on the
shared_posix backend its .agentloom-volume marker holds exactly the volume id;
and whether this user may write there (asked of the kernel; nothing is
written). It never creates a missing root or marker. A shared volume that
records this node as fenced ("loomfs fence --help") fails the check until
the node is re-admitted.

With --policy it also says what the policy holds every scope's I/O to
(io_bytes_per_s, io_ops_per_s) and how the projection caches (cache).

It also reports the sandbox runtime commands run under: the one configured
(AGENT_LOOM_SANDBOX_RUNTIME, or the engine's default) and whether the engine
(AGENT_LOOM_DOCKER_HOST) has it registered; with --probe, whether a probe
container starts under it, with the runtime's own message when it doesn't.
A configured runtime the engine lacks, or a failed probe, fails the check;
an engine that does not answer is reported, and fails the check only with
--probe.

--probe also works for real, in a random namespace
<root>/.agentloom-locks/probe-<random>/ that it removes afterwards: create,
write, fsync, read back, rename and delete files and a directory; replace a
file atomically (temporary file, fsync, rename); create a file exclusively,
saying whether RENAME_NOREPLACE works or loomfs hard-links instead; take an
advisory lock and check that a second open file description is refused it
while held. The filesystem is named as the mount table names it. On CephFS
it also says whether "loomfs fence --node <this node>" could shut this
node's mount out (fence_ready, and "fenceable" in --json): the mount's
ceph-fuse, asked over its admin socket (else read from its command line),
must carry client metadata loomfs_node naming this node and have
client_reconnect_stale off; a kernel mount can't carry the metadata. What
is missing fails the check; what can't be read is a warning.

--peer ROOT2 (with --probe) names the same volume mounted at a second path,
by another client: a second mount on this node, or a second node's mount
reached by the operator. The probe then reads each of its replaces through
the peer at once, checks that a lock held through the root is refused
through the peer, and races locked increments from both: a client that
serves old content after another's rename fails it.

The answer is honest about its reach: single_node is always true (only this
node was checked) and advisory_lock_local says the lock worked on this node,
which is not proof that another node's locks exclude this node's. Only a
trial on two real nodes shows that (see DEPLOY.md). --backend local checks a
local directory and never claims it is shared.

--scope S also compares the scope's quota account (what every process and
node that opened the scope counted) with a walk of the scope, changing
nothing. A difference fails the check only when no process has the scope
open: one writing now may not have told the account yet.

Exit status: 0 when every check passed, 1 when one failed, 2 on misuse.`,
		Example: `  loomfs check --backend shared_posix --root /mnt/agentloom-workspaces --volume-id team-v1
  loomfs check --backend shared_posix --root /mnt/agentloom-workspaces --volume-id team-v1 --probe --json
  loomfs check --backend shared_posix --root /mnt/a --volume-id team-v1 --probe --peer /mnt/b
  loomfs check --backend local --root /srv/loom/workspaces`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if g.root == "" {
				return usagef("check needs --root (or AGENT_LOOM_WORKSPACE_ROOT); it never picks a default root")
			}
			if timeout <= 0 {
				return usagef("--timeout must be positive")
			}
			if peer != "" && !probe {
				return usagef("--peer needs --probe")
			}
			opts := store.CheckOptions{Backend: g.backend, Root: g.root, VolumeID: g.volumeID, Probe: probe, Peer: peer}
			r := checkWithin(cmd.Context(), opts, timeout)
			rt := runtimeWithin(cmd.Context(), probe, timeout)
			r.OK = r.OK && rt.OK
			var qr *quotaReport
			if scope != "" && r.OK {
				ws, done, err := g.openWorkspace(cmd.Context(), scope)
				if err != nil {
					return err
				}
				q := checkQuota(cmd.Context(), ws)
				done()
				qr = &q
				r.OK = r.OK && q.allOK()
			}
			var io *ioReport
			if g.policy != "" {
				pol, err := g.loadPolicy()
				if err != nil {
					return err
				}
				io = &ioReport{BytesPerSec: pol.Limits.IOBytesPerSec, OpsPerSec: pol.Limits.IOOpsPerSec, Cache: string(cacheOf(pol))}
			}
			if g.json {
				if err := printJSON(cmd, checkOutput{r, rt, qr, io, store.LastSelfChecks(g.root)}); err != nil {
					return err
				}
			} else {
				printCheck(cmd, r, rt, qr)
				if io != nil {
					fmt.Fprintf(cmd.OutOrStdout(), "policy: %s Kernel caching: %s.\n", ioText(io), io.Cache)
				}
			}
			if !r.OK {
				return exitError{exitRefused}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&probe, "probe", false, "also do file operations, an atomic replace and a lock check in a temporary namespace, then remove it")
	cmd.Flags().DurationVar(&timeout, "timeout", time.Minute, "give up when the filesystem has not answered by then")
	cmd.Flags().StringVar(&scope, "scope", "", "also compare this scope's quota account with a walk of it (SPACE/AGENT/SESSION[/RUN/INSTANCE] or run:RUN[/INSTANCE])")
	cmd.Flags().StringVar(&peer, "peer", "", "with --probe: the same volume at a second path (another client's mount), to probe through both")
	return cmd
}

// checkWithin bounds the check by timeout. A call blocked in the kernel
// (a hard NFS mount whose server is gone) can't be interrupted; the check
// then answers failed and the blocked call is abandoned with the process.
func checkWithin(ctx context.Context, opts store.CheckOptions, timeout time.Duration) *store.CheckReport {
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	done := make(chan *store.CheckReport, 1)
	go func() { done <- store.Check(ctx, opts) }()
	select {
	case r := <-done:
		return r
	case <-ctx.Done():
		return &store.CheckReport{
			Backend: opts.Backend, Root: opts.Root, VolumeID: opts.VolumeID, Probe: opts.Probe, SingleNode: true,
			Checks: []store.CheckItem{{Name: "timeout", Detail: fmt.Sprintf(
				"the filesystem did not answer within %v; on a hard NFS mount calls wait until the server is back (see DEPLOY.md)", timeout)}},
			Meaning: store.CheckMeaning(),
		}
	}
}

// checkOutput is the --json answer: the root's report with the runtime's
// beside it.
type checkOutput struct {
	*store.CheckReport
	Sandbox sandbox.RuntimeReport `json:"sandbox_runtime"`
	Quota   *quotaReport          `json:"quota,omitempty"`
	IO      *ioReport             `json:"io_limits,omitempty"`
	// SelfChecks are the last periodic self-check of each projection, as
	// its mount recorded it (SPEC §6).
	SelfChecks []store.SelfCheck `json:"self_checks"`
}

// ioReport is what the --policy file holds every scope's I/O to, and how
// the projection caches (0: no limit).
type ioReport struct {
	BytesPerSec int64  `json:"io_bytes_per_s"`
	OpsPerSec   int64  `json:"io_ops_per_s"`
	Cache       string `json:"cache"`
}

func ioText(r *ioReport) string {
	s := policy.IOSummary(policy.Limits{IOBytesPerSec: r.BytesPerSec, IOOpsPerSec: r.OpsPerSec})
	if s == "" {
		return "No I/O limits."
	}
	return s
}

// runtimeWithin checks the sandbox runtime, bounded by timeout. Without
// probe an engine that does not answer is only reported: a node may serve
// file tools without one.
func runtimeWithin(ctx context.Context, probe bool, timeout time.Duration) sandbox.RuntimeReport {
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	rep := sandbox.CheckRuntime(ctx, sandbox.ConfigFromEnv(), probe)
	if !probe && !rep.Known && rep.EngineDefault == "" {
		rep.OK = true // no engine answered: reported, not failed
	}
	return rep
}

func printRuntime(w io.Writer, rt sandbox.RuntimeReport) {
	name := rt.Runtime
	if name == "" {
		name = "engine default"
		if rt.EngineDefault != "" {
			name += " (" + rt.EngineDefault + ")"
		}
	}
	mark := "ok  "
	if !rt.OK {
		mark = "FAIL"
	}
	detail := "known to the engine"
	switch {
	case rt.EngineDefault == "" && !rt.Known:
		detail = "the engine did not answer"
	case !rt.Known:
		detail = "not known to the engine"
	case rt.ProbeOK:
		detail = "known to the engine; a probe container started and exited 0"
	case rt.Probed:
		detail = "known to the engine; the probe container failed"
	}
	if rt.Message != "" {
		detail += ": " + rt.Message
	}
	fmt.Fprintf(w, "  %s  %-21s %s: %s\n", mark, "sandbox_runtime", name, detail)
}

func printCheck(cmd *cobra.Command, r *store.CheckReport, rt sandbox.RuntimeReport, qr *quotaReport) {
	w := cmd.OutOrStdout()
	fmt.Fprintf(w, "loomfs check: backend %s, root %s", r.Backend, r.Root)
	if r.VolumeID != "" {
		fmt.Fprintf(w, ", volume id %q", r.VolumeID)
	}
	if r.Filesystem != "" {
		fmt.Fprintf(w, ", filesystem %s", r.Filesystem)
	}
	fmt.Fprintf(w, ", node %s\n", r.Node)
	for _, c := range r.Checks {
		mark := "ok  "
		if !c.OK {
			mark = "FAIL"
		}
		fmt.Fprintf(w, "  %s  %-21s %s\n", mark, c.Name, c.Detail)
	}
	printRuntime(w, rt)
	if qr != nil {
		printQuota(w, *qr)
	}
	for _, s := range r.Warnings {
		fmt.Fprintf(w, "  warning: %s\n", s)
	}
	fmt.Fprintf(w, "single_node: true — %s\n", r.Meaning["single_node"])
	lock := "false — not checked (add --probe)"
	switch {
	case r.AdvisoryLockLocal:
		lock = "true — the lock worked on this node; that is not proof it excludes other nodes"
	case r.Probe:
		lock = "false — the probe did not show working locks"
	}
	fmt.Fprintf(w, "advisory_lock_local: %s\n", lock)
	if r.OK {
		fmt.Fprintln(w, "result: ok")
	} else {
		fmt.Fprintln(w, "result: FAILED")
	}
}
