package main

import (
	"context"
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/agentloom/loomfs/nodeid"

	"github.com/spf13/cobra"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/sandbox"
	"github.com/agentloom/loomfs/store"
)

func init() { addCommand(newQuarantineCmd) }

const quarantineProcedure = `A scope is quarantined when a sandbox command's container could not be
confirmed removed (the worker died, or the engine did not answer), or when,
after the engine removed it, processes other than loomfs still held the
command's projection (a runtime's helpers that outlived the container; the
record lists their pids and command lines under "holders"). Writes and
commands are refused there until an administrator clears it; reads work.
A worker that died leaves its execution marker: list, show and clear take
the scope's lock for a moment, and a marker no live worker holds becomes
the quarantine record it stands for (a command in flight is left alone).

Recovery:
  1. Stop new tasks and resumes for that workspace; keep the marker, the run
     record and the logs.
  2. "loomfs quarantine show --scope S" names the container and the node that
     ran it. On that node's engine, check the container; if the node is
     unclear, check every node that could have run it.
  3. Make sure the old worker, its docker client and any pending create
     request can no longer start a container, then stop and remove the
     container if it still exists, and stop the holders the record names.
     One "No such container" answer right after
     a killed client does not prove a pending create won't land later.
  4. Only then run "loomfs quarantine clear --scope S --container NAME" (it
     refuses while that container exists on the local engine or a holder
     still runs on this node, and touches
     nothing but that scope's quarantine record), and resume tasks.
Deleting the marker by hand, waiting for it to expire, or retrying the command
are not safe recoveries.`

func newQuarantineCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "quarantine list|show|clear",
		Short: "Inspect and clear quarantined workspaces (administrators)",
		Long:  quarantineProcedure,
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			return usagef("quarantine needs a subcommand: list, show or clear")
		},
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "list",
		Short: "List every quarantined scope on the volume",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			vol, err := store.OpenVolume(cmd.Context(), g.storeConfig())
			if err != nil {
				return err
			}
			defer vol.Close()
			if err := g.settleMarkers(cmd.Context(), vol); err != nil {
				return err
			}
			ms, err := vol.Quarantines()
			if err != nil {
				return err
			}
			if g.json {
				if ms == nil {
					ms = []store.Marker{}
				}
				return json.NewEncoder(cmd.OutOrStdout()).Encode(ms)
			}
			if len(ms) == 0 {
				fmt.Fprintln(cmd.OutOrStdout(), "no quarantined scopes")
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SCOPE\tCONTAINER\tNODE\tRUN\tCALL\tSINCE")
			for _, m := range ms {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", m.Scope, m.Container, m.Node, m.Run, m.Call, m.Time.UTC().Format(time.RFC3339))
			}
			return tw.Flush()
		},
	})
	var scope, container, fencedNode string
	show := &cobra.Command{
		Use:   "show --scope S",
		Short: "Show one scope's quarantine record",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			sc, vol, err := g.scopeVolume(cmd.Context(), scope)
			if err != nil {
				return err
			}
			defer vol.Close()
			if err := g.settleMarker(cmd.Context(), sc.String(), settleWait); err != nil {
				return err
			}
			m, err := vol.Quarantine(sc)
			if err != nil {
				return err
			}
			if m == nil {
				fmt.Fprintf(cmd.OutOrStdout(), "scope %s is not quarantined\n", sc)
				return nil
			}
			enc := json.NewEncoder(cmd.OutOrStdout())
			enc.SetIndent("", "  ")
			return enc.Encode(m)
		},
	}
	show.Flags().StringVar(&scope, "scope", "", "scope SPACE/AGENT/SESSION[/RUN/INSTANCE] (required)")
	show.MarkFlagRequired("scope")
	clear := &cobra.Command{
		Use:   "clear --scope S --container NAME | clear --fenced-node N",
		Short: "Clear one scope's quarantine once its container is confirmed gone, or every one a fenced node left",
		Long:  "Clear one scope's quarantine record.\n\n" + quarantineProcedure + "\n\n" + fencedClearHelp,
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if fencedNode != "" {
				if scope != "" || container != "" {
					return usagef("--fenced-node clears every quarantine node %s left: give it without --scope and --container", fencedNode)
				}
				return g.clearFenced(cmd, fencedNode)
			}
			if scope == "" {
				return usagef("--scope is required (or --fenced-node)")
			}
			sc, err := parseScopeFlag(scope)
			if err != nil {
				return err
			}
			if container == "" {
				return usagef("--container is required: name the exact container from \"loomfs quarantine show\"")
			}
			ctx := cmd.Context()
			vol, err := store.OpenVolume(ctx, g.storeConfig())
			if err != nil {
				return err
			}
			defer vol.Close()
			r, err := sandbox.NewRunner(ctx, sandbox.ConfigFromEnv())
			if err != nil {
				return fmt.Errorf("can't ask the local engine whether %s still exists, so nothing is cleared: %w", container, err)
			}
			defer r.Close()
			exists, err := r.ContainerExists(ctx, container)
			if err != nil {
				return fmt.Errorf("can't ask the local engine whether %s still exists, so nothing is cleared: %w", container, err)
			}
			if err := g.settleMarker(ctx, sc.String(), clearWait); err != nil {
				return err
			}
			if exists {
				return fmt.Errorf("container %s still exists on the local engine: stop and remove it first (see --help); nothing cleared", container)
			}
			if err := holdersGone(vol, sc); err != nil {
				return err
			}
			if err := vol.ClearQuarantine(sc, container); err != nil {
				return err
			}
			g.auditAdmin(ctx, "quarantine_clear", sc, map[string]any{"container": container})
			fmt.Fprintf(cmd.OutOrStdout(), "cleared the quarantine of %s (container %s); no other marker, lock or file was touched\n", sc, container)
			return nil
		},
	}
	clear.Flags().StringVar(&scope, "scope", "", "exact scope SPACE/AGENT/SESSION[/RUN/INSTANCE] (required)")
	clear.Flags().StringVar(&container, "container", "", "exact container name from the quarantine record (required)")
	clear.Flags().StringVar(&fencedNode, "fenced-node", "", "clear every quarantine of a command node N ran, once N is fenced (loomfs fence)")
	cmd.AddCommand(show, clear)
	return cmd
}

