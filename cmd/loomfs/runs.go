package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/agentloom/loomfs/fork"
	"github.com/agentloom/loomfs/loom"
	"github.com/agentloom/loomfs/nodeservice"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/retention"
	"github.com/agentloom/loomfs/snapshot"
	"github.com/agentloom/loomfs/store"
)

func init() { addCommand(newRunsCmd) }

const runsHelp = `A run's binding is recorded when the run is created: backend, volume id,
layout version, the scope ids (space, agent, session, run) and the user who
started it, and its priority class (--priority low, normal or high; omitted,
the policy's default applies when the run is opened), in
<root>/.agentloom-runs/<run_id>.json. The session is bound to the same volume
for life. The class picks the run's limits (the policy's limits_by_priority),
how near full the volume may be before its scopes can't grow
(volume_reserve_low, volume_reserve_normal), and gc reclaims low first.

Resuming a run uses its binding, not today's configuration: this node's
--root only says where the node sees the volume. If this node is configured
for another backend or volume id than the binding names, the resume is
refused (volume_unavailable, naming both). A run with no binding but a
directory <data>/runs/<run_id> is a legacy run from before bindings: it keeps
that directory, which loomfs neither moves nor upgrades.

On the shared_posix backend the root and its marker are checked first; if
they fail, nothing else is consulted and nothing is created.`

func newRunsCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "runs create|show|finish",
		Short: "Record, inspect and finish runs (bindings, end-of-run snapshot)",
		Long:  runsHelp,
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			return usagef("runs needs a subcommand: create or show")
		},
	}
	var scope, runID, user, priority string
	var children []string
	create := &cobra.Command{
		Use:   "create --scope SPACE/AGENT/SESSION --run RUN --user USER [--priority low|normal|high] [--child INSTANCE]...",
		Short: "Record a new run's binding and print it as JSON",
		Long: "Record a new run's binding and print it as JSON. Creating the same run again\n" +
			"with the same session and user prints the existing binding (a platform may\n" +
			"retry); anything else already bound to that run id is refused.\n\n" +
			"Each --child INSTANCE starts that child instance of the run from the main\n" +
			"scope's files: a fork of main as of a snapshot taken now (loomfs fork), whose\n" +
			"result is listed under \"children\". A child forked from main already (a\n" +
			"retry) is listed with \"existing\": true; one holding other files is refused.\n\n" + runsHelp,
		Example: `  loomfs --backend shared_posix --root /mnt/loom --volume-id team-v1 \
    runs create --scope acme/coder/s1 --run r-42 --user alice@example.com
  loomfs runs create --scope acme/coder/s1 --run r-43 --user alice@example.com --child sub-1`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			sc, err := store.ParseScope(scope)
			if err != nil {
				return usageError{err}
			}
			if !sc.Main() {
				return usagef("--scope: want SPACE/AGENT/SESSION (the session the run belongs to), not a child instance")
			}
			if runID == "" || user == "" {
				return usagef("--run and --user are required")
			}
			for _, inst := range children {
				if err := store.ValidateID("instance", inst); err != nil {
					return usageError{err}
				}
			}
			if priority != "" {
				if _, err := policy.ParsePriority(priority); err != nil {
					return usagef("--priority %q: want low, normal or high", priority)
				}
			}
			ctx := cmd.Context()
			b, err := store.CreateRun(ctx, g.storeConfig(), store.RunSpec{Space: sc.Space, Agent: sc.Agent, Session: sc.Session, Run: runID, User: user, Priority: policy.Priority(priority)})
			if err != nil {
				return refuse(cmd, g, err)
			}
			g.auditAdmin(ctx, "run_create", sc, map[string]any{"run": runID, "user": user, "volume_id": b.VolumeID, "priority": b.Priority})
			if len(children) == 0 {
				return printJSON(cmd, b)
			}
			out := runCreated{Binding: b}
			for _, inst := range children {
				res, err := startChild(ctx, g, runID, inst)
				if err != nil {
					return refuse(cmd, g, err)
				}
				out.Children = append(out.Children, res)
			}
			return printJSON(cmd, out)
		},
	}
	create.Flags().StringVar(&scope, "scope", "", "the run's session, SPACE/AGENT/SESSION (required)")
	create.Flags().StringVar(&runID, "run", "", "run id from the platform's run record (required)")
	create.Flags().StringVar(&user, "user", "", "the authenticated user who started the run (required)")
	create.Flags().StringVar(&priority, "priority", "", "the run's class: low, normal or high (default: the policy's)")
	create.Flags().StringArrayVar(&children, "child", nil, "start this child instance from a fork of the main scope's files (repeatable; see loomfs fork)")

	show := &cobra.Command{
		Use:   "show --run RUN",
		Short: "Resume a run's binding and print what it resolves to, as JSON",
		Long: "Resolve a run the way every resume does and print it as JSON: its binding and\n" +
			"its main scope (name and hash, the same on every node), or that it is a\n" +
			"legacy run.\n\n" + runsHelp,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if runID == "" {
				return usagef("--run is required")
			}
			r, err := store.ResumeRun(cmd.Context(), g.storeConfig(), runID)
			if err != nil {
				return refuse(cmd, g, err)
			}
			defer r.Close()
			out := runShow{RunID: r.ID(), Legacy: r.Legacy(), Binding: r.Binding()}
			if b := r.Binding(); b != nil {
				out.MainScope, out.MainScopeHash = b.MainScope().String(), b.MainScope().Hash()
			} else {
				out.LegacyDir = r.Volume().Path() + "/" + store.LegacyRunsDir + "/" + r.ID()
			}
			return printJSON(cmd, out)
		},
	}
	show.Flags().StringVar(&runID, "run", "", "run id (required)")
	var instances, publishPaths []string
	var publish bool
	finish := &cobra.Command{
		Use:   "finish --run RUN [--instance I]... [--publish [--publish-path P]...]",
		Short: "End a run: clear its temporary areas and snapshot its workspaces",
		Long: `End a run (SPEC §6): in its main workspace and each --instance, empty the
subtrees the policy marks clear_at_run_end (tmp/ in the standard preset), then
take a snapshot labelled with the run, which gives an immutable per-run artifact
view ("loomfs snapshot list"). The scope's session sandbox, if this node's
service ("loomfs serve") runs one, is stopped first. Refused while a command
runs, a session sandbox runs on another node, or the scope is quarantined.
Prints the snapshots as JSON.

--publish then copies the run's outputs from those snapshots to the S3
object store, so they outlive the volume and stay as they were when the run
finished ("loomfs artifacts list --published"): the files under each
--publish-path (default: the subtrees the policy marks "publish: true", else
output/) of the main workspace and of each --instance (as
subagents/<instance>/...), as content-addressed objects (what the store
already holds is not sent again), then a manifest with each file's path,
size, sha256 and mode, the snapshots and the audit heads. The manifest is
written last, so a cut upload leaves none and the next "runs finish
--publish" resumes it; a run is published once and never replaced. With
--publish the answer is {"snapshots": [...], "published": {...}}.

` + s3Help,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if runID == "" {
				return usagef("--run is required")
			}
			if len(publishPaths) > 0 && !publish {
				return usagef("--publish-path needs --publish")
			}
			for _, p := range publishPaths {
				if _, err := policy.CleanPath(p, false); err != nil {
					return usagef("--publish-path: %v", err)
				}
			}
			ctx := cmd.Context()
			pol, err := g.loadPolicy()
			if err != nil {
				return err
			}
			r, err := store.ResumeRun(ctx, g.storeConfig(), runID)
			if err != nil {
				return refuse(cmd, g, err)
			}
			defer r.Close()
			open := []func() (*store.Workspace, error){func() (*store.Workspace, error) { return r.Main(ctx, pol) }}
			for _, inst := range instances {
				open = append(open, func() (*store.Workspace, error) { return r.Instance(ctx, inst, pol) })
			}
			var out []*snapshot.Manifest
			procs := nodeservice.NewClient(socketPath())
			defer procs.Close()
			for _, o := range open {
				m, err := finishScope(ctx, o, runID, procs)
				if err != nil {
					return refuse(cmd, g, err)
				}
				out = append(out, m)
			}
			if !publish {
				return printJSON(cmd, out)
			}
			paths := publishPaths
			if len(paths) == 0 {
				paths = pol.PublishedDirs()
			}
			pub, err := g.publishRun(ctx, r, out, paths)
			if err != nil {
				return refuse(cmd, g, err)
			}
			return printJSON(cmd, runFinished{Snapshots: out, Published: pub})
		},
	}
	finish.Flags().StringVar(&runID, "run", "", "run id (required)")
	finish.Flags().StringArrayVar(&instances, "instance", nil, "a child instance of the run to finish too (repeatable)")
	finish.Flags().BoolVar(&publish, "publish", false, "publish the run's outputs to the S3 object store (AGENT_LOOM_S3_*)")
	finish.Flags().StringArrayVar(&publishPaths, "publish-path", nil, "a subtree of each finished scope to publish (repeatable; default: the policy's publish subtrees, else output; \".\" for all)")
	cmd.AddCommand(create, show, finish)
	return cmd
}

