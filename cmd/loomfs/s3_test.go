package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/agentloom/loomfs/artifact"
	"github.com/agentloom/loomfs/store"
)

// These tests run the commands against a real S3 service: scripts/rgw
// brings up a Ceph RGW and "scripts/rgw env" prints the variables.

// s3Test gives the test a key prefix of its own in the store's buckets
// (AGENT_LOOM_S3_PREFIX) and removes what it wrote to the plain bucket
// when it ends; it returns the prefix and a plain client.
func s3Test(t *testing.T) (string, *s3.Client) {
	t.Helper()
	endpoint := os.Getenv("LOOMFS_S3_ENDPOINT")
	if endpoint == "" {
		t.Skip("LOOMFS_S3_ENDPOINT is not set: start an S3 service (scripts/rgw up) and export what scripts/rgw env prints")
	}
	b := make([]byte, 4)
	rand.Read(b)
	prefix := "test/" + strings.ReplaceAll(t.Name(), "/", "_") + "-" + hex.EncodeToString(b) + "/"
	t.Setenv("AGENT_LOOM_S3_PREFIX", prefix)
	ac, err := config.LoadDefaultConfig(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if ac.Region == "" {
		ac.Region = "us-east-1"
	}
	raw := s3.NewFromConfig(ac, func(o *s3.Options) {
		o.BaseEndpoint = aws.String(endpoint)
		o.UsePathStyle = true
		o.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
		o.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
	})
	bucket := os.Getenv("AGENT_LOOM_S3_BUCKET")
	t.Cleanup(func() {
		ctx := context.Background()
		p := s3.NewListObjectsV2Paginator(raw, &s3.ListObjectsV2Input{Bucket: &bucket, Prefix: &prefix})
		for p.HasMorePages() {
			page, err := p.NextPage(ctx)
			if err != nil {
				t.Errorf("clean up %s: %v", prefix, err)
				return
			}
			for _, o := range page.Contents {
				raw.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &bucket, Key: o.Key})
			}
		}
	})
	return prefix, raw
}

