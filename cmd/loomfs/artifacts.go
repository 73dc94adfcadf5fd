package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

func init() { addCommand(newArtifactsCmd) }

const artifactsHelp = `A run's artifacts are the files of its session's main workspace (as they are
now: every run of the session shares it, so this is not a snapshot) and of its
own child instances, shown as subagents/<instance>/<path>. That name is only a
view: no child directory is placed in the main workspace.

Only the user who started the run (recorded in its binding) may list or
download; anyone else gets permission_denied. --user is the platform's
authenticated user. A legacy run never recorded its user, so its artifacts are
not served. Each download is capped at 2 MiB and read from the descriptor that
was opened and checked; symlinks, hard-linked and special files are listed for
what they are and refused. Every listing and download is audited.

--published reads the run's copy in the S3 object store instead ("runs finish
--publish"): the files as they were when the run finished, read back from the
store alone and each checked against its sha256. The same owner rule applies
(the manifest records the user). "get --published" streams a file of any
size; a copy that doesn't match its manifest (altered, truncated, missing) is
refused, naming the object, and --output is then removed.`

func newArtifactsCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "artifacts list|get",
		Short: "List and download a run's files, for the user who started it",
		Long:  artifactsHelp,
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			return usagef("artifacts needs a subcommand: list or get")
		},
	}
	var runID, user, output string
	var fromStore bool
	list := &cobra.Command{
		Use:   "list --run RUN --user USER",
		Short: "List a run's artifacts (a table, or JSON with --json)",
		Long:  artifactsHelp,
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if runID == "" || user == "" {
				return usagef("--run and --user are required")
			}
			if fromStore {
				return g.listPublished(cmd, runID, user)
			}
			out, err := g.artifactOp(cmd, runID, user, "artifact_list", "", func(r *store.Run, pol *policy.Policy, ev *audit.Event) ([]byte, error) {
				l, err := r.Artifacts(cmd.Context(), user, pol)
				if err != nil {
					return nil, err
				}
				ev.Detail["count"] = len(l.Artifacts)
				var b bytes.Buffer
				if g.json {
					enc := json.NewEncoder(&b)
					enc.SetIndent("", "  ")
					err := enc.Encode(l)
					return b.Bytes(), err
				}
				tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "PATH\tTYPE\tSIZE\tMODIFIED\tREFUSED")
				for _, a := range l.Artifacts {
					fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", auditCell(a.Path), a.Type, a.Size, a.ModTime.Format(time.RFC3339), auditCell(string(a.Refused)))
				}
				if l.Truncated {
					fmt.Fprintf(tw, "(listing truncated at %d entries)\n", store.MaxArtifacts)
				}
				err = tw.Flush()
				return b.Bytes(), err
			})
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(out)
			return err
		},
	}
	get := &cobra.Command{
		Use:   "get --run RUN --user USER PATH [--output FILE]",
		Short: "Download one artifact (at most 2 MiB; any size --published) to stdout or a new file",
		Long:  artifactsHelp + "\n\n--output writes a new file (mode 0600) and never replaces an existing one.",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if runID == "" || user == "" {
				return usagef("--run and --user are required")
			}
			if fromStore {
				return g.getPublished(cmd, runID, user, args[0], output)
			}
			out, err := g.artifactOp(cmd, runID, user, "artifact_get", args[0], func(r *store.Run, pol *policy.Policy, ev *audit.Event) ([]byte, error) {
				f, err := r.OpenArtifact(cmd.Context(), user, args[0], pol)
				if err != nil {
					return nil, err
				}
				defer f.Close()
				// Read it whole (at most 2 MiB) before serving a byte, so a
				// refusal midway never leaves half a file.
				b, err := io.ReadAll(f)
				if err != nil {
					return nil, err
				}
				sum := sha256.Sum256(b)
				ev.Bytes, ev.SHA256 = int64(len(b)), hex.EncodeToString(sum[:])
				return b, nil
			})
			if err != nil {
				return err
			}
			if output == "" {
				_, err = cmd.OutOrStdout().Write(out)
				return err
			}
			f, err := os.OpenFile(output, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
			if err != nil {
				return fmt.Errorf("--output: %w", err)
			}
			if _, err := f.Write(out); err != nil {
				f.Close()
				return fmt.Errorf("--output: %w", err)
			}
			return f.Close()
		},
	}
	for _, c := range []*cobra.Command{list, get} {
		c.Flags().StringVar(&runID, "run", "", "run id (required)")
		c.Flags().StringVar(&user, "user", "", "the platform's authenticated user (required)")
		c.Flags().BoolVar(&fromStore, "published", false, "read the run's published copy in the S3 object store (AGENT_LOOM_S3_*)")
	}
	get.Flags().StringVarP(&output, "output", "o", "", "write to this new file instead of stdout")
	cmd.AddCommand(list, get)
	return cmd
}

// artifactOp resumes the run, opens the audit log of its volume, runs f and
// records what it did or why it was refused, before anything is served: it
// returns f's output, or the refusal already reported.
func (g *globals) artifactOp(cmd *cobra.Command, runID, user, op, path string, f func(*store.Run, *policy.Policy, *audit.Event) ([]byte, error)) ([]byte, error) {
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	pol, err := g.loadPolicy()
	if err != nil {
		return nil, err
	}
	r, err := store.ResumeRun(ctx, g.storeConfig(), runID)
	if err != nil {
		return nil, refuse(cmd, g, err)
	}
	defer r.Close()
	log, err := audit.Open(r.Volume().Path(), audit.Options{})
	if err != nil {
		return nil, refuse(cmd, g, auditUnavailable(err))
	}
	defer log.Close()
	ev := audit.Event{Actor: audit.Actor{Run: runID}, Source: audit.SourceAdmin, Op: op, Path: path, Detail: map[string]any{"user": user}}
	if b := r.Binding(); b != nil {
		ev.Actor = actorOf(b.MainScope())
		ev.Actor.Run = runID
		ev.Scope = b.MainScope().Hash()
	}
	start := time.Now()
	out, ferr := f(r, pol, &ev)
	ev.Duration = time.Since(start)
	ev.Result = "ok"
	if ferr != nil {
		pe := policy.AsError(ferr)
		ev.Result, ev.Code = "refused", string(pe.Code)
	}
	if err := log.Record(ctx, ev); err != nil {
		return nil, refuse(cmd, g, auditUnavailable(err))
	}
	if ferr != nil {
		return nil, refuse(cmd, g, ferr)
	}
	return out, nil
}