// finishScope stops the scope's session sandbox on this node, then clears
// its temporary areas and snapshots it, under one hold of the scope lock.
func finishScope(ctx context.Context, open func() (*store.Workspace, error), runID string, procs *nodeservice.Client) (*snapshot.Manifest, error) {
	ws, err := open()
	if err != nil {
		return nil, err
	}
	defer ws.Close()
	if m, _ := ws.SessionMarkerOf(); m != nil {
		if _, err := procs.Stop(ctx, ws.Scope().String(), "runs-finish-"+runID); err != nil {
			return nil, err
		}
	}
	if err := recordLayout(ctx, ws); err != nil {
		return nil, err
	}
	unlock, err := ws.Lock(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if _, err := retention.ClearTemporary(ctx, ws, retention.ClearOptions{Locked: true}); err != nil {
		return nil, err
	}
	return snapshot.Create(ctx, ws, snapshot.Options{Run: runID, Label: "end of run " + runID, Locked: true})
}

// runCreated is what "runs create --child" prints: the binding, and the
// fork that started each child.
type runCreated struct {
	*store.Binding
	Children []*fork.Result `json:"children"`
}

// startChild forks the run's main scope into its child instance
// (loom.Node.StartChild).
func startChild(ctx context.Context, g *globals, runID, instance string) (*fork.Result, error) {
	n, err := g.node(loom.Config{})
	if err != nil {
		return nil, err
	}
	defer n.Close()
	return n.StartChild(ctx, runID, instance, fork.Options{})
}

// runFinished is what "runs finish --publish" prints.
type runFinished struct {
	Snapshots []*snapshot.Manifest `json:"snapshots"`
	Published *published           `json:"published"`
}

// runShow is what "runs show" prints.
type runShow struct {
	RunID         string         `json:"run_id"`
	Legacy        bool           `json:"legacy"`
	Binding       *store.Binding `json:"binding,omitempty"`
	MainScope     string         `json:"main_scope,omitempty"`
	MainScopeHash string         `json:"main_scope_hash,omitempty"`
	LegacyDir     string         `json:"legacy_dir,omitempty"`
}

func printJSON(cmd *cobra.Command, v any) error {
	enc := json.NewEncoder(cmd.OutOrStdout())
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// refuse reports a refusal and exits 1: as {"error":{…}} on stdout with
// --json, else as "loomfs: CODE: message" on stderr. Usage errors pass
// through to exit 2.
func refuse(cmd *cobra.Command, g *globals, err error) error {
	var ue usageError
	if errors.As(err, &ue) {
		return err
	}
	if g.json {
		return printToolError(cmd, err)
	}
	pe := policy.AsError(err)
	fmt.Fprintf(cmd.ErrOrStderr(), "loomfs: %s: %s\n", pe.Code, pe.Message)
	return exitError{exitRefused}
}