// TestPublishedRunCommands: runs finish --publish copies a run's outputs
// (main's and a child's) to the store; artifacts --published serves them to
// the run's owner as they were, whatever main holds later, the API door's
// 2 MiB rule aside (the CLI streams); a damaged copy is refused by name.
func TestPublishedRunCommands(t *testing.T) {
	prefix, raw := s3Test(t)
	root := filepath.Join(t.TempDir(), "root")
	g := []string{"--root", root}
	loomfs := func(args ...string) (string, string, int) {
		t.Helper()
		return runLoomfs(t, append(g, args...)...)
	}
	if out, errOut, code := loomfs("runs", "create", "--scope", "acme/coder/s1", "--run", "r1", "--user", "alice"); code != exitOK {
		t.Fatalf("runs create: exit %d: %s %s", code, out, errOut)
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), (3<<20)/16) // 3 MiB
	files := map[string][]byte{
		"output/report.md":         []byte("# report\n"),
		"output/big.bin":           big,
		"notes.txt":                []byte("not an output"),
		"r1/sub-1/output/child.md": []byte("from the child"),
	}
	for rel, b := range files {
		dir := store.Scope{Space: "acme", Agent: "coder", Session: "s1"}.Dir()
		if inst, rest, ok := strings.Cut(rel, "/sub-1/"); ok && inst == "r1" {
			dir, rel = store.Scope{Space: "acme", Agent: "coder", Session: "s1", Run: "r1", Instance: "sub-1"}.Dir(), rest
		}
		p := filepath.Join(root, dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	steps := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"--publish-path needs --publish", []string{"runs", "finish", "--run", "r1", "--publish-path", "dist"}, exitUsage, "needs --publish"},
		{"an escaping --publish-path", []string{"runs", "finish", "--run", "r1", "--publish", "--publish-path", "../x"}, exitUsage, "--publish-path"},
		{"finish and publish", []string{"--json", "runs", "finish", "--run", "r1", "--instance", "sub-1", "--publish"}, exitOK, `"files": 3`},
		{"a retry publishes nothing new", []string{"--json", "runs", "finish", "--run", "r1", "--instance", "sub-1", "--publish"}, exitOK, `"manifest": false`},
		{"the owner lists the published run", []string{"artifacts", "list", "--published", "--run", "r1", "--user", "alice"}, exitOK, "subagents/sub-1/output/child.md"},
		{"another user is refused", []string{"artifacts", "list", "--published", "--run", "r1", "--user", "bob"}, exitRefused, "permission_denied"},
		{"a run never published", []string{"artifacts", "list", "--published", "--run", "r9", "--user", "alice"}, exitRefused, "not_found"},
		{"a file not published", []string{"artifacts", "get", "--published", "--run", "r1", "--user", "alice", "notes.txt"}, exitRefused, "not_found"},
	}
	for _, s := range steps {
		out, errOut, code := loomfs(s.args...)
		if code != s.code || !strings.Contains(out+errOut, s.want) {
			t.Fatalf("%s: exit %d, stdout %q, stderr %q; want exit %d with %q", s.name, code, out, errOut, s.code, s.want)
		}
	}

	// Main changes after the run: the published copy doesn't.
	in, _ := json.Marshal(map[string]string{"path": "output/report.md", "content": "# changed later\n"})
	if out, errOut, code := loomfs("tool", "workspace_write", "--scope", "acme/coder/s1", "--input", string(in)); code != exitOK {
		t.Fatalf("write: exit %d: %s %s", code, out, errOut)
	}
	out, errOut, code := loomfs("artifacts", "get", "--published", "--run", "r1", "--user", "alice", "output/report.md")
	if code != exitOK || out != "# report\n" {
		t.Fatalf("get --published of a changed file: exit %d, %q %s", code, out, errOut)
	}
	// The CLI streams a file over the API's 2 MiB.
	dst := filepath.Join(t.TempDir(), "big.bin")
	if out, errOut, code := loomfs("artifacts", "get", "--published", "--run", "r1", "--user", "alice", "output/big.bin", "--output", dst); code != exitOK {
		t.Fatalf("get --published of 3 MiB: exit %d: %s %s", code, out, errOut)
	}
	if b, err := os.ReadFile(dst); err != nil || !bytes.Equal(b, big) {
		t.Fatalf("the 3 MiB file downloaded: %d bytes, %v", len(b), err)
	}
	// Every published listing and download is in the run's audit.
	out, _, _ = loomfs("audit", "query", "--scope", "acme/coder/s1")
	for _, op := range []string{"run_publish", "artifact_list", "artifact_get"} {
		if !strings.Contains(out, op) {
			t.Errorf("audit of the run: no %s in %s", op, out)
		}
	}

	// A truncated copy is refused naming the file and its object, and
	// --output is not left behind.
	m, err := (func() (*artifact.Manifest, error) {
		st, err := openArtifactStore(context.Background())
		if err != nil {
			return nil, err
		}
		return st.Manifest(context.Background(), "r1")
	})()
	if err != nil {
		t.Fatal(err)
	}
	var sha string
	for _, f := range m.Files {
		if f.Path == "output/big.bin" {
			sha = f.SHA256
		}
	}
	bucket := os.Getenv("AGENT_LOOM_S3_BUCKET")
	key := prefix + "blobs/" + sha[:2] + "/" + sha
	if _, err := raw.PutObject(context.Background(), &s3.PutObjectInput{Bucket: &bucket, Key: &key, Body: bytes.NewReader(big[:1<<20])}); err != nil {
		t.Fatal(err)
	}
	dst2 := filepath.Join(t.TempDir(), "big.bin")
	out, errOut, code = loomfs("artifacts", "get", "--published", "--run", "r1", "--user", "alice", "output/big.bin", "--output", dst2)
	if code != exitRefused || !strings.Contains(errOut, key) || !strings.Contains(errOut, "output/big.bin") {
		t.Fatalf("get --published of a truncated copy: exit %d, %q %q; want refused naming output/big.bin and %s", code, out, errOut, key)
	}
	if _, err := os.Stat(dst2); !os.IsNotExist(err) {
		t.Fatalf("--output left after a refused download: %v", err)
	}
}

