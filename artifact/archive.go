package artifact

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/snapshot"
	"github.com/agentloom/loomfs/store"
)

// A snapshot archived off the volume is its contents, as blobs shared with
// published runs (so a scope archived again sends only what changed), and
// one object naming every entry, written after them:
// snapshots/<scope-hash>/<id>.json.

// Archive is an archived snapshot: everything a restore needs besides the
// contents.
type Archive struct {
	Version  int               `json:"version"`
	Scope    string            `json:"scope"`
	Archived time.Time         `json:"archived"`
	Snapshot snapshot.Manifest `json:"snapshot"`
	Entries  []snapshot.Entry  `json:"entries"`
}

const archiveVersion = 1

func (s *Store) archiveKey(sc store.Scope, id string) string {
	return s.archivePrefix(sc) + id + ".json"
}

func (s *Store) archivePrefix(sc store.Scope) string {
	return s.cfg.Prefix + "snapshots/" + sc.Hash() + "/"
}

// ArchiveSnapshot copies snapshot id of scope sc ("" for its newest) to
// the store: the contents the store lacks, then the archive object. A
// retry after a cut upload sends the rest and writes it; an archive
// already there is kept, and the contents it lost are sent again.
func (s *Store) ArchiveSnapshot(ctx context.Context, vol *store.Volume, sc store.Scope, id string) (*Archive, Sent, error) {
	var sent Sent
	bucket, err := s.bucket()
	if err != nil {
		return nil, sent, err
	}
	repo, err := snapshot.OpenRepo(vol, sc, false)
	if err != nil {
		return nil, sent, err
	}
	defer repo.Close()
	if id == "" {
		ms, err := repo.List()
		if err != nil {
			return nil, sent, err
		}
		if len(ms) == 0 {
			return nil, sent, policy.Errorf(policy.NotFound, "scope %s has no snapshots", sc)
		}
		id = ms[len(ms)-1].ID
	}
	m, err := repo.Get(id)
	if err != nil {
		return nil, sent, err
	}
	old, err := s.archive(ctx, sc, id)
	if err != nil && policy.CodeOf(err) != policy.NotFound {
		return nil, sent, err
	}
	entries, err := repo.Entries(id)
	if err != nil {
		return nil, sent, err
	}
	var todo []blobSource
	for _, e := range entries {
		if e.SHA256 != "" {
			todo = append(todo, blobSource{what: e.Path, sha: e.SHA256, size: e.Size, repo: repo})
		}
	}
	// Every content is looked up even when the archive is there, so
	// archiving again puts back what the store lost.
	if sent, err = s.upload(ctx, bucket, todo); err != nil {
		return nil, sent, err
	}
	if old != nil {
		return old, sent, nil
	}
	a := &Archive{Version: archiveVersion, Scope: sc.String(), Archived: time.Now().UTC(), Snapshot: *m, Entries: entries}
	body, err := json.Marshal(a)
	if err != nil {
		return nil, sent, err
	}
	if err := s.put(ctx, bucket, s.archiveKey(sc, id), body, "application/json"); err != nil {
		return nil, sent, storeErr("write the archive of snapshot "+id, err)
	}
	sent.Manifest = true
	return a, sent, nil
}

// Archived lists the ids of scope sc's archived snapshots, oldest first.
func (s *Store) Archived(ctx context.Context, sc store.Scope) ([]string, error) {
	bucket, err := s.bucket()
	if err != nil {
		return nil, err
	}
	prefix := s.archivePrefix(sc)
	var ids []string
	p := s3.NewListObjectsV2Paginator(s.s3, &s3.ListObjectsV2Input{Bucket: &bucket, Prefix: &prefix})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, storeErr("list the archives of scope "+sc.String(), err)
		}
		for _, o := range page.Contents {
			if id, ok := strings.CutSuffix(strings.TrimPrefix(aws.ToString(o.Key), prefix), ".json"); ok {
				ids = append(ids, id)
			}
		}
	}
	slices.Sort(ids)
	return ids, nil
}

// archive reads the archive of snapshot id of sc; none is not_found.
func (s *Store) archive(ctx context.Context, sc store.Scope, id string) (*Archive, error) {
	bucket, err := s.bucket()
	if err != nil {
		return nil, err
	}
	key := s.archiveKey(sc, id)
	out, err := s.s3.GetObject(ctx, &s3.GetObjectInput{Bucket: &bucket, Key: &key})
	if isNotFound(err) {
		return nil, policy.Errorf(policy.NotFound, "snapshot %s of scope %s is not archived", id, sc)
	}
	if err != nil {
		return nil, storeErr("read the archive "+key, err)
	}
	defer out.Body.Close()
	body, err := io.ReadAll(io.LimitReader(out.Body, maxManifestBytes+1))
	if err != nil {
		return nil, storeErr("read the archive "+key, err)
	}
	var a Archive
	if len(body) > maxManifestBytes {
		return nil, fmt.Errorf("%w: archive %s is over %d bytes", ErrDamaged, key, maxManifestBytes)
	}
	if err := json.Unmarshal(body, &a); err != nil {
		return nil, fmt.Errorf("%w: archive %s: %v", ErrDamaged, key, err)
	}
	if a.Version != archiveVersion || a.Scope != sc.String() || a.Snapshot.ID != id {
		return nil, fmt.Errorf("%w: archive %s names snapshot %q of scope %q, version %d", ErrDamaged, key, a.Snapshot.ID, a.Scope, a.Version)
	}
	for _, e := range a.Entries {
		if e.SHA256 != "" && (len(e.SHA256) != 64 || !isHex(e.SHA256)) {
			return nil, fmt.Errorf("%w: archive %s: %s has no valid sha256", ErrDamaged, key, e.Path)
		}
	}
	return &a, nil
}