// How long show and list wait for a scope's lock to look at a marker
// (a command in flight holds it: its marker is no quarantine), and clear,
// which needs the look done.
const (
	settleWait = 2 * time.Second
	clearWait  = 30 * time.Second
)

// settleMarkers settles every scope that has an execution or session
// marker (settleMarker), so that a list shows what a dead worker left.
func (g *globals) settleMarkers(ctx context.Context, vol *store.Volume) error {
	ms, err := vol.Markers()
	if err != nil {
		return err
	}
	for _, m := range ms {
		if err := g.settleMarker(ctx, m.Scope, settleWait); err != nil {
			return err
		}
	}
	return nil
}

// settleMarker takes scope's lock for a moment, if it comes within wait.
// A lock no one holds means no live worker owns the scope's markers, and
// taking it turns a marker a dead worker left into the quarantine it
// stands for (SPEC §5), as the scope's next command would: an operator
// sees it without running one. A lock still held is a command in flight,
// and nothing is settled. A scope with no state yet is left uncreated.
func (g *globals) settleMarker(ctx context.Context, scope string, wait time.Duration) error {
	sc, err := parseScopeFlag(scope)
	if err != nil {
		return err
	}
	vol, err := store.OpenVolume(ctx, g.storeConfig())
	if err != nil {
		return err
	}
	has, err := vol.HasMarker(sc)
	vol.Close()
	if err != nil || !has {
		return err
	}
	ws, done, err := g.openWorkspace(ctx, scope)
	if err != nil {
		return err
	}
	defer done()
	lctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	unlock, err := ws.Lock(lctx)
	if err != nil {
		if c := policy.CodeOf(err); c == policy.Timeout || c == policy.Cancelled {
			return nil // in flight
		}
		return err
	}
	unlock()
	return nil
}

// holdersGone refuses to clear a quarantine whose record names processes
// that held the projection and still run on this node. Holders on another
// node can't be seen from here: the record's node must be checked there.
func holdersGone(vol *store.Volume, sc store.Scope) error {
	m, err := vol.Quarantine(sc)
	if err != nil || m == nil || len(m.Holders) == 0 {
		return err
	}
	host, _ := nodeid.Name()
	if m.Node != host {
		return fmt.Errorf("the quarantine record names processes on node %s that held the projection; run the clear there, where they can be checked; nothing cleared", m.Node)
	}
	for _, h := range m.Holders {
		if sandbox.HolderAlive(h) {
			return fmt.Errorf("process %d (%s) still holds the projection: stop it first (see --help); nothing cleared", h.PID, h.Cmdline)
		}
	}
	return nil
}
