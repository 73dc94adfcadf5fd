package store_test

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// artifactRun is a bound run of user alice with files in its main
// workspace and two child instances, plus a second run of the same session
// whose child must not show.
type artifactRun struct {
	dir, root string
	run       *store.Run
	mainDir   string
	childDir  func(inst string) string
}

func newArtifactRun(t *testing.T) *artifactRun {
	t.Helper()
	dir := t.TempDir()
	root := sharedRoot(t, dir, volID)
	cfg := sharedCfg(root, filepath.Join(dir, "data"))
	b := createRun(t, cfg, spec("run-1", "alice"))
	createRun(t, cfg, spec("run-2", "alice"))
	r := resume(t, cfg, "run-1")
	write(t, openMain(t, r), "report.md", "# report\n")
	if _, err := openMain(t, r).Mkdir(context.Background(), "out", false); err != nil {
		t.Fatal(err)
	}
	write(t, openMain(t, r), "out/data.csv", "a,b\n")
	write(t, openInstance(t, r, "sub-1"), "notes.txt", "child one")
	sub2 := openInstance(t, r, "sub-2")
	if _, err := sub2.Mkdir(context.Background(), "deep", false); err != nil {
		t.Fatal(err)
	}
	write(t, sub2, "deep/x.txt", "child two")
	write(t, openInstance(t, resume(t, cfg, "run-2"), "sub-1"), "other-run.txt", "not run-1's")
	return &artifactRun{
		dir: dir, root: root, run: r,
		mainDir:  filepath.Join(root, b.MainScope().Dir()),
		childDir: func(inst string) string { return filepath.Join(root, b.InstanceScope(inst).Dir()) },
	}
}

func paths(l *store.ArtifactList) []string {
	var out []string
	for _, a := range l.Artifacts {
		out = append(out, a.Path)
	}
	return out
}