// Fetched counts what one restore from the archive read from the store.
type Fetched struct {
	Blobs   int   `json:"blobs"`   // contents downloaded
	Bytes   int64 `json:"bytes"`   // their bytes
	Present int   `json:"present"` // contents the volume still had
}

// RestoreArchive rebuilds ws's scope from archived snapshot id ("" for the
// newest archived), from the store alone: the contents the volume lacks
// are downloaded and checked, the snapshot is recorded on the volume, and
// snapshot.Restore swaps the scope's tree for it (modes, times and
// emulated links as they were; opt as for snapshot.Restore). Nothing in
// the scope changes unless every content arrived whole.
func (s *Store) RestoreArchive(ctx context.Context, ws *store.Workspace, id string, opt snapshot.RestoreOptions) (*snapshot.Manifest, Fetched, error) {
	var got Fetched
	sc := ws.Scope()
	// Refuse at once, before downloading, what Restore would refuse.
	if err := ws.CheckIdle(); err != nil {
		return nil, got, err
	}
	if id == "" {
		ids, err := s.Archived(ctx, sc)
		if err != nil {
			return nil, got, err
		}
		if len(ids) == 0 {
			return nil, got, policy.Errorf(policy.NotFound, "scope %s has no archived snapshot", sc)
		}
		id = ids[len(ids)-1]
	}
	a, err := s.archive(ctx, sc, id)
	if err != nil {
		return nil, got, err
	}
	repo, err := snapshot.OpenRepo(ws.Volume(), sc, true)
	if err != nil {
		return nil, got, err
	}
	defer repo.Close()
	var (
		todo []snapshot.Entry
		seen = map[string]bool{}
	)
	for _, e := range a.Entries {
		if e.SHA256 == "" || seen[e.SHA256] {
			continue
		}
		seen[e.SHA256] = true
		if repo.HasBlob(e.SHA256) {
			got.Present++
			continue
		}
		todo = append(todo, e)
	}
	var mu sync.Mutex
	err = each(ctx, todo, func(ctx context.Context, e snapshot.Entry) error {
		if err := s.fetchBlob(ctx, repo, e); err != nil {
			return err
		}
		mu.Lock()
		got.Blobs++
		got.Bytes += e.Size
		mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, got, err
	}
	if _, err := repo.Import(a.Snapshot, a.Entries); err != nil {
		if errors.Is(err, snapshot.ErrBadEntry) {
			err = fmt.Errorf("%w: archive %s: %v", ErrDamaged, s.archiveKey(sc, id), err)
		}
		return nil, got, err
	}
	m, err := snapshot.Restore(ctx, ws, id, opt)
	return m, got, err
}

// fetchBlob downloads e's content into repo, checked against its sha256.
func (s *Store) fetchBlob(ctx context.Context, repo *snapshot.Repo, e snapshot.Entry) error {
	bucket, _ := s.bucket()
	key := s.blobKey(e.SHA256)
	out, err := s.s3.GetObject(ctx, &s3.GetObjectInput{Bucket: &bucket, Key: &key})
	if isNotFound(err) {
		return fmt.Errorf("%w: %s: its content %s is missing", ErrDamaged, e.Path, key)
	}
	if err != nil {
		return storeErr("read "+e.Path, err)
	}
	defer out.Body.Close()
	if err := repo.AddBlob(e.Path, e.SHA256, e.Size, out.Body); err != nil {
		if errors.Is(err, snapshot.ErrBadEntry) {
			return fmt.Errorf("%w: %s: its content %s: %v", ErrDamaged, e.Path, key, err)
		}
		return storeErr("read "+e.Path, err)
	}
	return nil
}

// VerifyArchive checks that snapshot id of sc is archived and that every
// content it names is in the store with its size (retention.Archives:
// gc reclaims nothing archive_before_reclaim protects unless this
// passes). A snapshot never archived is not_found; a missing or short
// content is ErrDamaged, naming it.
func (s *Store) VerifyArchive(ctx context.Context, sc store.Scope, id string) error {
	a, err := s.archive(ctx, sc, id)
	if err != nil {
		return err
	}
	bucket, _ := s.bucket()
	var (
		todo []snapshot.Entry
		seen = map[string]bool{}
	)
	for _, e := range a.Entries {
		if e.SHA256 != "" && !seen[e.SHA256] {
			seen[e.SHA256] = true
			todo = append(todo, e)
		}
	}
	return each(ctx, todo, func(ctx context.Context, e snapshot.Entry) error {
		key := s.blobKey(e.SHA256)
		head, err := s.s3.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &bucket, Key: &key})
		if isNotFound(err) {
			return fmt.Errorf("%w: %s: its content %s is missing", ErrDamaged, e.Path, key)
		}
		if err != nil {
			return storeErr("look up "+e.Path, err)
		}
		if n := aws.ToInt64(head.ContentLength); n != e.Size {
			return fmt.Errorf("%w: %s: its content %s has %d bytes, not %d", ErrDamaged, e.Path, key, n, e.Size)
		}
		return nil
	})
}
