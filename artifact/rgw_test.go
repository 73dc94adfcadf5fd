package artifact_test

import (
	"bytes"
	"context"
	"crypto/md5"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/agentloom/loomfs/artifact"
	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/snapshot"
	"github.com/agentloom/loomfs/store"
)

// These tests run against a real S3 service: scripts/rgw brings up a Ceph
// RGW and "scripts/rgw env" prints the variables they read.

// rawClient is a plain S3 client on the test service, for what the tests
// do behind the store's back (damage an object, try to delete an anchor).
func rawClient(t *testing.T) *s3.Client {
	t.Helper()
	ac, err := config.LoadDefaultConfig(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if ac.Region == "" {
		ac.Region = "us-east-1"
	}
	return s3.NewFromConfig(ac, func(o *s3.Options) {
		o.BaseEndpoint = aws.String(os.Getenv("LOOMFS_S3_ENDPOINT"))
		o.UsePathStyle = true
		o.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
		o.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
	})
}

// openStore opens the test service's store under a prefix of this test's
// own, and removes what it wrote to the plain bucket when the test ends
// (anchors under Object Lock stay until their retention ends).
func openStore(t *testing.T) (*artifact.Store, *s3.Client) {
	t.Helper()
	if os.Getenv("LOOMFS_S3_ENDPOINT") == "" {
		t.Skip("LOOMFS_S3_ENDPOINT is not set: start an S3 service (scripts/rgw up) and export what scripts/rgw env prints")
	}
	cfg, err := artifact.ConfigFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Bucket == "" || cfg.AnchorBucket == "" {
		t.Fatal("AGENT_LOOM_S3_BUCKET and AGENT_LOOM_S3_ANCHOR_BUCKET must be set with LOOMFS_S3_ENDPOINT")
	}
	cfg.Endpoint = os.Getenv("LOOMFS_S3_ENDPOINT")
	cfg.Prefix = fmt.Sprintf("test/%s-%s/", strings.ReplaceAll(t.Name(), "/", "_"), randHex(4))
	st, err := artifact.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	raw := rawClient(t)
	t.Cleanup(func() {
		ctx := context.Background()
		p := s3.NewListObjectsV2Paginator(raw, &s3.ListObjectsV2Input{Bucket: &cfg.Bucket, Prefix: &cfg.Prefix})
		for p.HasMorePages() {
			page, err := p.NextPage(ctx)
			if err != nil {
				t.Errorf("clean up %s: %v", cfg.Prefix, err)
				return
			}
			for _, o := range page.Contents {
				if _, err := raw.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &cfg.Bucket, Key: o.Key}); err != nil {
					t.Errorf("clean up %s: %v", aws.ToString(o.Key), err)
				}
			}
		}
	})
	return st, raw
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// finished is a run on a fresh volume, its files written and its scopes
// snapshotted as "loomfs runs finish" does.
type finished struct {
	run   *store.Run
	snaps []*snapshot.Manifest
}

