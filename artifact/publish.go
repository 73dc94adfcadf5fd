package artifact

import (
	"bytes"
	"context"
	"crypto/md5"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/snapshot"
	"github.com/agentloom/loomfs/store"
)

// DefaultPaths is what a run publishes when neither the call nor the
// policy names anything else.
var DefaultPaths = []string{"output"}

// Manifest is a published run: every file with its content's sha256 (the
// blob's key), written after every blob is in the store, so a manifest
// never names missing data.
type Manifest struct {
	Version   int       `json:"version"`
	Run       string    `json:"run"`
	User      string    `json:"user"` // the run's initiating user: only they are served
	Scope     string    `json:"scope"`
	VolumeID  string    `json:"volume_id,omitempty"`
	Published time.Time `json:"published"`
	// Paths are the subtrees of each scope that were published.
	Paths []string `json:"paths"`
	// Snapshots are the snapshots the files were read from, one a scope.
	Snapshots []SnapshotRef `json:"snapshots"`
	// Audit holds every node's audit heads when the run was published.
	Audit   *audit.Anchor `json:"audit,omitempty"`
	Files   []File        `json:"files"`
	Bytes   int64         `json:"bytes"`
	Skipped []Skipped     `json:"skipped,omitempty"`
}

// SnapshotRef names one snapshot of one scope.
type SnapshotRef struct {
	Scope string `json:"scope"`
	ID    string `json:"id"`
}

// File is one published file, named as the artifact listing names it
// (a child's under subagents/<instance>/).
type File struct {
	Path     string `json:"path"`
	Size     int64  `json:"size"`
	SHA256   string `json:"sha256"`
	Mode     uint32 `json:"mode"`
	Snapshot string `json:"snapshot"`
}

// Skipped is an object under a published path that was not published.
type Skipped struct {
	Path   string      `json:"path"`
	Reason policy.Code `json:"reason"`
}

// Sent counts what one Publish transferred.
type Sent struct {
	Blobs    int   `json:"blobs"`    // contents uploaded
	Bytes    int64 `json:"bytes"`    // their bytes
	Present  int   `json:"present"`  // contents the store already had
	Manifest bool  `json:"manifest"` // false: the run was already published, identically
}

const manifestVersion = 1

// uploaders bounds the uploads in flight.
const uploaders = 8

// PublishOptions say what to publish.
type PublishOptions struct {
	// Paths are the subtrees of each scope to publish ("." for all);
	// nil means DefaultPaths.
	Paths []string
	// Audit is the audit heads at this moment, kept in the manifest.
	Audit *audit.Anchor
	// Now stamps the manifest; zero means time.Now.
	Now time.Time
}

