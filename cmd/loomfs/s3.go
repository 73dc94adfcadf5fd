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
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentloom/loomfs/artifact"
	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/retention"
	"github.com/agentloom/loomfs/snapshot"
	"github.com/agentloom/loomfs/store"
)

// The S3 store's doors: "runs finish --publish", "artifacts --published",
// "audit anchor --to s3://", "audit verify --anchor s3://" and the snapshot
// archive share its configuration, read here from the environment.

const s3Help = `The object store is any S3-compatible service: AGENT_LOOM_S3_ENDPOINT (empty:
AWS itself), AGENT_LOOM_S3_BUCKET (published runs and archived snapshots),
AGENT_LOOM_S3_PREFIX (put before every key), AGENT_LOOM_S3_PATH_STYLE=true
(most self-hosted services, e.g. Ceph RGW or MinIO). Credentials come from the
AWS SDK's standard chain (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY,
AWS_PROFILE and the shared files, an instance or pod role), never from the
policy file, and never appear in an answer or a log.`

// openArtifactStore opens the store AGENT_LOOM_S3_* describe; a malformed
// variable is a usage error.
func openArtifactStore(ctx context.Context) (*artifact.Store, error) {
	cfg, err := artifact.ConfigFromEnv()
	if err != nil {
		return nil, usageError{err}
	}
	return artifact.Open(ctx, cfg)
}

// openAnchorStore opens the store for anchors under s3://BUCKET/PREFIX: the
// endpoint and addressing from the environment, the bucket and prefix from
// the URL.
func openAnchorStore(ctx context.Context, url string) (*artifact.Store, error) {
	bucket, prefix, err := artifact.ParseURL(url)
	if err != nil {
		return nil, usageError{err}
	}
	cfg, err := artifact.ConfigFromEnv()
	if err != nil {
		return nil, usageError{err}
	}
	cfg.AnchorBucket, cfg.Prefix = bucket, prefix
	return artifact.Open(ctx, cfg)
}

// published is what "runs finish --publish" adds to its answer.
type published struct {
	Run     string             `json:"run"`
	Files   int                `json:"files"`
	Bytes   int64              `json:"bytes"`
	Skipped []artifact.Skipped `json:"skipped,omitempty"`
	Sent    artifact.Sent      `json:"sent"`
}

// publishRun publishes the run's files under paths from its end-of-run
// snapshots, with the audit heads of this moment, and audits it.
func (g *globals) publishRun(ctx context.Context, r *store.Run, snaps []*snapshot.Manifest, paths []string) (*published, error) {
	st, err := openArtifactStore(ctx)
	if err != nil {
		return nil, err
	}
	opt := artifact.PublishOptions{Paths: paths}
	if a, err := audit.Heads(auditDir(g), time.Now()); err == nil && len(a.Heads) > 0 {
		opt.Audit = &a
	}
	m, sent, err := st.Publish(ctx, r, snaps, opt)
	if err != nil {
		return nil, err
	}
	g.auditAdmin(ctx, "run_publish", r.Binding().MainScope(), map[string]any{
		"run": r.ID(), "files": len(m.Files), "bytes": m.Bytes, "blobs_sent": sent.Blobs, "bytes_sent": sent.Bytes})
	return &published{Run: m.Run, Files: len(m.Files), Bytes: m.Bytes, Skipped: m.Skipped, Sent: sent}, nil
}

// publishedOp runs f on the store and records it in the volume's audit log
// as the live artifact doors do, then reports f's refusal, if any. f fills
// in the event (the run's scope once the manifest is read).
func (g *globals) publishedOp(cmd *cobra.Command, runID, user, op, path string, f func(*artifact.Store, *audit.Event) error) error {
	ctx := cmd.Context()
	vol, err := store.OpenVolume(ctx, g.storeConfig())
	if err != nil {
		return refuse(cmd, g, err)
	}
	defer vol.Close()
	log, err := audit.Open(vol.Path(), audit.Options{})
	if err != nil {
		return refuse(cmd, g, auditUnavailable(err))
	}
	defer log.Close()
	st, err := openArtifactStore(ctx)
	if err != nil {
		return refuse(cmd, g, err)
	}
	ev := audit.Event{Actor: audit.Actor{Run: runID}, Source: audit.SourceAdmin, Op: op, Path: path,
		Detail: map[string]any{"user": user, "published": true}}
	start := time.Now()
	ferr := f(st, &ev)
	ev.Duration = time.Since(start)
	ev.Result = "ok"
	if ferr != nil {
		pe := policy.AsError(ferr)
		ev.Result, ev.Code = "refused", string(pe.Code)
	}
	if err := log.Record(ctx, ev); err != nil {
		return refuse(cmd, g, auditUnavailable(err))
	}
	if ferr != nil {
		return refuse(cmd, g, ferr)
	}
	return nil
}

// scopeOf names the published run's scope in ev.
func scopeOf(m *artifact.Manifest, ev *audit.Event) {
	if sc, err := store.ParseScope(m.Scope); err == nil {
		ev.Actor = actorOf(sc)
		ev.Actor.Run = m.Run
		ev.Scope = sc.Hash()
	}
}