// finishRun creates run id of user on the volume at root, writes files
// (a path under subagents/<instance>/ goes to that child instance), and
// snapshots the main scope and each child.
func finishRun(t *testing.T, root, id, user string, files map[string][]byte) finished {
	t.Helper()
	ctx := context.Background()
	cfg := store.Config{Root: root}
	if _, err := store.CreateRun(ctx, cfg, store.RunSpec{Space: "sp", Agent: "ag", Session: "se", Run: id, User: user}); err != nil {
		t.Fatal(err)
	}
	r, err := store.ResumeRun(ctx, cfg, id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	byScope := map[string]map[string][]byte{}
	for p, b := range files {
		inst, rel := "", p
		if rest, ok := strings.CutPrefix(p, policy.SubagentsDir+"/"); ok {
			inst, rel, _ = strings.Cut(rest, "/")
		}
		if byScope[inst] == nil {
			byScope[inst] = map[string][]byte{}
		}
		byScope[inst][rel] = b
	}
	if byScope[""] == nil {
		byScope[""] = map[string][]byte{}
	}
	var out finished
	out.run = r
	for inst, fs := range byScope {
		var ws *store.Workspace
		if inst == "" {
			ws, err = r.Main(ctx, nil)
		} else {
			ws, err = r.Instance(ctx, inst, nil)
		}
		if err != nil {
			t.Fatal(err)
		}
		// Straight onto the volume, as a command in the sandbox writes
		// (the tools' door caps a file at 2 MiB).
		for rel, b := range fs {
			p := filepath.Join(root, ws.Scope().Dir(), rel)
			if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		m, err := snapshot.Create(ctx, ws, snapshot.Options{Run: id, Label: "end of run " + id})
		ws.Close()
		if err != nil {
			t.Fatal(err)
		}
		out.snaps = append(out.snaps, m)
	}
	return out
}

func TestPublishedRun(t *testing.T) {
	st, _ := openStore(t)
	ctx := context.Background()
	big := bytes.Repeat([]byte("0123456789abcdef"), (3<<20)/16) // 3 MiB
	files := map[string][]byte{
		"output/report.md":              []byte("# report\n"),
		"output/data/result.json":       []byte(`{"ok":true}`),
		"output/big.bin":                big,
		"notes.txt":                     []byte("not an output"),
		"subagents/c1/output/child.txt": []byte("from the child"),
		"subagents/c1/scratch.txt":      []byte("not an output of the child"),
	}
	fr := finishRun(t, t.TempDir(), "r1", "alice", files)
	m, sent, err := st.Publish(ctx, fr.run, fr.snaps, artifact.PublishOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"output/big.bin", "output/data/result.json", "output/report.md", "subagents/c1/output/child.txt"}
	var got []string
	for _, f := range m.Files {
		got = append(got, f.Path)
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("published %v, want %v", got, want)
	}
	if !sent.Manifest || sent.Blobs != 4 || sent.Bytes != m.Bytes {
		t.Fatalf("sent %+v for %d bytes, want 4 blobs, the manifest and every byte", sent, m.Bytes)
	}

	// The workspace changes after publishing: the published copy doesn't.
	ws, err := fr.run.Main(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ws.WriteFile(ctx, "output/report.md", []byte("# changed later\n"), nil); err != nil {
		t.Fatal(err)
	}
	ws.Close()

	cases := []struct {
		name, user, path string
		want             []byte
		code             policy.Code
	}{
		{"the owner reads a file as it was", "alice", "output/report.md", files["output/report.md"], ""},
		{"a child's file under subagents", "alice", "subagents/c1/output/child.txt", files["subagents/c1/output/child.txt"], ""},
		{"another user is refused", "bob", "output/report.md", nil, policy.PermissionDenied},
		{"no user is refused", "", "output/report.md", nil, policy.PermissionDenied},
		{"a file not published", "alice", "notes.txt", nil, policy.NotFound},
		{"over 2 MiB is too large for the API", "alice", "output/big.bin", nil, policy.TooLarge},
		{"a path escaping", "alice", "../r2/output/x", nil, policy.InvalidPath},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, b, err := st.Get(ctx, "r1", c.user, c.path)
			if c.code != "" {
				if policy.CodeOf(err) != c.code {
					t.Fatalf("Get(%s, %s) = %v, want %s", c.user, c.path, err, c.code)
				}
				return
			}
			if err != nil || !bytes.Equal(b, c.want) {
				t.Fatalf("Get(%s, %s) = %q, %v; want %q", c.user, c.path, b, err, c.want)
			}
		})
	}
	var buf bytes.Buffer
	if _, err := st.Download(ctx, "r1", "alice", "output/big.bin", &buf); err != nil || !bytes.Equal(buf.Bytes(), big) {
		t.Fatalf("Download of 3 MiB: %d bytes, %v", buf.Len(), err)
	}
	if _, err := st.List(ctx, "r1", "bob"); policy.CodeOf(err) != policy.PermissionDenied {
		t.Fatalf("List by another user: %v, want permission_denied", err)
	}
	if _, err := st.List(ctx, "r9", "alice"); policy.CodeOf(err) != policy.NotFound {
		t.Fatalf("List of a run never published: %v, want not_found", err)
	}

	// Publishing again (a retry) sends nothing; other files are refused.
	_, again, err := st.Publish(ctx, fr.run, fr.snaps, artifact.PublishOptions{})
	if err != nil || again.Manifest || again.Blobs != 0 {
		t.Fatalf("second publish: %+v, %v; want nothing sent", again, err)
	}
	_, _, err = st.Publish(ctx, fr.run, fr.snaps, artifact.PublishOptions{Paths: []string{"."}})
	if policy.CodeOf(err) != policy.Exists {
		t.Fatalf("publish with other files: %v, want exists", err)
	}
}

func TestPublishSendsOnlyNewContent(t *testing.T) {
	st, _ := openStore(t)
	ctx := context.Background()
	files := map[string][]byte{}
	for i := range 20 {
		files[fmt.Sprintf("output/f%02d", i)] = fmt.Appendf(nil, "file %d", i)
	}
	root := t.TempDir()
	a := finishRun(t, root, "ra", "alice", files)
	if _, sent, err := st.Publish(ctx, a.run, a.snaps, artifact.PublishOptions{}); err != nil || sent.Blobs != 20 {
		t.Fatalf("first run: %+v, %v", sent, err)
	}
	for i := range 3 {
		files[fmt.Sprintf("output/f%02d", i)] = fmt.Appendf(nil, "changed %d", i)
	}
	b := finishRun(t, t.TempDir(), "rb", "alice", files)
	_, sent, err := st.Publish(ctx, b.run, b.snaps, artifact.PublishOptions{})
	if err != nil || sent.Blobs != 3 || sent.Present != 17 {
		t.Fatalf("second run: %+v, %v; want 3 sent, 17 present", sent, err)
	}
}

func TestDamagedCopyRefused(t *testing.T) {
	cases := []struct {
		name   string
		damage func(ctx context.Context, raw *s3.Client, bucket, key string) error
	}{
		{"altered", func(ctx context.Context, raw *s3.Client, bucket, key string) error {
			_, err := raw.PutObject(ctx, &s3.PutObjectInput{Bucket: &bucket, Key: &key, Body: strings.NewReader("hello worle\n")})
			return err
		}},
		{"truncated", func(ctx context.Context, raw *s3.Client, bucket, key string) error {
			_, err := raw.PutObject(ctx, &s3.PutObjectInput{Bucket: &bucket, Key: &key, Body: strings.NewReader("hello")})
			return err
		}},
		{"missing", func(ctx context.Context, raw *s3.Client, bucket, key string) error {
			_, err := raw.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &bucket, Key: &key})
			return err
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st, raw := openStore(t)
			ctx := context.Background()
			fr := finishRun(t, t.TempDir(), "r1", "alice", map[string][]byte{"output/a.txt": []byte("hello world\n"), "output/b.txt": []byte("fine")})
			m, _, err := st.Publish(ctx, fr.run, fr.snaps, artifact.PublishOptions{})
			if err != nil {
				t.Fatal(err)
			}
			sha := m.Files[0].SHA256
			key := st.Config().Prefix + "blobs/" + sha[:2] + "/" + sha
			if err := c.damage(ctx, raw, st.Config().Bucket, key); err != nil {
				t.Fatal(err)
			}
			_, _, err = st.Get(ctx, "r1", "alice", "output/a.txt")
			if !errors.Is(err, artifact.ErrDamaged) || !strings.Contains(err.Error(), key) || !strings.Contains(err.Error(), "output/a.txt") {
				t.Fatalf("Get of a damaged copy: %v; want ErrDamaged naming output/a.txt and %s", err, key)
			}
			if _, _, err := st.Get(ctx, "r1", "alice", "output/b.txt"); err != nil {
				t.Fatalf("Get of an intact file beside it: %v", err)
			}
			_, err = st.Verify(ctx, "r1", true)
			if !errors.Is(err, artifact.ErrDamaged) || !strings.Contains(err.Error(), key) {
				t.Fatalf("Verify: %v; want ErrDamaged naming %s", err, key)
			}
		})
	}
}