// Publish copies the files under opt.Paths of the given snapshots of run r
// (its end-of-run snapshots: the main workspace's and its children's) to
// the store, then writes the run's manifest. Contents the store already
// holds are not sent again. A run is published once: publishing it again
// with the same files answers the existing manifest (a retry after a cut
// upload resumes there), with other files it is refused.
func (s *Store) Publish(ctx context.Context, r *store.Run, snaps []*snapshot.Manifest, opt PublishOptions) (*Manifest, Sent, error) {
	var sent Sent
	b := r.Binding()
	if b == nil {
		return nil, sent, store.CheckArtifactUser(r.ID(), "", "")
	}
	bucket, err := s.bucket()
	if err != nil {
		return nil, sent, err
	}
	paths, err := cleanPaths(opt.Paths)
	if err != nil {
		return nil, sent, err
	}
	now := opt.Now
	if now.IsZero() {
		now = time.Now()
	}
	m := &Manifest{Version: manifestVersion, Run: r.ID(), User: b.User, Scope: b.MainScope().String(), VolumeID: b.VolumeID,
		Published: now.UTC(), Paths: paths, Audit: opt.Audit, Files: []File{}}
	var todo []blobSource
	for _, sm := range snaps {
		sc, err := store.ParseScope(sm.Scope)
		if err != nil {
			return nil, sent, err
		}
		prefix := ""
		switch {
		case sc == b.MainScope():
		case sc.Run == r.ID() && sc.Space == b.Space && sc.Agent == b.Agent && sc.Session == b.Session:
			prefix = policy.SubagentsDir + "/" + sc.Instance + "/"
		default:
			return nil, sent, policy.Errorf(policy.InvalidInput, "snapshot %s is of scope %s, not of run %s", sm.ID, sc, r.ID())
		}
		repo, err := snapshot.OpenRepo(r.Volume(), sc, false)
		if err != nil {
			return nil, sent, err
		}
		defer repo.Close()
		entries, err := repo.Entries(sm.ID)
		if err != nil {
			return nil, sent, err
		}
		m.Snapshots = append(m.Snapshots, SnapshotRef{Scope: sc.String(), ID: sm.ID})
		for _, e := range entries {
			if e.Type == "dir" || !under(e.Path, paths) {
				continue
			}
			if e.Type != "file" {
				m.Skipped = append(m.Skipped, Skipped{Path: prefix + e.Path, Reason: policy.SymlinkRefused})
				continue
			}
			f := File{Path: prefix + e.Path, Size: e.Size, SHA256: e.SHA256, Mode: e.Perm, Snapshot: sm.ID}
			m.Files = append(m.Files, f)
			m.Bytes += f.Size
			todo = append(todo, blobSource{what: f.Path, sha: f.SHA256, size: f.Size, repo: repo})
		}
	}
	slices.SortFunc(m.Files, func(a, b File) int { return strings.Compare(a.Path, b.Path) })

	if old, err := s.Manifest(ctx, r.ID()); err == nil {
		if !sameFiles(old.Files, m.Files) {
			return nil, sent, policy.Errorf(policy.Exists, "run %s was published at %s with other files; a published run is never replaced", r.ID(), old.Published.Format(time.RFC3339))
		}
		return old, sent, nil
	} else if policy.CodeOf(err) != policy.NotFound {
		return nil, sent, err
	}

	// Every content first; the first failure stops the rest, and no
	// manifest is written.
	if sent, err = s.upload(ctx, bucket, todo); err != nil {
		if policy.CodeOf(err) == policy.Cancelled {
			err = policy.Errorf(policy.Cancelled, "publishing run %s cancelled; publishing it again resumes", r.ID())
		}
		return nil, sent, err
	}
	body, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, sent, err
	}
	if err := s.put(ctx, bucket, s.manifestKey(r.ID()), body, "application/json"); err != nil {
		return nil, sent, storeErr("write the manifest of run "+r.ID(), err)
	}
	sent.Manifest = true
	return m, sent, nil
}

// blobSource is one content to upload: the file it is (for messages),
// its sha256 and size, and the snapshot store holding it.
type blobSource struct {
	what string
	sha  string
	size int64
	repo *snapshot.Repo
}

// upload sends every content of todo the store lacks, uploaders at a time,
// each once; the first failure stops the rest and is returned.
func (s *Store) upload(ctx context.Context, bucket string, todo []blobSource) (Sent, error) {
	var (
		mu   sync.Mutex
		sent Sent
		seen = map[string]bool{}
		uniq []blobSource
	)
	for _, b := range todo {
		if !seen[b.sha] {
			seen[b.sha] = true
			uniq = append(uniq, b)
		}
	}
	err := each(ctx, uniq, func(ctx context.Context, b blobSource) error {
		uploaded, err := s.putBlob(ctx, bucket, b)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if uploaded {
			sent.Blobs++
			sent.Bytes += b.size
		} else {
			sent.Present++
		}
		return nil
	})
	return sent, err
}

