package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentloom/loomfs/fork"
	"github.com/agentloom/loomfs/policy"
)

func init() {
	addCommand(newForkCmd)
	addCommand(newMergeCmd)
}

const forkHelp = `A fork is a copy of a scope as of one of its snapshots (taken first unless
--from names one as SCOPE@SNAPSHOT), made into an empty scope: a child instance
SPACE/AGENT/SESSION/RUN/INSTANCE to start a sub-agent from main's files, or
another session. File data comes from the snapshot store's contents, shared
with them (FICLONE) on XFS and btrfs, copied elsewhere. The destination's
policy applies: a fork over its quota is refused whole with the figures, and a
subtree hidden or write-only in the source is left out unless the destination
keeps it so too. The fork's base is recorded in its state directory, for
"loomfs merge" and the agent's workspace_fork_status.`

func newForkCmd(g *globals) *cobra.Command {
	var from, to string
	var wait time.Duration
	var noClone bool
	cmd := &cobra.Command{
		Use:   "fork --from SCOPE[@SNAPSHOT] --to SCOPE2",
		Short: "Make an empty scope a copy of another as of a snapshot",
		Long:  forkHelp,
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			srcArg, snap, _ := strings.Cut(from, "@")
			if srcArg == "" || to == "" {
				return usagef("fork needs --from SCOPE[@SNAPSHOT] and --to SCOPE2")
			}
			if _, err := parseScopeFlag(srcArg); err != nil {
				return err
			}
			if _, err := parseScopeFlag(to); err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), wait)
			defer cancel()
			src, doneSrc, err := g.openWorkspace(ctx, srcArg)
			if err != nil {
				return err
			}
			defer doneSrc()
			dst, doneDst, err := g.openWorkspace(ctx, to)
			if err != nil {
				return err
			}
			defer doneDst()
			res, err := fork.Fork(ctx, src, dst, fork.Options{Snapshot: snap, NoClone: noClone})
			if err != nil {
				return err
			}
			detail := map[string]any{"from": res.From, "to": res.To, "snapshot": res.Snapshot, "files": res.Files, "bytes": res.Bytes, "clone": res.Clone}
			g.auditAdmin(cmd.Context(), "fork", dst.Scope(), detail)
			g.auditAdmin(cmd.Context(), "fork_source", src.Scope(), detail)
			if g.json {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(res)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "forked %s@%s to %s: %d files, %d directories, %s (%d cloned, %d copied) in %.3fs\n",
				res.From, res.Snapshot, res.To, res.Files, res.Dirs, policy.Bytes(res.Bytes), res.Cloned, res.Copied, res.Duration)
			for _, s := range res.Skipped {
				fmt.Fprintf(out, "left out %s: %s\n", s.Path, s.Reason)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&from, "from", "", "source scope, SPACE/AGENT/SESSION[/RUN/INSTANCE][@SNAPSHOT]")
	cmd.Flags().StringVar(&to, "to", "", "destination scope (must hold no file)")
	cmd.Flags().DurationVar(&wait, "wait", 5*time.Minute, "how long the fork may take, scope locks included")
	cmd.Flags().BoolVar(&noClone, "no-clone", false, "copy file data even where the filesystem could share it")
	return cmd
}

const mergeHelp = `Merge brings what a fork changed since its base back into the scope it was
forked from. Per file: changed only in the fork, it is applied with the base's
sha256 as the expected one, so a change made in the target since is never
overwritten; changed on both sides, it is a conflict: both_modified,
modified_deleted (the fork changed it, the target deleted it), deleted_modified,
both_added or type_changed, listed with the three sha256. The files are applied
as one change set under both scopes' locks, all or none: a conflict, or a
change the target's policy refuses (read-only, hidden), applies nothing unless
--partial. The change feed shows the merge as one call of the platform.
Emulated links are carried as the target's policy says (symlinks: refuse
refuses them); a new file keeps the fork's owner bits, a replaced one the
target's mode.

Exit status: 0 merged (or, with --dry-run, previewed), 1 refused or held back
by conflicts (the result is printed all the same), 2 usage error.`

