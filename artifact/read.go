package artifact

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// ErrDamaged is wrapped by every error that finds the store's copy (a
// published run, an archived snapshot) not matching its manifest: a
// missing, truncated or altered object, or a manifest that was edited; the
// message names the object.
var ErrDamaged = errors.New("the store's copy does not match its manifest")

// maxManifestBytes bounds a manifest read (store.MaxArtifacts files with
// long names fit many times over).
const maxManifestBytes = 64 << 20

// Manifest reads run's manifest as stored, with no owner check: for the
// operator and for Publish. A run never published is not_found.
func (s *Store) Manifest(ctx context.Context, run string) (*Manifest, error) {
	if err := store.ValidateID("run", run); err != nil {
		return nil, err
	}
	bucket, err := s.bucket()
	if err != nil {
		return nil, err
	}
	key := s.manifestKey(run)
	out, err := s.s3.GetObject(ctx, &s3.GetObjectInput{Bucket: &bucket, Key: &key})
	if isNotFound(err) {
		return nil, policy.Errorf(policy.NotFound, "run %s has not been published", run)
	}
	if err != nil {
		return nil, storeErr("read the manifest of run "+run, err)
	}
	defer out.Body.Close()
	body, err := io.ReadAll(io.LimitReader(out.Body, maxManifestBytes+1))
	if err != nil {
		return nil, storeErr("read the manifest of run "+run, err)
	}
	var m Manifest
	if len(body) > maxManifestBytes {
		return nil, fmt.Errorf("%w: manifest of run %s is over %d bytes", ErrDamaged, run, maxManifestBytes)
	}
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, fmt.Errorf("%w: manifest of run %s: %v", ErrDamaged, run, err)
	}
	if m.Run != run || m.Version != manifestVersion {
		return nil, fmt.Errorf("%w: manifest of run %s names run %q, version %d", ErrDamaged, run, m.Run, m.Version)
	}
	for _, f := range m.Files {
		if len(f.SHA256) != 64 || !isHex(f.SHA256) {
			return nil, fmt.Errorf("%w: manifest of run %s: %s has no valid sha256", ErrDamaged, run, f.Path)
		}
	}
	return &m, nil
}

// List returns run's published manifest for user, who must be the user
// who started the run (the same rule as the live artifact listing).
func (s *Store) List(ctx context.Context, run, user string) (*Manifest, error) {
	m, err := s.Manifest(ctx, run)
	if err != nil {
		return nil, err
	}
	if err := store.CheckArtifactUser(run, m.User, user); err != nil {
		return nil, err
	}
	return m, nil
}

// Get returns the published file at path for user, whole, checked against
// its sha256; a file over store.MaxArtifactBytes is refused (too_large), as
// the live artifacts are.
func (s *Store) Get(ctx context.Context, run, user, path string) (*File, []byte, error) {
	var b bytes.Buffer
	f, err := s.download(ctx, run, user, path, store.MaxArtifactBytes, &b)
	if err != nil {
		return nil, nil, err
	}
	return f, b.Bytes(), nil
}

// Download writes the published file at path to w, whatever its size, for
// a command that streams it (an operator's copy). The content is checked
// as it goes: on a mismatch w has had bytes that the error disowns.
func (s *Store) Download(ctx context.Context, run, user, path string, w io.Writer) (*File, error) {
	return s.download(ctx, run, user, path, -1, w)
}

func (s *Store) download(ctx context.Context, run, user, path string, max int64, w io.Writer) (*File, error) {
	m, err := s.List(ctx, run, user)
	if err != nil {
		return nil, err
	}
	rel, err := policy.CleanPath(path, false)
	if err != nil {
		return nil, err
	}
	var f *File
	for i := range m.Files {
		if m.Files[i].Path == rel {
			f = &m.Files[i]
		}
	}
	if f == nil {
		return nil, policy.Errorf(policy.NotFound, "%s: no such file in run %s as published", rel, run)
	}
	if max >= 0 && f.Size > max {
		return nil, policy.Errorf(policy.TooLarge, "%s is %d bytes; the download limit is %d bytes (%s)", rel, f.Size, max, policy.Bytes(max))
	}
	bucket, _ := s.bucket()
	key := s.blobKey(f.SHA256)
	out, err := s.s3.GetObject(ctx, &s3.GetObjectInput{Bucket: &bucket, Key: &key})
	if isNotFound(err) {
		return nil, fmt.Errorf("%w: %s: its content %s is missing", ErrDamaged, rel, key)
	}
	if err != nil {
		return nil, storeErr("read "+rel, err)
	}
	defer out.Body.Close()
	h := sha256.New()
	// One byte past the size tells a longer object from the right one.
	n, err := io.Copy(io.MultiWriter(w, h), io.LimitReader(out.Body, f.Size+1))
	if err != nil {
		return nil, storeErr("read "+rel, err)
	}
	if err := check(rel, key, f, n, h); err != nil {
		return nil, err
	}
	return f, nil
}

func check(rel, key string, f *File, n int64, h hash.Hash) error {
	if n != f.Size {
		return fmt.Errorf("%w: %s: its content %s has %d bytes, not %d", ErrDamaged, rel, key, n, f.Size)
	}
	if sum := hex.EncodeToString(h.Sum(nil)); sum != f.SHA256 {
		return fmt.Errorf("%w: %s: its content %s has sha256 %s", ErrDamaged, rel, key, sum)
	}
	return nil
}

// Verify checks that every content run's manifest names is in the store
// with its size; with full, it reads each and checks its sha256 too. The
// first object that fails is named.
func (s *Store) Verify(ctx context.Context, run string, full bool) (*Manifest, error) {
	m, err := s.Manifest(ctx, run)
	if err != nil {
		return nil, err
	}
	bucket, _ := s.bucket()
	for i := range m.Files {
		f := &m.Files[i]
		key := s.blobKey(f.SHA256)
		if !full {
			head, err := s.s3.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &bucket, Key: &key})
			if isNotFound(err) {
				return m, fmt.Errorf("%w: %s: its content %s is missing", ErrDamaged, f.Path, key)
			}
			if err != nil {
				return m, storeErr("look up "+f.Path, err)
			}
			if n := aws.ToInt64(head.ContentLength); n != f.Size {
				return m, fmt.Errorf("%w: %s: its content %s has %d bytes, not %d", ErrDamaged, f.Path, key, n, f.Size)
			}
			continue
		}
		if _, err := s.download(ctx, run, m.User, f.Path, -1, io.Discard); err != nil {
			return m, err
		}
	}
	return m, nil
}

func isHex(s string) bool {
	_, err := hex.DecodeString(s)
	return err == nil
}