// each runs fn on every item, uploaders at a time. The first error cancels
// the rest and is returned; a cancelled ctx is cancelled.
func each[T any](ctx context.Context, items []T, fn func(context.Context, T) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
		slots = make(chan struct{}, uploaders)
	)
	for _, it := range items {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			if err := fn(ctx, it); err != nil {
				once.Do(func() { first = err; cancel() })
			}
		}()
	}
	wg.Wait()
	if first != nil {
		return first
	}
	if ctx.Err() != nil {
		return policy.Errorf(policy.Cancelled, "cancelled")
	}
	return nil
}

// putBlob sends b's content from its snapshot store unless the store has
// it. The content is checked against its name first: a damaged snapshot
// blob is never published under the hash it no longer has.
func (s *Store) putBlob(ctx context.Context, bucket string, b blobSource) (uploaded bool, err error) {
	key := s.blobKey(b.sha)
	head, err := s.s3.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &bucket, Key: &key})
	if err == nil && aws.ToInt64(head.ContentLength) == b.size {
		return false, nil
	}
	if err != nil && !isNotFound(err) {
		return false, storeErr("look up the content of "+b.what, err)
	}
	blob, err := b.repo.OpenBlob(b.sha)
	if err != nil {
		return false, fmt.Errorf("copy %s: %w", b.what, err)
	}
	defer blob.Close()
	sum, md, n, err := digest(blob)
	if err != nil {
		return false, fmt.Errorf("copy %s: read the snapshot's content: %w", b.what, err)
	}
	if sum != b.sha || n != b.size {
		return false, fmt.Errorf("copy %s: the snapshot's content %.12s… is damaged (%d bytes, sha256 %.12s…): not copied", b.what, b.sha, n, sum)
	}
	if _, err := blob.Seek(0, io.SeekStart); err != nil {
		return false, fmt.Errorf("copy %s: %w", b.what, err)
	}
	_, err = s.s3.PutObject(ctx, &s3.PutObjectInput{Bucket: &bucket, Key: &key, Body: blob,
		ContentLength: aws.Int64(n), ContentMD5: aws.String(md), ContentType: aws.String("application/octet-stream")})
	if err != nil {
		return false, storeErr("upload "+b.what, err)
	}
	return true, nil
}

// put writes a small object with its Content-MD5, which the service checks.
func (s *Store) put(ctx context.Context, bucket, key string, body []byte, ctype string) error {
	md := md5.Sum(body)
	_, err := s.s3.PutObject(ctx, &s3.PutObjectInput{Bucket: &bucket, Key: &key, Body: bytes.NewReader(body),
		ContentLength: aws.Int64(int64(len(body))), ContentMD5: aws.String(base64.StdEncoding.EncodeToString(md[:])), ContentType: &ctype})
	return err
}

// digest reads f whole: its sha256 (hex), MD5 (base64) and length.
func digest(f *os.File) (string, string, int64, error) {
	h, m := sha256.New(), md5.New()
	n, err := io.Copy(io.MultiWriter(h, m), f)
	if err != nil {
		return "", "", n, err
	}
	return hex.EncodeToString(h.Sum(nil)), base64.StdEncoding.EncodeToString(m.Sum(nil)), n, nil
}

// cleanPaths checks the subtrees to publish, as scope-relative paths.
func cleanPaths(raw []string) ([]string, error) {
	if len(raw) == 0 {
		raw = DefaultPaths
	}
	var out []string
	for _, p := range raw {
		c, err := policy.CleanPath(p, false)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// under reports whether path is one of dirs or beneath one.
func under(path string, dirs []string) bool {
	for _, d := range dirs {
		if d == "." || path == d || strings.HasPrefix(path, d+"/") {
			return true
		}
	}
	return false
}

func sameFiles(a, b []File) bool {
	return slices.EqualFunc(a, b, func(x, y File) bool {
		return x.Path == y.Path && x.SHA256 == y.SHA256 && x.Size == y.Size && x.Mode == y.Mode
	})
}