// TestAuditAnchorS3: audit anchor --to s3:// writes a locked anchor that
// audit verify --anchor s3:// reads back; a log that no longer extends it
// fails verify.
func TestAuditAnchorS3(t *testing.T) {
	s3Test(t)
	root := auditRoot(t)
	url := "s3://" + os.Getenv("AGENT_LOOM_S3_ANCHOR_BUCKET") + "/" + strings.TrimSuffix(os.Getenv("AGENT_LOOM_S3_PREFIX"), "/")
	steps := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"s3 needs a retention", []string{"audit", "anchor", "--to", url}, exitUsage, "--retain"},
		{"a malformed retention", []string{"audit", "anchor", "--to", url, "--retain", "soon"}, exitUsage, "--retain"},
		{"a retention without s3", []string{"audit", "anchor", "--to", filepath.Join(t.TempDir(), "a.jsonl"), "--retain", "1d"}, exitUsage, "--retain"},
		{"a malformed bucket", []string{"audit", "anchor", "--to", "s3://No_Such/x", "--retain", "2m"}, exitUsage, "bucket"},
		{"verify with no anchor yet", []string{"audit", "verify", "--anchor", url}, exitRefused, "no anchor"},
		{"anchor", []string{"audit", "anchor", "--to", url, "--retain", "2m"}, exitOK, `"heads"`},
		{"verify against it", []string{"audit", "verify", "--anchor", url}, exitOK, "anchored: the log extends all 1 anchored heads"},
	}
	for _, s := range steps {
		out, errOut, code := runLoomfs(t, append([]string{"--root", root}, s.args...)...)
		if code != s.code || !strings.Contains(out+errOut, s.want) {
			t.Fatalf("%s: exit %d, stdout %q, stderr %q; want exit %d with %q", s.name, code, out, errOut, s.code, s.want)
		}
	}
	// Another volume's log (a replaced audit directory) does not extend it.
	other := auditRoot(t)
	out, errOut, code := runLoomfs(t, "--root", other, "audit", "verify", "--anchor", url)
	if code != exitRefused || !strings.Contains(out, "BROKEN") {
		t.Fatalf("verify of a replaced log against the anchor: exit %d, %q %q", code, out, errOut)
	}
}

// TestSnapshotArchiveCommands: snapshot archive sends what the store
// lacks, and snapshot restore --from-archive rebuilds the scope on a fresh
// volume from the store alone.
func TestSnapshotArchiveCommands(t *testing.T) {
	s3Test(t)
	root, fresh := filepath.Join(t.TempDir(), "root"), filepath.Join(t.TempDir(), "fresh")
	on := func(root string, args ...string) (string, string, int) {
		t.Helper()
		return runLoomfs(t, append([]string{"--root", root}, args...)...)
	}
	write := func(path, content string) {
		t.Helper()
		in, _ := json.Marshal(map[string]string{"path": path, "content": content})
		if out, errOut, code := on(root, "tool", "workspace_write", "--scope", "acme/coder/s1", "--input", string(in)); code != exitOK {
			t.Fatalf("write %s: exit %d: %s %s", path, code, out, errOut)
		}
	}
	for i := range 5 {
		write(fmt.Sprintf("src/f%d.txt", i), fmt.Sprintf("file %d\n", i))
	}
	steps := []struct {
		name string
		root string
		args []string
		code int
		want string
	}{
		{"restore needs an id or --from-archive", root, []string{"snapshot", "restore", "--scope", "acme/coder/s1"}, exitUsage, "--from-archive"},
		{"nothing archived yet", fresh, []string{"snapshot", "restore", "--scope", "acme/coder/s1", "--from-archive"}, exitRefused, "no archived snapshot"},
		{"no snapshot to archive", root, []string{"snapshot", "archive", "--scope", "acme/coder/s1"}, exitRefused, "no snapshots"},
		{"snapshot", root, []string{"snapshot", "create", "--scope", "acme/coder/s1"}, exitOK, "5 files"},
		{"archive", root, []string{"snapshot", "archive", "--scope", "acme/coder/s1"}, exitOK, "sent 5 contents"},
		{"archive again", root, []string{"snapshot", "archive", "--scope", "acme/coder/s1"}, exitOK, "archived already"},
	}
	for _, s := range steps {
		out, errOut, code := on(s.root, s.args...)
		if code != s.code || !strings.Contains(out+errOut, s.want) {
			t.Fatalf("%s: exit %d, stdout %q, stderr %q; want exit %d with %q", s.name, code, out, errOut, s.code, s.want)
		}
	}
	write("src/f1.txt", "changed\n")
	if out, errOut, code := on(root, "snapshot", "create", "--scope", "acme/coder/s1"); code != exitOK {
		t.Fatalf("second snapshot: exit %d: %s %s", code, out, errOut)
	}
	out, errOut, code := on(root, "--json", "snapshot", "archive", "--scope", "acme/coder/s1")
	var a archived
	if err := json.Unmarshal([]byte(out), &a); err != nil || code != exitOK || a.Sent.Blobs != 1 || a.Sent.Present != 4 {
		t.Fatalf("second archive: exit %d, %q %q (%v); want 1 sent, 4 present", code, out, errOut, err)
	}
	out, errOut, code = on(fresh, "snapshot", "restore", "--scope", "acme/coder/s1", "--from-archive")
	if code != exitOK || !strings.Contains(out, a.Snapshot) {
		t.Fatalf("restore --from-archive on a fresh volume: exit %d, %q %q", code, out, errOut)
	}
	for path, want := range map[string]string{"src/f0.txt": "file 0\n", "src/f1.txt": "changed\n", "src/f4.txt": "file 4\n"} {
		b, err := os.ReadFile(filepath.Join(fresh, store.Scope{Space: "acme", Agent: "coder", Session: "s1"}.Dir(), path))
		if err != nil || string(b) != want {
			t.Errorf("%s restored: %q, %v; want %q", path, b, err, want)
		}
	}
	out, _, _ = on(fresh, "audit", "query", "--scope", "acme/coder/s1")
	if !strings.Contains(out, "snapshot_restore") {
		t.Errorf("the restore is not audited: %s", out)
	}
}