func download(ctx context.Context, r *store.Run, user, path string) ([]byte, error) {
	f, err := r.OpenArtifact(ctx, user, path, nil)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

// TestArtifactsList: the run's main files and its child instances as
// subagents/<instance>/<path>; another run's children are not shown.
func TestArtifactsList(t *testing.T) {
	a := newArtifactRun(t)
	l, err := a.run.Artifacts(context.Background(), "alice", nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"out/data.csv", "report.md", "subagents/sub-1/notes.txt", "subagents/sub-2/deep/x.txt"}
	if got := paths(l); !slices.Equal(got, want) || l.Truncated {
		t.Errorf("listing %v (truncated %v); want %v", got, l.Truncated, want)
	}
	for _, tc := range []struct{ path, content string }{
		{"report.md", "# report\n"},
		{"out/data.csv", "a,b\n"},
		{"subagents/sub-1/notes.txt", "child one"},
		{"subagents/sub-2/deep/x.txt", "child two"},
	} {
		got, err := download(context.Background(), a.run, "alice", tc.path)
		if err != nil || string(got) != tc.content {
			t.Errorf("download %s = %q, %v; want %q", tc.path, got, err, tc.content)
		}
	}
	// The subagents view is only a view: nothing of the kind is in main.
	if _, err := os.Lstat(filepath.Join(a.mainDir, policy.SubagentsDir)); !os.IsNotExist(err) {
		t.Errorf("main workspace has a subagents entry: %v", err)
	}
}

// TestArtifactsOnlyForInitiatingUser: only the user recorded in the
// binding may list or download.
func TestArtifactsOnlyForInitiatingUser(t *testing.T) {
	a := newArtifactRun(t)
	for _, user := range []string{"bob", "", "Alice", "alice ", "alic"} {
		_, err := a.run.Artifacts(context.Background(), user, nil)
		codeIs(t, "list as "+user, err, policy.PermissionDenied)
		_, err = download(context.Background(), a.run, user, "report.md")
		codeIs(t, "download as "+user, err, policy.PermissionDenied)
		if err != nil && strings.Contains(err.Error(), "alice") {
			t.Errorf("the refusal tells %q who owns the run: %v", user, err)
		}
	}
	// A legacy run's user was never recorded: nobody is served.
	mkdir(t, filepath.Join(a.dir, "data", store.LegacyRunsDir, "old-1"))
	legacy := resume(t, sharedCfg(a.root, filepath.Join(a.dir, "data")), "old-1")
	_, err := legacy.Artifacts(context.Background(), "alice", nil)
	codeIs(t, "list a legacy run", err, policy.PermissionDenied)
}

// TestArtifactDownloadCap: each download is capped at 2 MiB; a bigger
// file is listed as too_large and refused.
func TestArtifactDownloadCap(t *testing.T) {
	a := newArtifactRun(t)
	exact := bytes.Repeat([]byte("x"), store.MaxArtifactBytes)
	mkfile(t, filepath.Join(a.mainDir, "exact.bin"), string(exact))
	mkfile(t, filepath.Join(a.childDir("sub-1"), "over.bin"), string(exact)+"y")

	got, err := download(context.Background(), a.run, "alice", "exact.bin")
	if err != nil || !bytes.Equal(got, exact) {
		t.Errorf("a file of exactly 2 MiB: %d bytes, %v", len(got), err)
	}
	_, err = download(context.Background(), a.run, "alice", "subagents/sub-1/over.bin")
	codeIs(t, "download of 2 MiB + 1 byte", err, policy.TooLarge)
	if err != nil && !strings.Contains(err.Error(), "2097152") {
		t.Errorf("message %q does not name the limit", err)
	}
	l, err := a.run.Artifacts(context.Background(), "alice", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, art := range l.Artifacts {
		want := policy.Code("")
		if art.Path == "subagents/sub-1/over.bin" {
			want = policy.TooLarge
		}
		if art.Refused != want {
			t.Errorf("listing says %s is refused %q; want %q", art.Path, art.Refused, want)
		}
	}

	// A file that grows past the cap after it was opened is cut off with
	// too_large, not served whole.
	f, err := a.run.OpenArtifact(context.Background(), "alice", "exact.bin", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	app, err := os.OpenFile(filepath.Join(a.mainDir, "exact.bin"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	app.Write(bytes.Repeat([]byte("z"), 4096))
	app.Close()
	n, err := io.Copy(io.Discard, f)
	codeIs(t, "reading a file grown past the cap", err, policy.TooLarge)
	if n > store.MaxArtifactBytes {
		t.Errorf("%d bytes served; the cap is %d", n, store.MaxArtifactBytes)
	}
}

// TestArtifactPlantedObjects: a symlink or hard link someone planted in
// the run's files is listed for what it is and refused on download.
func TestArtifactPlantedObjects(t *testing.T) {
	a := newArtifactRun(t)
	secret := filepath.Join(a.dir, "secret.txt")
	mkfile(t, secret, "the host's secret")
	symlink(t, secret, filepath.Join(a.mainDir, "link.txt"))
	symlink(t, "../..", filepath.Join(a.mainDir, "out", "up"))
	hardlink(t, secret, filepath.Join(a.childDir("sub-1"), "hard.txt"))
	mkfifo(t, filepath.Join(a.childDir("sub-2"), "pipe"))
	// A child "instance" that is a symlink to another session's workspace.
	otherMain := filepath.Join(a.root, store.Scope{Space: "sp", Agent: "ag", Session: "other"}.Dir())
	mkfile(t, filepath.Join(otherMain, "theirs.txt"), "another session's file")
	symlink(t, otherMain, filepath.Join(filepath.Dir(a.childDir("sub-1")), "sub-evil"))
	// A subagents directory planted in main must not shadow the children.
	mkfile(t, filepath.Join(a.mainDir, policy.SubagentsDir, "sub-1", "notes.txt"), "planted")

	tests := []struct {
		path string
		want policy.Code
	}{
		{"link.txt", policy.SymlinkRefused},
		{"out/up/secret.txt", policy.SymlinkRefused},
		{"subagents/sub-1/hard.txt", policy.HardlinkRefused},
		{"subagents/sub-2/pipe", policy.SpecialFileRefused},
		{"subagents/sub-evil/theirs.txt", policy.SymlinkRefused},
		{"../secret.txt", policy.InvalidPath},
		{"subagents/../../secret.txt", policy.InvalidPath},
		{"/etc/passwd", policy.InvalidPath},
		{"subagents", policy.IsDir},
		{"subagents/sub-1", policy.IsDir},
		{"out", policy.IsDir},
		{"subagents/nope/x", policy.NotFound},
		{"subagents/.hidden/x", policy.NotFound},
		{".agentloom-volume", policy.InvalidPath},
	}
	for _, tc := range tests {
		t.Run(tc.path, func(t *testing.T) {
			got, err := within2s(t, func() ([]byte, error) { return download(context.Background(), a.run, "alice", tc.path) })
			codeIs(t, "download", err, tc.want)
			if bytes.Contains(got, []byte("secret")) || bytes.Contains(got, []byte("another session")) {
				t.Errorf("served %q", got)
			}
		})
	}
	got, err := download(context.Background(), a.run, "alice", "subagents/sub-1/notes.txt")
	if err != nil || string(got) != "child one" {
		t.Errorf("subagents/sub-1/notes.txt = %q, %v; want the child's file, not the one planted in main", got, err)
	}

	l, err := a.run.Artifacts(context.Background(), "alice", nil)
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]store.Artifact{}
	for _, art := range l.Artifacts {
		listed[art.Path] = art
	}
	for path, want := range map[string]struct {
		typ     string
		refused policy.Code
	}{
		"link.txt":                 {"symlink", policy.SymlinkRefused},
		"out/up":                   {"symlink", policy.SymlinkRefused},
		"subagents/sub-1/hard.txt": {"file", policy.HardlinkRefused},
		"subagents/sub-2/pipe":     {"fifo", policy.SpecialFileRefused},
	} {
		if got := listed[path]; got.Type != want.typ || got.Refused != want.refused {
			t.Errorf("listing of %s: %+v; want type %s refused %s", path, got, want.typ, want.refused)
		}
	}
	for path := range listed {
		if strings.HasPrefix(path, "subagents/sub-evil") || strings.Contains(path, "theirs") {
			t.Errorf("listing shows %s through a planted symlink", path)
		}
	}
	if n := strings.Count(strings.Join(paths(l), "\n"), "subagents/sub-1/notes.txt"); n != 1 {
		t.Errorf("subagents/sub-1/notes.txt listed %d times", n)
	}
}

// TestArtifactServedFromCheckedFD: the download reads the descriptor that
// was opened and checked; swapping the path afterwards changes nothing.
func TestArtifactServedFromCheckedFD(t *testing.T) {
	a := newArtifactRun(t)
	secret := filepath.Join(a.dir, "secret.txt")
	mkfile(t, secret, "the host's secret")
	f, err := a.run.OpenArtifact(context.Background(), "alice", "report.md", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p := filepath.Join(a.mainDir, "report.md")
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	symlink(t, secret, p)
	got, err := io.ReadAll(f)
	if err != nil || string(got) != "# report\n" {
		t.Errorf("after the swap the download gives %q, %v; want the file that was checked", got, err)
	}
}

func within2s(t *testing.T, f func() ([]byte, error)) (b []byte, err error) {
	t.Helper()
	within(t, 2e9, "download", func() { b, err = f() })
	return b, err
}

// TestCheckArtifactUser: the one owner rule every artifact door asks, the
// live volume's and a published copy's.
func TestCheckArtifactUser(t *testing.T) {
	cases := []struct {
		name, owner, user string
		ok                bool
	}{
		{"the owner is served", "alice", "alice", true},
		{"another user is refused", "alice", "bob", false},
		{"no user is refused", "alice", "", false},
		{"a legacy run is served to no one", "", "alice", false},
		{"a legacy run with no user", "", "", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := store.CheckArtifactUser("r1", c.owner, c.user)
			if c.ok {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if policy.CodeOf(err) != policy.PermissionDenied {
				t.Fatalf("CheckArtifactUser(%q, %q) = %v, want permission_denied", c.owner, c.user, err)
			}
			if c.owner != "" && strings.Contains(err.Error(), c.owner) {
				t.Fatalf("the refusal names the owner: %v", err)
			}
		})
	}
}
