package main

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentloom/loomfs/nodeservice"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/process"
	"github.com/agentloom/loomfs/tools"
)

func init() { addCommand(newProcessesCmd) }

func newProcessesCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "processes list|show|stop --scope S",
		Short: "Inspect a scope's processes and stop its session sandbox (operators)",
		Long: `Inspect the processes of a scope's session sandbox (SPEC §5.1) and stop it.

list prints every process record of the scope: running ones, and ended ones
kept for late readers (an hour by default) before they are collected. The
records live in the scope's lock directory and name the node, container,
exec id, command, start time and call id, so list works from any node;
with this node's service running, its live processes show their current
cursor. show prints one record as JSON. stop asks this node's service
("loomfs serve") to stop the scope's session sandbox: its container is
removed with confirmation, its processes end, and the session marker goes.
A scope whose sandbox runs on another node is stopped there (the error
names the node).

A process recorded running on a node the volume records as fenced ("loomfs
fence --help") is listed as lost, ended at the fence: its node writes
nothing any more and stops its own sandboxes once it sees the fence. A
listing through this node's service records it so, and the record is
collected an hour (the keep-ended time) after the fence.`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			return usagef("processes needs a subcommand: list, show or stop")
		},
	}
	var scope string
	list := &cobra.Command{
		Use:   "list --scope S",
		Short: "List a scope's processes, running and recently ended",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			ws, done, err := g.openWorkspace(ctx, scope)
			if err != nil {
				return printToolError(cmd, err)
			}
			defer done()
			c := nodeservice.NewClient(socketPath())
			defer c.Close()
			procs, err := c.ListProcesses(ctx, ws)
			if policy.CodeOf(err) == policy.ProcessServiceUnavailable {
				procs, err = process.Records(ws)
			}
			if err != nil {
				return printToolError(cmd, err)
			}
			if g.json {
				if procs == nil {
					procs = []tools.ProcessInfo{}
				}
				return json.NewEncoder(cmd.OutOrStdout()).Encode(procs)
			}
			if len(procs) == 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "no processes in %s\n", ws.Scope())
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "PROCESS\tSTATUS\tEXIT\tNODE\tCONTAINER\tCALL\tSTARTED\tCOMMAND")
			for _, p := range procs {
				exit := "-"
				if p.ExitCode != nil {
					exit = fmt.Sprint(*p.ExitCode)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.ProcessID, p.Status, exit, p.Node, p.Container, p.CallID, p.Started.UTC().Format(time.RFC3339), p.Command)
			}
			return tw.Flush()
		},
	}
	show := &cobra.Command{
		Use:   "show --scope S PROCESS_ID",
		Short: "Print one process record as JSON",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ws, done, err := g.openWorkspace(cmd.Context(), scope)
			if err != nil {
				return printToolError(cmd, err)
			}
			defer done()
			var rec process.Record
			ok, err := ws.ReadProcessRecord(args[0], &rec)
			if err != nil {
				return printToolError(cmd, err)
			}
			if !ok {
				return printToolError(cmd, policy.Errorf(policy.NotFound, "no process %s in %s", args[0], ws.Scope()))
			}
			enc := json.NewEncoder(cmd.OutOrStdout())
			enc.SetIndent("", "  ")
			return enc.Encode(rec)
		},
	}
	var callID string
	stop := &cobra.Command{
		Use:   "stop --scope S",
		Short: "Stop the scope's session sandbox on this node",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			ws, done, err := g.openWorkspace(ctx, scope)
			if err != nil {
				return printToolError(cmd, err)
			}
			sc := ws.Scope()
			done()
			c := nodeservice.NewClient(socketPath())
			defer c.Close()
			res, err := c.Stop(ctx, sc.String(), callID)
			if err != nil {
				return printToolError(cmd, err)
			}
			g.auditAdmin(ctx, "processes_stop", sc, map[string]any{"stopped": res.Stopped, "call": callID})
			if g.json {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(res)
			}
			if res.Stopped {
				fmt.Fprintf(cmd.OutOrStdout(), "stopped the session sandbox of %s; its container is removed\n", sc)
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "no session sandbox of %s runs on this node\n", sc)
			}
			return nil
		},
	}
	stop.Flags().StringVar(&callID, "call-id", "", "call id recorded with the stop")
	for _, c := range []*cobra.Command{list, show, stop} {
		c.Flags().StringVar(&scope, "scope", "", "scope SPACE/AGENT/SESSION[/RUN/INSTANCE] (required)")
		c.MarkFlagRequired("scope")
		cmd.AddCommand(c)
	}
	return cmd
}