// listPublished prints the run's published files.
func (g *globals) listPublished(cmd *cobra.Command, runID, user string) error {
	var b bytes.Buffer
	err := g.publishedOp(cmd, runID, user, "artifact_list", "", func(st *artifact.Store, ev *audit.Event) error {
		m, err := st.List(cmd.Context(), runID, user)
		if err != nil {
			return err
		}
		scopeOf(m, ev)
		ev.Detail["count"] = len(m.Files)
		if g.json {
			enc := json.NewEncoder(&b)
			enc.SetIndent("", "  ")
			return enc.Encode(m)
		}
		tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "# run %s, published %s: %d files, %d bytes\n", m.Run, m.Published.Format(time.RFC3339), len(m.Files), m.Bytes)
		fmt.Fprintln(tw, "PATH\tSIZE\tMODE\tSHA256")
		for _, f := range m.Files {
			fmt.Fprintf(tw, "%s\t%d\t%04o\t%s\n", auditCell(f.Path), f.Size, f.Mode, f.SHA256)
		}
		for _, s := range m.Skipped {
			fmt.Fprintf(tw, "%s\t-\t-\tnot published: %s\n", auditCell(s.Path), s.Reason)
		}
		return tw.Flush()
	})
	if err != nil {
		return err
	}
	_, err = cmd.OutOrStdout().Write(b.Bytes())
	return err
}

// getPublished streams one published file to stdout or a new file; the
// file is removed if the store's copy turns out not to match.
func (g *globals) getPublished(cmd *cobra.Command, runID, user, path, output string) error {
	return g.publishedOp(cmd, runID, user, "artifact_get", path, func(st *artifact.Store, ev *audit.Event) (err error) {
		var w io.Writer = cmd.OutOrStdout()
		if output != "" {
			out, oerr := os.OpenFile(output, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
			if oerr != nil {
				return fmt.Errorf("--output: %w", oerr)
			}
			// err is f's result: a refusal removes the partial file.
			defer func() {
				if cerr := out.Close(); err == nil && cerr != nil {
					err = fmt.Errorf("--output: %w", cerr)
				}
				if err != nil {
					os.Remove(output)
				}
			}()
			w = out
		}
		m, err := st.List(cmd.Context(), runID, user)
		if err != nil {
			return err
		}
		scopeOf(m, ev)
		h := sha256.New()
		f, err := st.Download(cmd.Context(), runID, user, path, io.MultiWriter(w, h))
		if err != nil {
			return err
		}
		ev.Bytes, ev.SHA256 = f.Size, hex.EncodeToString(h.Sum(nil))
		return nil
	})
}

// parseRetention reads a Go duration ("2160h") or a number of days ("90d").
func parseRetention(s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n <= 0 || n > 36500 {
			return 0, fmt.Errorf("%q: want a number of days from 1 to 36500, or a duration such as 2160h", s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < time.Second {
		return 0, fmt.Errorf("%q: want a duration of at least 1s (2160h) or a number of days (90d)", s)
	}
	return d, nil
}

// putS3Anchor writes a under url with a compliance retention of keep.
func putS3Anchor(ctx context.Context, url string, a audit.Anchor, keep time.Duration) (string, error) {
	st, err := openAnchorStore(ctx, url)
	if err != nil {
		return "", err
	}
	key, err := st.PutAnchor(ctx, a, keep)
	if err != nil {
		return "", err
	}
	return "s3://" + st.Config().AnchorBucket + "/" + key, nil
}

// readS3Anchors reads the newest n anchors under url (0: all); finding none
// is an error, as an empty anchor file would prove nothing.
func readS3Anchors(ctx context.Context, url string, n int) ([]audit.Anchor, error) {
	if n < 0 {
		return nil, usagef("--anchor-newest %d: want 0 (all) or more", n)
	}
	st, err := openAnchorStore(ctx, url)
	if err != nil {
		return nil, err
	}
	vs, err := st.Anchors(ctx, n)
	if err != nil {
		return nil, err
	}
	if len(vs) == 0 {
		return nil, policy.Errorf(policy.NotFound, "no anchor under %s", url)
	}
	out := make([]audit.Anchor, len(vs))
	for i, v := range vs {
		out[i] = v.Anchor
	}
	return out, nil
}

// archived is what "snapshot archive" prints.
type archived struct {
	Snapshot string        `json:"snapshot"`
	Scope    string        `json:"scope"`
	Files    int           `json:"files"`
	Bytes    int64         `json:"bytes"`
	Sent     artifact.Sent `json:"sent"`
}

// restoreArchive takes ws's scope lock, waiting at most wait, then
// rebuilds it from the archive; the download itself is not timed.
func (g *globals) restoreArchive(ctx context.Context, ws *store.Workspace, id string, wait time.Duration) (*snapshot.Manifest, artifact.Fetched, error) {
	st, err := openArtifactStore(ctx)
	if err != nil {
		return nil, artifact.Fetched{}, err
	}
	lctx, cancel := context.WithTimeout(ctx, wait)
	unlock, err := ws.Lock(lctx)
	cancel()
	if err != nil {
		return nil, artifact.Fetched{}, err
	}
	defer unlock()
	return st.RestoreArchive(ctx, ws, id, snapshot.RestoreOptions{Locked: true})
}

// archivesFromEnv is the object store gc checks archives in, or nil when
// AGENT_LOOM_S3_BUCKET names none (gc then keeps all it protects).
func archivesFromEnv(ctx context.Context) (retention.Archives, error) {
	cfg, err := artifact.ConfigFromEnv()
	if err != nil {
		return nil, usageError{err}
	}
	if cfg.Bucket == "" {
		return nil, nil
	}
	return artifact.Open(ctx, cfg)
}