// TestRevokedCredentialsLeaveNoManifest: an upload refused midway (here by
// credentials the service doesn't accept) writes no manifest, never shows
// the secret, and the next try with good credentials publishes.
func TestRevokedCredentialsLeaveNoManifest(t *testing.T) {
	st, _ := openStore(t)
	ctx := context.Background()
	fr := finishRun(t, t.TempDir(), "r1", "alice", map[string][]byte{"output/a.txt": []byte("a"), "output/b.txt": []byte("b")})
	secret := "Revoked" + randHex(16)
	t.Setenv("AWS_SECRET_ACCESS_KEY", secret)
	bad, err := artifact.Open(ctx, st.Config())
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = bad.Publish(ctx, fr.run, fr.snaps, artifact.PublishOptions{})
	if err == nil || strings.Contains(err.Error(), secret) {
		t.Fatalf("publish with a wrong secret: %v", err)
	}
	if _, err := st.Manifest(ctx, "r1"); policy.CodeOf(err) != policy.NotFound {
		t.Fatalf("manifest after a refused upload: %v, want not_found", err)
	}
	if _, sent, err := st.Publish(ctx, fr.run, fr.snaps, artifact.PublishOptions{}); err != nil || !sent.Manifest {
		t.Fatalf("retry: %+v, %v", sent, err)
	}
}

