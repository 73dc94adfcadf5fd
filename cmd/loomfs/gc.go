package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/retention"
	"github.com/agentloom/loomfs/store"
)

func init() { addCommand(newGCCmd) }

const gcHelp = `Reclaim sessions and snapshots older than --days (default 7), unless pinned
("loomfs pin"). A session's age is the time since anything in its files or
call records last changed; removing it removes its main workspace and every
run's child workspaces. A scope where a command runs (execution marker), whose
lock is held, or that is quarantined is never touched: it is reported as kept.
Audit logs and run bindings are never removed. Sessions are reclaimed in
priority order: low first, then normal, then high (a session is as high as
the highest of its runs, "loomfs runs create --priority"; one with no run
has the policy's default class), and within a class the oldest first;
--dry-run lists them in that order.

With --clear-tmp --scope S, instead empty the subtrees the policy marks
clear_at_run_end (tmp/ in the standard policy), as at the end of a run.

With archive_before_reclaim: true in the policy, an old snapshot is reclaimed
only once the S3 object store holds a verified archive of it ("loomfs snapshot
archive": the archive and every content it names, with their sizes), and an
old session only once each of its scopes has a snapshot taken since its last
change, archived and verified; the others are kept and the report says why
(no store configured, archive missing, or unverified and what is wrong).

Progress goes to stderr; the report to stdout (JSON with --json).`

func newGCCmd(g *globals) *cobra.Command {
	var days int
	var dryRun, clearTmp bool
	var scope string
	cmd := &cobra.Command{
		Use:   "gc [--days N] [--dry-run] | gc --clear-tmp --scope S",
		Short: "Reclaim old sessions and snapshots, or empty a workspace's tmp/",
		Long:  gcHelp,
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if clearTmp {
				return g.clearTmp(cmd, scope)
			}
			if scope != "" {
				return usagef("--scope goes with --clear-tmp; gc reclaims across the whole volume")
			}
			if days < 1 {
				return usagef("--days must be at least 1")
			}
			pol, err := g.loadPolicy()
			if err != nil {
				return err
			}
			vol, err := store.OpenVolume(ctx, g.storeConfig())
			if err != nil {
				return err
			}
			defer vol.Close()
			opt := retention.Options{
				MaxAge:       time.Duration(days) * 24 * time.Hour,
				DryRun:       dryRun,
				Progress:     os.Stderr,
				Priority:     pol.Class(),
				ArchiveFirst: pol.ArchiveBeforeReclaim,
			}
			if opt.ArchiveFirst {
				if opt.Archives, err = archivesFromEnv(ctx); err != nil {
					return err
				}
			}
			rep, err := retention.Collect(ctx, vol, opt)
			if rep != nil && !dryRun {
				for _, it := range rep.Removed {
					if sc, perr := store.ParseScope(it.Scope); perr == nil {
						g.auditAdmin(ctx, "gc_remove_"+it.Kind, sc, map[string]any{"snapshot": it.Snapshot, "last_used": it.LastUsed})
					}
				}
			}
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if g.json {
				return json.NewEncoder(out).Encode(rep)
			}
			verb := "removed"
			if dryRun {
				verb = "would remove"
			}
			for _, it := range rep.Removed {
				prio := ""
				if it.Priority != "" {
					prio = ", priority " + string(it.Priority)
				}
				fmt.Fprintf(out, "%s %s %s %s (last used %s%s)\n", verb, it.Kind, it.Scope, it.Snapshot, it.LastUsed.Format(time.RFC3339), prio)
			}
			for _, it := range rep.Kept {
				fmt.Fprintf(out, "kept %s %s %s: %s\n", it.Kind, it.Scope, it.Snapshot, it.Reason)
			}
			for _, e := range rep.Errors {
				fmt.Fprintf(out, "error: %s\n", e)
			}
			fmt.Fprintf(out, "%d %s, %d kept, %s freed\n", len(rep.Removed), verb, len(rep.Kept), policy.Bytes(rep.Freed))
			if len(rep.Errors) > 0 {
				return exitError{exitRefused}
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&days, "days", 7, "reclaim what is older than this many days")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "list what would be removed; remove nothing")
	cmd.Flags().BoolVar(&clearTmp, "clear-tmp", false, "empty the scope's clear_at_run_end subtrees (needs --scope)")
	cmd.Flags().StringVar(&scope, "scope", "", "scope for --clear-tmp")
	return cmd
}

func (g *globals) clearTmp(cmd *cobra.Command, scope string) error {
	ws, done, err := g.openWorkspace(cmd.Context(), scope)
	if err != nil {
		return err
	}
	defer done()
	ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
	defer cancel()
	u, err := retention.ClearTemporary(ctx, ws, retention.ClearOptions{})
	if err != nil {
		return err
	}
	g.auditAdmin(cmd.Context(), "clear_tmp", ws.Scope(), map[string]any{"files": u.Files, "bytes": u.Bytes})
	if g.json {
		return json.NewEncoder(cmd.OutOrStdout()).Encode(map[string]any{"scope": ws.Scope().String(), "dirs": ws.Policy().TemporaryDirs(), "files": u.Files, "bytes": u.Bytes})
	}
	fmt.Fprintf(cmd.OutOrStdout(), "cleared %v of %s: %d entries, %s\n", ws.Policy().TemporaryDirs(), ws.Scope(), u.Files, policy.Bytes(u.Bytes))
	return nil
}
