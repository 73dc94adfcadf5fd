package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/user"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/stage"
	"github.com/agentloom/loomfs/store"
)

func init() {
	addCommand(newStageCmd)
	addCommand(newCollectCmd)
}

const platformHelp = `stage and collect are the platform's door into a scope, never the agent's: no
tool, MCP call or container reaches them. The path rules don't apply to them
(the platform fills read-only data/ and hidden .meta/, and reads write-only
output/); every other rule does: no symlinks, hard links, special files or
mount points are copied (each is refused and listed, the rest goes on), the
per-file limit, the scope quota and the subtree caps hold with their figures,
and every object is audited with source "platform" and the --actor given.

Exit 0 when everything was done, 1 when something was refused (the result
lists what and why) or the command failed, 2 on a usage error.`

func newStageCmd(g *globals) *cobra.Command {
	var scope, into, actor string
	cmd := &cobra.Command{
		Use:   "stage --scope S [--into PREFIX] [--actor NAME] SRC...",
		Short: "Copy the platform's inputs into a scope, read-only and hidden subtrees included",
		Long: `Copy each SRC into the subtree PREFIX of the scope (default: its root),
holding the scope lock (it waits while a command or a write holds it): a file becomes PREFIX/<its name>, a directory's
contents go into PREFIX, and "-" reads a tar stream from stdin (its symbolic
links become emulated links where the policy emulates them). Each file is
placed atomically: a refused or failed one leaves nothing. Missing
directories are made 0700; files are 0600 plus the owner-execute bit a source
has. A file already there is replaced. Changes are journalled, so the next
snapshot sees them.

` + platformHelp,
		Example: `  loomfs --policy standard.yaml stage --scope acme/coder/s1 --into data ./inputs/
  tar -C task -cf - . | loomfs stage --scope run:r-42 --into .meta --actor scheduler -`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("stage needs at least one SRC (a file, a directory, or - for a tar stream on stdin)")
			}
			if _, err := policy.CleanPath(into, false); err != nil {
				return usagef("--into %q: %v", into, err)
			}
			var srcs []stage.Source
			stdin := false
			for _, a := range args {
				if a == "-" {
					if stdin {
						return usagef("- (a tar stream on stdin) can be given once")
					}
					stdin = true
					srcs = append(srcs, stage.Tar("-", cmd.InOrStdin()))
					continue
				}
				srcs = append(srcs, stage.Path(a))
			}
			return g.platformOp(cmd, scope, actor, func(ctx context.Context, p *stage.Platform) (int, error) {
				res, err := p.Stage(ctx, into, srcs...)
				if res == nil {
					return 0, err
				}
				if perr := g.printStaged(cmd.OutOrStdout(), res); perr != nil {
					return 0, perr
				}
				return len(res.Refused), err
			})
		},
	}
	cmd.Flags().StringVar(&scope, "scope", "", "the scope: SPACE/AGENT/SESSION[/RUN/INSTANCE] or run:RUN[/INSTANCE] (required)")
	cmd.Flags().StringVar(&into, "into", ".", "the subtree of the scope to stage into")
	cmd.Flags().StringVar(&actor, "actor", "", "who stages, for the audit log (default: the local user)")
	return cmd
}