// TestPublishPathsFromPolicy: with no --publish-path, runs finish
// --publish publishes the subtrees the policy marks "publish: true"
// instead of output/; --publish-path overrides it.
func TestPublishPathsFromPolicy(t *testing.T) {
	s3Test(t)
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(pol, []byte("rules:\n  - path: dist/\n    publish: true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "root")
	cases := []struct {
		run   string
		extra []string
		want  string
	}{
		{"r1", nil, "dist/app.tar"},
		{"r2", []string{"--publish-path", "output"}, "output/log.txt"},
	}
	for _, c := range cases {
		loomfs := func(args ...string) (string, string, int) {
			t.Helper()
			return runLoomfs(t, append([]string{"--root", root, "--policy", pol}, args...)...)
		}
		if out, errOut, code := loomfs("runs", "create", "--scope", "acme/coder/s-"+c.run, "--run", c.run, "--user", "alice"); code != exitOK {
			t.Fatalf("runs create: exit %d: %s %s", code, out, errOut)
		}
		for _, p := range []string{"dist/app.tar", "output/log.txt"} {
			in, _ := json.Marshal(map[string]string{"path": p, "content": p})
			if out, errOut, code := loomfs("tool", "workspace_write", "--scope", "run:"+c.run, "--input", string(in)); code != exitOK {
				t.Fatalf("write %s: exit %d: %s %s", p, code, out, errOut)
			}
		}
		if out, errOut, code := loomfs(append([]string{"runs", "finish", "--run", c.run, "--publish"}, c.extra...)...); code != exitOK || !strings.Contains(out, `"files": 1`) {
			t.Fatalf("%s: runs finish --publish %v: exit %d, %s %s; want one file", c.run, c.extra, code, out, errOut)
		}
		out, errOut, code := loomfs("--json", "artifacts", "list", "--published", "--run", c.run, "--user", "alice")
		var m artifact.Manifest
		if err := json.Unmarshal([]byte(out), &m); err != nil || code != exitOK || len(m.Files) != 1 || m.Files[0].Path != c.want {
			t.Fatalf("%s: published %s %s (%v); want only %s", c.run, out, errOut, err, c.want)
		}
	}
}
