package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/agentloom/loomfs/changes"
	"github.com/agentloom/loomfs/tools"
)

func init() { addCommand(newWatchCmd) }

// watchWait is how long each look at the feed waits for a change.
const watchWait = 30_000

func newWatchCmd(g *globals) *cobra.Command {
	var scope, since, path string
	cmd := &cobra.Command{
		Use:   "watch --scope S [--since CURSOR] [--path PREFIX]",
		Short: "Stream the scope's changes as JSON lines",
		Long: `Stream what changes in a scope, through the tools and through every program
writing in its projection, on every node, as workspace_changes reports it:
one JSON object a line per change (op, path, to, subtree, source, call_id,
node, pid, time), then after each batch a line {"cursor":"…"} to resume
from with --since. A line {"reset":true,"cursor":"…"} says changes after
the cursor given are no longer kept: re-list what matters, then go on.
Paths under hidden rules are never shown. Without --since it starts now.
SIGINT or SIGTERM stops it (exit 0).`,
		Example: `  loomfs watch --scope acme/coder/s1
  loomfs watch --scope acme/coder/s1 --since "$CURSOR" --path src`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			tb, done, err := g.openToolbox(ctx, scope)
			if err != nil {
				return printToolError(cmd, err)
			}
			defer done()
			return watch(ctx, cmd, tb, since, path)
		},
	}
	cmd.Flags().StringVar(&scope, "scope", "", "scope SPACE/AGENT/SESSION or SPACE/AGENT/SESSION/RUN/INSTANCE (required)")
	cmd.Flags().StringVar(&since, "since", "", "cursor to go on from (default: now)")
	cmd.Flags().StringVar(&path, "path", "", "only changes at or under this path")
	return cmd
}

func watch(ctx context.Context, cmd *cobra.Command, tb *tools.Toolbox, since, path string) error {
	out := json.NewEncoder(cmd.OutOrStdout())
	wait := watchWait
	if since == "" {
		wait = 0 // first, where now is: its cursor line comes at once
	}
	for ctx.Err() == nil {
		in, _ := json.Marshal(map[string]any{"since": since, "path": path, "wait_ms": wait})
		wait = watchWait
		res, err := tb.Call(ctx, tools.Changes, "", in)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return printToolError(cmd, err)
		}
		var p changes.Page
		if err := json.Unmarshal(res, &p); err != nil {
			return fmt.Errorf("decode workspace_changes result: %w", err)
		}
		for _, e := range p.Changes {
			out.Encode(e)
		}
		switch {
		case p.Reset:
			out.Encode(map[string]any{"reset": true, "cursor": p.Cursor})
		case len(p.Changes) > 0 || since == "":
			out.Encode(map[string]any{"cursor": p.Cursor})
		}
		since = p.Cursor
	}
	return nil
}