func newCollectCmd(g *globals) *cobra.Command {
	var scope, from, actor string
	cmd := &cobra.Command{
		Use:   "collect --scope S [--from PREFIX] [--actor NAME] DEST|-",
		Short: "Copy a scope's subtree out for the platform, write-only output/ included",
		Long: fmt.Sprintf(`Copy the subtree PREFIX of the scope (default: all of it) into the directory
DEST (made 0700 if missing; nothing in it is ever replaced: a name it already
has is refused and listed), or with "-" as a tar stream on stdout. Paths are
relative to PREFIX. The checks and caps of artifacts hold: each file is read
whole from the descriptor that was opened and checked, files over %s are
refused, and at most %d files are collected (the result says truncated).
With "-" the result goes to stderr (as JSON with --json).

`, policy.Bytes(store.MaxArtifactBytes), store.MaxArtifacts) + platformHelp,
		Example: `  loomfs --policy standard.yaml collect --scope acme/coder/s1 --from output ./results
  loomfs collect --scope run:r-42 --from output - | tar -tvf -`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dest := args[0]
			if _, err := policy.CleanPath(from, false); err != nil {
				return usagef("--from %q: %v", from, err)
			}
			return g.platformOp(cmd, scope, actor, func(ctx context.Context, p *stage.Platform) (int, error) {
				var sink stage.Sink
				var closeSink func() error
				out := cmd.OutOrStdout()
				if dest == "-" {
					ts := stage.ToTar(out)
					sink, closeSink = ts, ts.Close
					out = cmd.ErrOrStderr()
				} else {
					ds, err := stage.ToDir(dest)
					if err != nil {
						return 0, fmt.Errorf("collect into %s: %w", dest, err)
					}
					sink, closeSink = ds, ds.Close
				}
				c, err := p.Collect(ctx, from, sink)
				if c == nil {
					// Nothing collected: no tar trailer either, so a
					// reader of the stream sees it fail.
					if dest != "-" {
						closeSink()
					}
					return 0, err
				}
				if cerr := closeSink(); err == nil && cerr != nil {
					err = fmt.Errorf("collect into %s: %w", dest, cerr)
				}
				if perr := g.printCollected(out, c); perr != nil {
					return 0, perr
				}
				return len(c.Refused), err
			})
		},
	}
	cmd.Flags().StringVar(&scope, "scope", "", "the scope: SPACE/AGENT/SESSION[/RUN/INSTANCE] or run:RUN[/INSTANCE] (required)")
	cmd.Flags().StringVar(&from, "from", ".", "the subtree of the scope to collect")
	cmd.Flags().StringVar(&actor, "actor", "", "who collects, for the audit log (default: the local user)")
	return cmd
}

// platformOp opens the scope and its audit log and runs f with the
// platform's door. f returns how many
// objects were refused (exit 1 when any) and what stopped it.
func (g *globals) platformOp(cmd *cobra.Command, scope, actor string, f func(context.Context, *stage.Platform) (int, error)) error {
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	if actor == "" {
		u, err := user.Current()
		var unknown user.UnknownUserIdError
		switch {
		case errors.As(err, &unknown):
			return usagef("--actor is needed: the local user is unknown (%v)", err)
		case err != nil:
			// Not a usage error: the user database could not be read
			// (an I/O error, no descriptor left), and may be next time.
			return refuse(cmd, g, policy.Errorf(policy.Internal, "the local user could not be looked up (%v); name the actor with --actor, which needs no lookup", err))
		}
		actor = u.Username
	}
	ws, done, err := g.openWorkspace(ctx, scope)
	if err != nil {
		return refuse(cmd, g, err)
	}
	defer done()
	log, err := audit.Open(ws.Volume().Path(), audit.Options{})
	if err != nil {
		return refuse(cmd, g, auditUnavailable(err))
	}
	defer log.Close()
	a := actorOf(ws.Scope())
	a.Operator = actor
	p := &stage.Platform{WS: ws, Audit: log, Actor: a}
	refused, err := f(ctx, p)
	if err != nil {
		if g.json {
			// The result, if any, is printed already; the error follows
			// on stderr so stdout stays one JSON document.
			pe := policy.AsError(err)
			fmt.Fprintf(cmd.ErrOrStderr(), "loomfs: %s: %s\n", pe.Code, pe.Message)
			return exitError{exitRefused}
		}
		return refuse(cmd, g, err)
	}
	if refused > 0 {
		return exitError{exitRefused}
	}
	return nil
}

func (g *globals) printStaged(w io.Writer, res *stage.Result) error {
	if g.json {
		return writeJSON(w, res)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "staged %d objects, %s, into %s\n", len(res.Staged), policy.Bytes(res.Bytes), res.Into)
	printRefused(tw, res.Refused)
	return tw.Flush()
}

func (g *globals) printCollected(w io.Writer, c *stage.Collection) error {
	if g.json {
		return writeJSON(w, c)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "collected %d files, %s, from %s\n", len(c.Collected), policy.Bytes(c.Bytes), c.From)
	if c.Truncated {
		fmt.Fprintf(tw, "(truncated at %d files)\n", store.MaxArtifacts)
	}
	printRefused(tw, c.Refused)
	return tw.Flush()
}

func printRefused(tw *tabwriter.Writer, refused []stage.Refused) {
	if len(refused) == 0 {
		return
	}
	fmt.Fprintln(tw, "REFUSED\tCODE\tWHY")
	for _, r := range refused {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", auditCell(r.Source), r.Code, r.Message)
	}
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
