package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/agentloom/loomfs/nodeid"

	"github.com/spf13/cobra"

	"github.com/agentloom/loomfs/loom"
	"github.com/agentloom/loomfs/nodeservice"
	"github.com/agentloom/loomfs/process"
	"github.com/agentloom/loomfs/sandbox"
	"github.com/agentloom/loomfs/store"
)

func init() { addCommand(newServeCmd) }

// socketPath is the node service's socket: AGENT_LOOM_SERVE_SOCKET, else
// the default beside the mountpoints.
func socketPath() string { return envOr("AGENT_LOOM_SERVE_SOCKET", nodeservice.DefaultSocket) }

func newServeCmd(g *globals) *cobra.Command {
	var socket, node, mountDir string
	var procs int
	var mf metricsFlags
	cmd := &cobra.Command{
		Use:   "serve [--socket PATH] [--node NAME]",
		Short: "Run the node service that owns the session sandboxes and their processes",
		Long: `Run this node's process service in the foreground: it owns every scope's
session sandbox (one long-lived container over the scope's projection, SPEC
§5.1) and the processes in it, so that a process started by one call is
reached by later calls from any process on the node: "loomfs tool", every
"loomfs mcp" session, "loomfs processes" and the Go API.

It listens on a unix socket only root reaches (--socket, default
$AGENT_LOOM_SERVE_SOCKET or ` + nodeservice.DefaultSocket + `; its directory is
0700). Each call names its scope as "loomfs tool" does. A session sandbox
ends after the policy's session_idle with no running process and no call,
after session_lifetime in any case, on "loomfs processes stop", and when
this service stops (SIGINT or SIGTERM): its container is removed with
confirmation before its marker goes. If this service dies with sandboxes
running, their scopes are quarantined at the next write or command, as for
a one-shot command ("loomfs quarantine --help").

Every ` + store.FenceCheckEvery.String() + ` it asks the volume whether this node was fenced ("loomfs
fence --help"): once its storage client answers ESHUTDOWN or the volume
records its fence, it stops every session sandbox, removes every container
the engine runs for this node (one-shot commands included), says so on
stderr and in /readyz (condition "fence"), and refuses every call with
volume_unavailable "this node was fenced" until it is stopped; it serves
again only after the node is re-admitted and the service started afresh.

--node names this worker in markers, records and labels (default
$AGENT_LOOM_NODE or the hostname): calls on another node for a process of
this one answer process_on_other_node naming it.

` + metricsHelp,
		Example: `  loomfs serve
  AGENT_LOOM_SERVE_SOCKET=/run/loomfs/serve.sock loomfs tool workspace_process_start --scope acme/coder/s1 --input '{"command":"python3 -i"}'`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			setProcs(procs, cmd.Flags().Changed("procs"), g.storeConfig().RootPath())
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if node != "" {
				// The audit chain, the journals and the markers of this
				// process name the node as its records do.
				os.Setenv(nodeid.Env, node)
			}
			stopMetrics, err := g.startMetrics(ctx, mf)
			if err != nil {
				return err
			}
			defer stopMetrics()
			n, svc, closeSvc, err := g.newProcessService(ctx, node, mountDir)
			if err != nil {
				return printToolError(cmd, err)
			}
			g.obs.watchService(svc)
			obs := g.obs
			go func() {
				// A fenced node stops its work and keeps answering, with
				// the fence, until it is stopped.
				watch := func(ctx context.Context) error { return n.WatchFence(ctx, store.FenceCheckEvery) }
				if err := obs.watchFence(ctx, g.storeConfig(), watch); err != nil {
					fmt.Fprintf(os.Stderr, "loomfs serve: FENCED: %v; every call is refused until an administrator re-admits this node and this service is started afresh\n", err)
				}
			}()
			defer func() {
				if err := closeSvc(); err != nil {
					fmt.Fprintf(os.Stderr, "loomfs serve: stopping the session sandboxes: %v\n", err)
				}
			}()
			ln, err := nodeservice.Listen(socket)
			if err != nil {
				return fmt.Errorf("--socket %s: %w", socket, err)
			}
			defer os.Remove(socket)
			fmt.Fprintf(os.Stderr, "serving processes of node %s at %s\n", svc.Node(), socket)
			srv := &nodeservice.Server{Service: svc, Log: g.log, Open: g.openWorkspace}
			return srv.Serve(ctx, ln)
		},
	}
	cmd.Flags().StringVar(&socket, "socket", socketPath(), "unix socket to listen on ($AGENT_LOOM_SERVE_SOCKET)")
	cmd.Flags().StringVar(&node, "node", envOr(nodeid.Env, ""), "this worker's name in markers and records; default the hostname ($AGENT_LOOM_NODE)")
	cmd.Flags().StringVar(&mountDir, "mount-dir", sandbox.DefaultMountDir, "root-only directory (0700) for the session sandboxes' projections")
	addProcsFlag(cmd.Flags(), &procs)
	addMetricsFlags(cmd.Flags(), &mf)
	return cmd
}

// newProcessService is the node's own process service (loom.Node.Processes)
// with this worker's name and mount directory; close stops its sandboxes.
func (g *globals) newProcessService(ctx context.Context, node, mountDir string) (n *loom.Node, svc *process.Service, close func() error, err error) {
	cfg := loom.Config{MountDir: mountDir}
	cfg.Sandbox.Node = node
	n, err = g.node(cfg)
	if err != nil {
		return nil, nil, nil, err
	}
	n.SweepStaleMounts()
	svc, err = n.Processes(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	return n, svc, n.Close, nil
}
