package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/tools"
)

func init() { addCommand(newRunCmd) }

// exitTimedOut is what loomfs run exits with when the command timed out,
// as timeout(1) does.
const exitTimedOut = 124

func newRunCmd(g *globals) *cobra.Command {
	var scope, callID, traceparent string
	var timeout, procs int
	var tty bool
	cmd := &cobra.Command{
		Use:   "run --scope S [--timeout SECONDS | --tty] -- CMD [ARG...]",
		Short: "Run a command in a sandbox container over the scope's /workspace",
		Long: `Run one command in a fresh sandbox container whose /workspace is the scope's
policed FUSE projection: no network, read-only root filesystem, writable /tmp
(nosuid, nodev, exec allowed), all capabilities dropped, our own seccomp
profile, non-root user, umask 077, under AGENT_LOOM_SANDBOX_RUNTIME (runsc for
gVisor; the engine's default otherwise). This is the same path as
the workspace_command tool: the scope lock is held throughout, the projection
is mounted and probed before the container starts, and an execution marker
guards against a lost container (see "loomfs quarantine --help").

The command's stdout and stderr are printed as they were captured (capped,
head and tail kept); loomfs exits with the command's exit code, 124 if it
timed out, and 1 if it was refused. With --json the whole result is printed,
with policy_events: what the workspace policy refused the command (operation,
path, errno, code and message), which the command itself saw only as an
errno. A container the runtime fails to start answers
sandbox_start_failed with the runtime's message, within the timeout plus
the cleanup timeout; if processes other than loomfs still hold the
projection after the container is gone, the scope is quarantined naming them.

--tty runs CMD on a terminal in the scope's session sandbox instead, through
this node's process service ("loomfs serve"): an interactive shell with
"loomfs run --tty --scope S -- sh". Keys go to it (the local terminal is put
in raw mode, so Ctrl-C reaches the sandbox), its output comes back, a window
change resizes its terminal, and loomfs exits with its exit code. It runs
until it exits; --timeout does not apply.`,
		Example: `  loomfs run --scope acme/coder/s1 -- python3 -c 'print(open("notes.md").read())'
  loomfs run --scope acme/coder/s1 --timeout 5 -- sh -c 'ls -la'
  loomfs run --scope acme/coder/s1 --tty -- sh`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("run needs a command after --")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if scope == "" {
				return usagef("--scope is required")
			}
			if timeout < 1 || timeout > 120 {
				return usagef("--timeout %d: allowed 1–120 seconds", timeout)
			}
			// The command's projection is served from this process.
			setProcs(procs, cmd.Flags().Changed("procs"), g.storeConfig().RootPath())
			ctx, err := withTraceparent(cmd.Context(), traceparent)
			if err != nil {
				return err
			}
			s, err := g.openSession(ctx, scope)
			if err != nil {
				return printToolError(cmd, err)
			}
			defer s.close()
			if tty {
				code, err := runTTY(ctx, s.tools, shellJoin(args))
				if err != nil {
					pe := policy.AsError(err)
					fmt.Fprintf(os.Stderr, "loomfs: %s: %s\n", pe.Code, pe.Message)
					return exitError{exitRefused}
				}
				if code != 0 {
					return exitError{code}
				}
				return nil
			}
			in, _ := json.Marshal(map[string]any{"command": shellJoin(args), "timeout_s": timeout})
			res, err := s.tools.Call(ctx, tools.Command, callID, in)
			if err != nil {
				pe := policy.AsError(err)
				fmt.Fprintf(os.Stderr, "loomfs: %s: %s\n", pe.Code, pe.Message)
				return exitError{exitRefused}
			}
			var r tools.CommandResult
			if err := json.Unmarshal(res, &r); err != nil {
				return err
			}
			if g.json {
				fmt.Fprintln(cmd.OutOrStdout(), string(res))
			} else {
				fmt.Fprint(cmd.OutOrStdout(), r.Stdout)
				fmt.Fprint(os.Stderr, r.Stderr)
			}
			switch {
			case r.TimedOut:
				fmt.Fprintf(os.Stderr, "loomfs: command timed out after %d s; its container was removed\n", timeout)
				return exitError{exitTimedOut}
			case r.ExitCode != 0:
				return exitError{r.ExitCode}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&scope, "scope", "", "scope SPACE/AGENT/SESSION or SPACE/AGENT/SESSION/RUN/INSTANCE, or run:RUN[/INSTANCE] to resume through the run's binding (required)")
	cmd.Flags().IntVar(&timeout, "timeout", 60, "seconds before the container is killed (1–120)")
	cmd.Flags().StringVar(&callID, "call-id", "", "call id for replay")
	traceparentFlag(cmd, &traceparent)
	cmd.Flags().BoolVar(&tty, "tty", false, "run on a terminal in the session sandbox, interactively (needs loomfs serve)")
	addProcsFlag(cmd.Flags(), &procs)
	return cmd
}

// shellJoin quotes args for sh -c so the command runs them as given.
func shellJoin(args []string) string {
	if len(args) == 1 {
		// One argument is a command line already: "loomfs run -- 'a | b'".
		return args[0]
	}
	q := make([]string, len(args))
	for i, a := range args {
		if a != "" && strings.Trim(a, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+@%") == "" {
			q[i] = a
			continue
		}
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}
