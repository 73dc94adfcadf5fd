package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentloom/loomfs/artifact"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/snapshot"
)

func init() { addCommand(newSnapshotCmd) }

const snapshotHelp = `Snapshots are incremental and content-addressed: each file's content is
stored once under <root>/.agentloom-snapshots/<scope-hash>/, outside every
workspace, and a file unchanged since the last snapshot is neither read nor
written again. A snapshot is taken with the scope locked; restore replaces the
whole workspace atomically, and refuses while a command runs there or the
scope is quarantined. A "loomfs mount" of the scope in another process keeps
serving the old tree after a restore: remount it.

Every change loomfs makes to a workspace (tools, mounts, commands) is noted in
a change journal, so a snapshot looks only at what changed since the last one
and records only that, on top of it. It walks the whole workspace instead when
the journals can't vouch for every change: no earlier snapshot, a restore, a
process that died without closing its journal, the last full walk more than an
hour old, or --full. Changes made to the backing store by anything other than
loomfs are seen only by a walk: take "snapshot create --full" after them.

Snapshots are NOT backups: they live on the same volume as the workspace, and
a lost volume takes both. Copy what matters to independent storage: "snapshot
archive" copies one to an S3 object store.`

func newSnapshotCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "snapshot create|list|restore|diff|archive",
		Short: "Take, list, compare and restore snapshots of a workspace",
		Long:  snapshotHelp,
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			return usagef("snapshot needs a subcommand: create, list, restore, diff or archive")
		},
	}
	var scope, label, run string
	var full bool
	var wait time.Duration
	scopeFlag := func(c *cobra.Command) {
		c.Flags().StringVar(&scope, "scope", "", "scope SPACE/AGENT/SESSION[/RUN/INSTANCE] (required)")
	}
	waitFlag := func(c *cobra.Command) {
		c.Flags().DurationVar(&wait, "wait", 30*time.Second, "how long to wait for the scope lock")
	}

	create := &cobra.Command{
		Use:   "create --scope S [--label TEXT] [--run RUN]",
		Short: "Take a snapshot of the workspace and print its manifest",
		Long:  "Take a snapshot of the workspace and print its manifest.\n\n" + snapshotHelp,
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			ws, done, err := g.openWorkspace(cmd.Context(), scope)
			if err != nil {
				return err
			}
			defer done()
			ctx, cancel := context.WithTimeout(cmd.Context(), wait)
			defer cancel()
			m, err := snapshot.Create(ctx, ws, snapshot.Options{Label: label, Run: run, Full: full})
			if err != nil {
				return err
			}
			g.auditAdmin(cmd.Context(), "snapshot_create", ws.Scope(), map[string]any{"snapshot": m.ID, "files": m.Files, "new_bytes": m.NewBytes})
			if g.json {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(m)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "snapshot %s: %d files, %d directories, %s; read %d files, stored %d new contents (%s) in %.3fs\n",
				m.ID, m.Files, m.Dirs, policy.Bytes(m.Bytes), m.Hashed, m.NewBlobs, policy.Bytes(m.NewBytes), m.Duration)
			if m.Walk == "full" {
				fmt.Fprintf(cmd.OutOrStdout(), "walked the whole workspace: %s\n", m.WalkReason)
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "looked only at the changes loomfs recorded since snapshot %s\n", m.Base)
			}
			printSkipped(cmd.OutOrStdout(), m)
			return nil
		},
	}
	scopeFlag(create)
	waitFlag(create)
	create.Flags().StringVar(&label, "label", "", "free text shown by list")
	create.Flags().StringVar(&run, "run", "", "run id the snapshot belongs to")
	create.Flags().BoolVar(&full, "full", false, "walk the whole workspace, to take in changes made behind loomfs's back")

	list := &cobra.Command{
		Use:   "list --scope S",
		Short: "List the workspace's snapshots, oldest first",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			sc, vol, err := g.scopeVolume(cmd.Context(), scope)
			if err != nil {
				return err
			}
			defer vol.Close()
			ms := []snapshot.Manifest{}
			repo, err := snapshot.OpenRepo(vol, sc, false)
			if err == nil {
				ms, err = repo.List()
				repo.Close()
			}
			if err != nil && policy.CodeOf(err) != policy.NotFound {
				return err
			}
			if g.json {
				if ms == nil {
					ms = []snapshot.Manifest{}
				}
				return json.NewEncoder(cmd.OutOrStdout()).Encode(ms)
			}
			if len(ms) == 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "scope %s has no snapshots\n", sc)
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tCREATED\tRUN\tFILES\tSIZE\tNEW\tLABEL")
			for _, m := range ms {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", m.ID, m.Created.UTC().Format(time.RFC3339), m.Run, m.Files, policy.Bytes(m.Bytes), policy.Bytes(m.NewBytes), m.Label)
			}
			return tw.Flush()
		},
	}
	scopeFlag(list)

	var fromArchive bool
	restore := &cobra.Command{
		Use:   "restore --scope S ID | --from-archive [ID]",
		Short: "Replace the workspace with snapshot ID, atomically (from the volume or the S3 archive)",
		Long: "Replace the whole workspace with snapshot ID, atomically.\n\n" +
			"--from-archive rebuilds it from the S3 object store alone (\"snapshot archive\";\n" +
			"ID defaults to the scope's newest archived snapshot), on this volume or on a\n" +
			"fresh one: the contents the volume lacks are downloaded and each checked\n" +
			"against its sha256, the snapshot is recorded on the volume, then the tree is\n" +
			"swapped in, byte for byte, with its files' modes and times and its emulated\n" +
			"links. A missing, truncated or altered object is refused, naming it, and the\n" +
			"workspace is left as it was.\n\n" + snapshotHelp + "\n\n" + s3Help,
		Args: cobra.RangeArgs(0, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !fromArchive && len(args) != 1 {
				return usagef("restore needs the snapshot ID (see snapshot list), or --from-archive")
			}
			id := ""
			if len(args) == 1 {
				id = args[0]
			}
			ws, done, err := g.openWorkspace(cmd.Context(), scope)
			if err != nil {
				return err
			}
			defer done()
			var m *snapshot.Manifest
			detail := map[string]any{}
			if fromArchive {
				var got artifact.Fetched
				m, got, err = g.restoreArchive(cmd.Context(), ws, id, wait)
				detail["from_archive"], detail["blobs_fetched"], detail["bytes_fetched"] = true, got.Blobs, got.Bytes
			} else {
				ctx, cancel := context.WithTimeout(cmd.Context(), wait)
				defer cancel()
				m, err = snapshot.Restore(ctx, ws, id, snapshot.RestoreOptions{})
			}
			if err != nil && fromArchive {
				return refuse(cmd, g, err)
			}
			if err != nil {
				return err
			}
			detail["snapshot"] = m.ID
			g.auditAdmin(cmd.Context(), "snapshot_restore", ws.Scope(), detail)
			if g.json {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(m)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "restored %s to snapshot %s (%d files, %s)\n", ws.Scope(), m.ID, m.Files, policy.Bytes(m.Bytes))
			return nil
		},
	}
	scopeFlag(restore)
	waitFlag(restore)
	restore.Flags().BoolVar(&fromArchive, "from-archive", false, "rebuild from the snapshot's archive in the S3 object store (AGENT_LOOM_S3_*)")

	var id string
	archive := &cobra.Command{
		Use:   "archive --scope S [--id ID]",
		Short: "Copy a snapshot to the S3 object store, sending only what it lacks",
		Long: `Copy snapshot --id (default: the scope's newest) off the volume to the S3 object
store: each content the store lacks (named by its sha256, shared with published
runs, so archiving a slowly changing scope again sends only its changes), then
the snapshot's entries (paths, types, sizes, modes, times, sha256) under
snapshots/<scope-hash>/<id>.json, written last: a cut upload leaves no archive,
and archiving again resumes it. An archive already there is kept, and
archiving again sends any content the store has lost since. "snapshot restore
--from-archive" rebuilds the scope from it alone.

` + s3Help,
		Example: `  loomfs snapshot create --scope acme/coder/s1 && loomfs snapshot archive --scope acme/coder/s1
  loomfs snapshot restore --scope acme/coder/s1 --from-archive`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			sc, vol, err := g.scopeVolume(cmd.Context(), scope)
			if err != nil {
				return err
			}
			defer vol.Close()
			st, err := openArtifactStore(cmd.Context())
			if err != nil {
				return refuse(cmd, g, err)
			}
			a, sent, err := st.ArchiveSnapshot(cmd.Context(), vol, sc, id)
			if err != nil {
				return refuse(cmd, g, err)
			}
			g.auditAdmin(cmd.Context(), "snapshot_archive", sc, map[string]any{"snapshot": a.Snapshot.ID, "blobs_sent": sent.Blobs, "bytes_sent": sent.Bytes})
			out := archived{Snapshot: a.Snapshot.ID, Scope: a.Scope, Files: a.Snapshot.Files, Bytes: a.Snapshot.Bytes, Sent: sent}
			if g.json {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(out)
			}
			if !sent.Manifest {
				fmt.Fprintf(cmd.OutOrStdout(), "snapshot %s of %s was archived already\n", out.Snapshot, out.Scope)
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "archived snapshot %s of %s (%d files, %s): sent %d contents (%s), %d were there\n",
				out.Snapshot, out.Scope, out.Files, policy.Bytes(out.Bytes), sent.Blobs, policy.Bytes(sent.Bytes), sent.Present)
			return nil
		},
	}
	scopeFlag(archive)
	archive.Flags().StringVar(&id, "id", "", "the snapshot to archive (default: the newest)")

	diff := &cobra.Command{
		Use:   "diff --scope S FROM [TO]",
		Short: "List paths added, changed and removed between two snapshots, or FROM and now",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 1 || len(args) > 2 {
				return usagef("snapshot diff takes FROM and an optional TO (default: the workspace as it is now)")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			ws, done, err := g.openWorkspace(cmd.Context(), scope)
			if err != nil {
				return err
			}
			defer done()
			to := snapshot.Live
			if len(args) == 2 {
				to = args[1]
			}
			c, err := snapshot.Diff(cmd.Context(), ws, args[0], to)
			if err != nil {
				return err
			}
			if g.json {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(c)
			}
			out := cmd.OutOrStdout()
			for _, p := range c.Added {
				fmt.Fprintf(out, "A %s\n", p)
			}
			for _, p := range c.Changed {
				fmt.Fprintf(out, "M %s\n", p)
			}
			for _, p := range c.Removed {
				fmt.Fprintf(out, "D %s\n", p)
			}
			return nil
		},
	}
	scopeFlag(diff)

	cmd.AddCommand(create, list, restore, diff, archive)
	return cmd
}

func printSkipped(w io.Writer, m *snapshot.Manifest) {
	if len(m.Skipped) == 0 {
		return
	}
	fmt.Fprintf(w, "not kept (%d):\n", len(m.Skipped))
	for _, s := range m.Skipped {
		fmt.Fprintf(w, "  %s\t%s\n", s.Path, s.Reason)
	}
}
