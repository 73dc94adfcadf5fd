package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/tools"
)

func init() {
	addCommand(newToolCmd)
	addCommand(newToolsCmd)
}

func newToolCmd(g *globals) *cobra.Command {
	var scope, input, callID, traceparent string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "tool NAME --scope S [--input JSON|-] [--call-id ID] [--timeout D]",
		Short: "Run one workspace tool and print its JSON result",
		Long: `Run one workspace tool handler against a scope and print its JSON result on
stdout. On a refusal it prints {"error":{"code":…,"message":…}} and exits 1.

--input takes the tool's JSON arguments, or "-" to read them from stdin.
--call-id makes a change replayable: one recorded as done returns the
recorded result; a write whose outcome was never recorded answers
unknown_outcome instead of running again. A read is not recorded: it is
read again.

--timeout is the call's budget, from opening the volume to the answer: when
it runs out the call answers timeout (unknown_outcome for a change that may
yet complete), even when a system call on the volume waits in the kernel
(a hung NFS server, a dead CephFS client's capabilities). The answer is
printed then; the process exits once the kernel returns that system call,
which nothing can interrupt. 0, the default, bounds only the wait for the
scope lock (30 s), which is bounded the same way.

The workspace_process_* tools reach this node's process service ("loomfs
serve") at $AGENT_LOOM_SERVE_SOCKET (default /run/loomfs/serve.sock), so a
process started by one call is read, written and signalled by later ones;
without the service they answer process_service_unavailable.

Run "loomfs tools" for every tool's name, description and input schema.`,
		Example: `  loomfs tool workspace_write --scope acme/coder/s1 --input '{"path":"a.txt","content":"hi\n"}'
  echo '{"path":"a.txt"}' | loomfs tool workspace_read --scope acme/coder/s1 --input -`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			raw := []byte(input)
			if input == "-" {
				b, err := io.ReadAll(io.LimitReader(os.Stdin, 64<<20))
				if err != nil {
					return fmt.Errorf("read input from stdin: %w", err)
				}
				raw = b
			}
			known := false
			for _, n := range tools.Names {
				known = known || n == name
			}
			if !known {
				return usagef("unknown tool %q (run \"loomfs tools\" for the list)", name)
			}
			if name == "workspace_command" {
				// The command's projection is served from this process.
				setProcs(0, false, g.storeConfig().RootPath())
			}
			if timeout < 0 {
				return usagef("--timeout %s: must be 0 (no budget) or positive", timeout)
			}
			ctx, err := withTraceparent(cmd.Context(), traceparent)
			if err != nil {
				return err
			}
			if timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, timeout)
				defer cancel()
			}
			tb, done, err := g.openToolbox(ctx, scope)
			if err != nil {
				return printToolError(cmd, err)
			}
			res, err := tb.Call(ctx, name, callID, raw)
			// The answer goes out first: a system call that outlived its
			// budget still uses the workspace's fds, so closing them
			// waits until the kernel returns it (as the process's exit
			// would anyway).
			defer func() {
				tb.Wait()
				done()
			}()
			if err != nil {
				return printToolError(cmd, err)
			}
			out := cmd.OutOrStdout()
			out.Write(res)
			fmt.Fprintln(out)
			return nil
		},
	}
	cmd.Flags().StringVar(&scope, "scope", "", "scope SPACE/AGENT/SESSION or SPACE/AGENT/SESSION/RUN/INSTANCE, or run:RUN[/INSTANCE] to resume through the run's binding (required)")
	cmd.Flags().StringVar(&input, "input", "{}", "tool arguments as JSON, or - to read them from stdin")
	cmd.Flags().StringVar(&callID, "call-id", "", "call id for replay")
	traceparentFlag(cmd, &traceparent)
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "the call's budget, e.g. 20s: answer timeout (or unknown_outcome) when it runs out, whatever the storage does; 0: only the 30 s lock wait is bounded")
	return cmd
}

// printToolError prints a refusal as JSON and exits 1; usage errors pass
// through to exit 2.
func printToolError(cmd *cobra.Command, err error) error {
	if _, ok := err.(usageError); ok {
		return err
	}
	// What a model may read goes to stdout (policy.Public); the detail it
	// must not read, to the operator's stderr.
	pe := policy.Public(err)
	if orig := policy.AsError(err); orig.Message != pe.Message {
		fmt.Fprintf(cmd.ErrOrStderr(), "loomfs: %s: %s\n", orig.Code, orig.Message)
	}
	b, _ := json.Marshal(map[string]any{"error": pe})
	fmt.Fprintln(cmd.OutOrStdout(), string(b))
	return exitError{exitRefused}
}

func newToolsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "tools",
		Short: "Print every tool's model-visible definition as JSON",
		Long: `Print the name, description and JSON Schema of every workspace tool, as a
JSON array. Descriptions state the limits and path rules of the loaded policy
(--policy), so what a model reads is what is enforced.`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			pol, err := g.loadPolicy()
			if err != nil {
				return err
			}
			b, err := json.MarshalIndent(tools.Definitions(pol), "", "  ")
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), string(b))
			return nil
		},
	}
}

// openToolbox opens the scope and a Toolbox over it.
func (g *globals) openToolbox(ctx context.Context, scope string) (*tools.Toolbox, func(), error) {
	s, err := g.openSession(ctx, scope)
	if err != nil {
		return nil, nil, err
	}
	return s.tools, s.close, nil
}

// exactArgs is cobra.ExactArgs reporting a usage error.
func exactArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usagef("%s takes %d argument(s), got %d; see --help", cmd.CommandPath(), n, len(args))
		}
		return nil
	}
}