func newMergeCmd(g *globals) *cobra.Command {
	var from, into, call string
	var paths []string
	var dryRun, partial, markers bool
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "merge --from SCOPE2 --into SCOPE [--dry-run] [--partial] [--markers] [--paths P]…",
		Short: "Bring a fork's changes back, per file, with typed conflicts",
		Long:  mergeHelp,
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if from == "" || into == "" {
				return usagef("merge needs --from SCOPE2 (the fork) and --into SCOPE")
			}
			if _, err := parseScopeFlag(from); err != nil {
				return err
			}
			if _, err := parseScopeFlag(into); err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), wait)
			defer cancel()
			fws, doneFork, err := g.openWorkspace(ctx, from)
			if err != nil {
				return err
			}
			defer doneFork()
			tws, doneTarget, err := g.openWorkspace(ctx, into)
			if err != nil {
				return err
			}
			defer doneTarget()
			res, err := fork.Merge(ctx, fws, tws, fork.MergeOptions{DryRun: dryRun, Partial: partial, Paths: paths, Markers: markers, Call: call})
			if res == nil {
				return err
			}
			if !dryRun {
				result := "ok"
				if err != nil {
					result = string(policy.CodeOf(err))
				}
				detail := map[string]any{"from": res.From, "into": res.Into, "base": res.Base, "call_id": res.Call, "merged": res.Merged,
					"applied": len(res.Applied), "conflicts": len(res.Conflicts), "refused": len(res.Refused), "result": result}
				g.auditAdmin(cmd.Context(), "merge", tws.Scope(), detail)
				g.auditAdmin(cmd.Context(), "merge_source", fws.Scope(), detail)
			}
			out := cmd.OutOrStdout()
			if g.json {
				if jerr := json.NewEncoder(out).Encode(res); jerr != nil {
					return jerr
				}
			} else {
				printMerge(out, res)
			}
			if err != nil {
				fmt.Fprintln(cmd.ErrOrStderr(), "loomfs:", err)
				return exitError{exitRefused}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&from, "from", "", "the fork, SPACE/AGENT/SESSION[/RUN/INSTANCE]")
	cmd.Flags().StringVar(&into, "into", "", "the scope it was forked from")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "list what would be merged and the conflicts; change nothing")
	cmd.Flags().BoolVar(&partial, "partial", false, "apply what conflicts with nothing even when other files conflict")
	cmd.Flags().BoolVar(&markers, "markers", false, "for text files both sides changed, write PATH.conflict with conflict markers beside the target's file")
	cmd.Flags().StringArrayVar(&paths, "paths", nil, "merge only these paths and what is under them (repeatable)")
	cmd.Flags().StringVar(&call, "call-id", "", "call id the change feed shows the merge as (default: a new one)")
	cmd.Flags().DurationVar(&wait, "wait", 5*time.Minute, "how long the merge may take, scope locks included")
	return cmd
}

func printMerge(out io.Writer, res *fork.MergeResult) {
	verb := "merged"
	switch {
	case res.DryRun:
		verb = "would merge"
	case !res.Merged:
		verb = "not merged"
	}
	fmt.Fprintf(out, "%s %s into %s (base snapshot %s): %d changes, %d conflicts, %d refused\n",
		verb, res.From, res.Into, res.Base, len(res.Applied), len(res.Conflicts), len(res.Refused))
	for _, a := range res.Applied {
		fmt.Fprintf(out, "  %-6s %s\n", a.Op, a.Path)
	}
	for _, c := range res.Conflicts {
		fmt.Fprintf(out, "  CONFLICT %s %s (base %.12s, target %.12s, fork %.12s)", c.Type, c.Path, c.Base, c.Target, c.Fork)
		if c.Marker != "" {
			fmt.Fprintf(out, ", markers in %s", c.Marker)
		}
		fmt.Fprintln(out)
	}
	for _, r := range res.Refused {
		fmt.Fprintf(out, "  REFUSED %s: %s\n", r.Path, r.Message)
	}
	for _, s := range res.Skipped {
		fmt.Fprintf(out, "  skipped %s: %s\n", s.Path, s.Message)
	}
}