func TestAnchorWriteOnce(t *testing.T) {
	st, raw := openStore(t)
	ctx := context.Background()
	a := audit.Anchor{Time: time.Now().UTC().Truncate(time.Second), Heads: []audit.Head{{Node: "n1", LedgerSeq: 3, LedgerHead: strings.Repeat("a", 64), ChainSeq: 9, ChainHead: strings.Repeat("b", 64)}}}
	key, err := st.PutAnchor(ctx, a, 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	got, err := st.Anchors(ctx, 0)
	if err != nil || len(got) != 1 || got[0].Key != key || got[0].Anchor.Heads[0] != a.Heads[0] {
		t.Fatalf("Anchors = %+v, %v; want the one written", got, err)
	}
	bucket := st.Config().AnchorBucket
	// Not even the bucket's owner removes the locked version.
	_, err = raw.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &bucket, Key: &key, VersionId: &got[0].VersionID})
	if err == nil || !strings.Contains(err.Error(), "AccessDenied") {
		t.Fatalf("deleting a locked anchor version: %v, want AccessDenied", err)
	}
	// A replacement and a delete marker hide nothing: the original
	// version is still read.
	forged := `{"anchored_at":"2026-01-01T00:00:00Z","heads":[]}` + "\n"
	if _, err := raw.PutObject(ctx, &s3.PutObjectInput{Bucket: &bucket, Key: &key, Body: strings.NewReader(forged),
		ContentMD5: aws.String(md5b64(forged)), ObjectLockMode: "COMPLIANCE", ObjectLockRetainUntilDate: aws.Time(time.Now().Add(time.Minute))}); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &bucket, Key: &key}); err != nil {
		t.Fatal(err)
	}
	got, err = st.Anchors(ctx, 0)
	if err != nil || len(got) != 2 {
		t.Fatalf("Anchors after a replace and a delete = %+v, %v; want both versions", got, err)
	}
	found := false
	for _, v := range got {
		found = found || (len(v.Anchor.Heads) == 1 && v.Anchor.Heads[0] == a.Heads[0])
	}
	if !found {
		t.Fatalf("the original anchor is gone: %+v", got)
	}
}

func md5b64(s string) string {
	h := md5.Sum([]byte(s))
	return base64.StdEncoding.EncodeToString(h[:])
}
