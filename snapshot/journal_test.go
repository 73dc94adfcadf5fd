package snapshot_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agentloom/loomfs/fusefs"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/snapshot"
	"github.com/agentloom/loomfs/store"
)

// TestJournalMatchesWalk: changes made through both doors (the store, as
// the tools make them, and a real FUSE mount, as a program in the sandbox
// makes them: renames of files and directories, chmod, truncate, rm -r,
// writes in place) are followed by snapshots that only replay the change
// journal, and each such snapshot holds exactly what a full walk finds at
// that moment, down to directory times and the objects skipped.
func TestJournalMatchesWalk(t *testing.T) {
	ctx := context.Background()
	s := newScope(t)
	for i := range 300 {
		s.write(t, fmt.Sprintf("src/d%d/e%d/f%03d", i%7, i%3, i), []byte(fmt.Sprint("initial ", i)))
	}
	s.waitTick(t)
	if _, err := snapshot.Create(ctx, s.ws, snapshot.Options{}); err != nil {
		t.Fatal(err)
	}
	mnt, repo := s.mountAndRepo(t)

	r := rand.New(rand.NewPCG(3, 5))
	sh := func(script string) {
		t.Helper()
		// The shell changes into the mount itself: a child that did it
		// between fork and exec would need this process's daemon while
		// the fork holds it still.
		cmd := exec.Command("sh", "-ec", `cd "$1"; shift; `+script, "sh", mnt)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", script, err, out)
		}
	}
	files := func() []string {
		var out []string
		filepath.WalkDir(s.dir, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				rel, _ := filepath.Rel(s.dir, p)
				if strings.HasPrefix(rel, "src/") {
					out = append(out, rel)
				}
			}
			return nil
		})
		return out
	}
	for round := range 30 {
		fs := files()
		pick := func() string { return fs[r.IntN(len(fs))] }
		for k := range 6 {
			switch r.IntN(11) {
			case 0:
				s.change(t, pick(), []byte(fmt.Sprint("tool write ", round, k)))
			case 1:
				dir := fmt.Sprintf("src/new/r%d", round)
				if _, err := s.ws.Mkdir(ctx, dir, true); err != nil {
					t.Fatal(err)
				}
				s.change(t, fmt.Sprintf("%s/k%d", dir, k), []byte("new through the tools"))
			case 2:
				if f := pick(); exists(s.dir, f) {
					s.remove(t, f)
				}
			case 3:
				sh(fmt.Sprintf("printf 'appended %d %d' >> %s", round, k, pick()))
			case 4:
				sh(fmt.Sprintf("mkdir -p src/m%d/x && printf new > src/m%d/x/y%d", round, round, k))
			case 5:
				// A directory moved: everything in it changes its path.
				if d := filepath.Dir(pick()); exists(s.dir, d) {
					sh(fmt.Sprintf("mv %s src/moved-%d-%d", d, round, k))
				}
			case 6:
				sh(fmt.Sprintf("chmod 0400 %s", pick()))
			case 7:
				sh(fmt.Sprintf("truncate -s 3 %s", pick()))
			case 8:
				if d := filepath.Dir(pick()); exists(s.dir, d) {
					sh("rm -r " + d)
				}
			case 9:
				// A file moved over another.
				a, b := pick(), pick()
				if a != b && exists(s.dir, a) && exists(s.dir, b) {
					sh(fmt.Sprintf("mv %s %s", a, b))
				}
			case 10:
				sh(fmt.Sprintf("touch -d '2001-02-03 04:05' %s", pick()))
			}
			fs = files()
			if len(fs) < 20 {
				if _, err := s.ws.Mkdir(ctx, fmt.Sprintf("src/refill/r%d", round), true); err != nil {
					t.Fatal(err)
				}
				for i := range 50 {
					s.change(t, fmt.Sprintf("src/refill/r%d/f%d", round, i), []byte("refill"))
				}
				fs = files()
			}
		}
		// Something outside loomfs plants a symlink in a directory, which
		// is then moved through the mount: the walk of the moved subtree
		// finds it and skips it.
		if round == 10 {
			os.MkdirAll(filepath.Join(s.dir, "src/planted"), 0o700)
			os.Symlink("/etc/passwd", filepath.Join(s.dir, "src/planted/link"))
			sh("mv src/planted src/planted-moved")
		}
		s.waitTick(t)
		got, err := snapshot.Create(ctx, s.ws, snapshot.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Walk != "journal" {
			t.Fatalf("round %d walked the scope (%s)", round, got.WalkReason)
		}
		entries, err := repo.Entries(got.ID)
		if err != nil {
			t.Fatal(err)
		}
		want, skipped, err := snapshot.WalkNow(ctx, s.ws)
		if err != nil {
			t.Fatal(err)
		}
		if d := firstDifference(entries, want); d != "" {
			t.Fatalf("round %d (depth %d): the snapshot differs from a walk: %s", round, got.Depth, d)
		}
		if !slices.Equal(got.Skipped, skipped) {
			t.Fatalf("round %d: skipped %v, a walk skips %v", round, got.Skipped, skipped)
		}
		var files, dirs int
		var bytes int64
		for _, e := range want {
			if e.Type == "dir" {
				dirs++
			} else {
				files++
				bytes += e.Size
			}
		}
		if got.Files != files || got.Dirs != dirs || got.Bytes != bytes {
			t.Fatalf("round %d: manifest counts %d files %d dirs %d bytes, a walk %d %d %d", round, got.Files, got.Dirs, got.Bytes, files, dirs, bytes)
		}
	}
}

func firstDifference(got, want []Entry) string {
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			return fmt.Sprintf("entry %d: %+v, walk %+v", i, got[i], want[i])
		}
	}
	if len(got) != len(want) {
		return fmt.Sprintf("%d entries, walk %d", len(got), len(want))
	}
	return ""
}

type Entry = snapshot.Entry

// TestDeadWriterMakesAWalk: a process that changed the scope and died
// without closing its journal (kill -9 between a change and its line
// would look the same) makes the next snapshot walk; the one after it
// trusts the journals again.
func TestDeadWriterMakesAWalk(t *testing.T) {
	ctx := context.Background()
	s := newScope(t)
	s.change(t, "src/a", []byte("a"))
	if _, err := snapshot.Create(ctx, s.ws, snapshot.Options{}); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "LOOMFS_HELPER_ROOT="+s.root)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("writer: %v\n%s", err, out)
	}
	m, err := snapshot.Create(ctx, s.ws, snapshot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if m.Walk != "full" || !strings.Contains(m.WalkReason, "without closing") {
		t.Fatalf("after a writer died: walk %q (%s), want a full walk saying why", m.Walk, m.WalkReason)
	}
	if got := s.contents(t)["src/b"]; got == "" {
		t.Fatal("the dead writer's file is missing")
	}
	s.change(t, "src/c", []byte("c"))
	m, err = snapshot.Create(ctx, s.ws, snapshot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if m.Walk != "journal" {
		t.Fatalf("next snapshot walked again: %s", m.WalkReason)
	}
}

// TestMain runs the test binary as the writer TestDeadWriterMakesAWalk
// starts when LOOMFS_HELPER_ROOT is set: it writes through the store and
// exits without closing the workspace, as a process that dies would.
func TestMain(m *testing.M) {
	if root := os.Getenv("LOOMFS_HELPER_ROOT"); root != "" {
		if err := deadWriter(root); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func deadWriter(root string) error {
	ctx := context.Background()
	vol, err := store.OpenVolume(ctx, store.Config{Root: root})
	if err != nil {
		return err
	}
	pol, _ := policy.Preset("standard")
	ws, err := vol.Open(ctx, store.Scope{Space: "sp", Agent: "ag", Session: "se"}, pol)
	if err != nil {
		return err
	}
	if _, err := ws.Mkdir(ctx, "src", true); err != nil {
		return err
	}
	_, err = ws.WriteFile(ctx, "src/b", []byte("b"), nil)
	return err
}

// TestOutsideChangeNeedsFull: a file changed in the backing store behind
// loomfs's back is not in any journal; a snapshot that trusts the
// journals keeps the old content, a full one sees it.
func TestOutsideChangeNeedsFull(t *testing.T) {
	ctx := context.Background()
	s := newScope(t)
	s.change(t, "src/a", []byte("old"))
	s.waitTick(t)
	if _, err := snapshot.Create(ctx, s.ws, snapshot.Options{}); err != nil {
		t.Fatal(err)
	}
	s.write(t, "src/a", []byte("changed behind loomfs"))
	m, err := snapshot.Create(ctx, s.ws, snapshot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if m.Walk != "journal" || m.Hashed != 0 {
		t.Fatalf("walk %q hashed %d: the outside change should go unseen", m.Walk, m.Hashed)
	}
	m, err = snapshot.Create(ctx, s.ws, snapshot.Options{Full: true})
	if err != nil {
		t.Fatal(err)
	}
	if m.Walk != "full" || m.Hashed != 1 {
		t.Fatalf("full snapshot: walk %q hashed %d, want the changed file read", m.Walk, m.Hashed)
	}
}

// TestDeltaChain: snapshots taken from the journals stand on their base;
// deleting a base rewrites what stands on it in full, and a chain never
// grows past its limit.
func TestDeltaChain(t *testing.T) {
	ctx := context.Background()
	s := newScope(t)
	for i := range 20 {
		s.change(t, fmt.Sprintf("src/f%02d", i), []byte(fmt.Sprint(i)))
	}
	repo, err := snapshot.OpenRepo(s.vol, s.sc, true)
	if err != nil {
		t.Fatal(err)
	}
	defer repo.Close()
	var ms []*snapshot.Manifest
	want := map[string][]Entry{}
	maxDepth, full := 0, 0
	for i := range 80 {
		s.change(t, fmt.Sprintf("src/f%02d", i%20), []byte(fmt.Sprint("round ", i)))
		m, err := snapshot.Create(ctx, s.ws, snapshot.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if m.Base == "" {
			full++
		}
		maxDepth = max(maxDepth, m.Depth)
		ms = append(ms, m)
		if want[m.ID], err = repo.Entries(m.ID); err != nil {
			t.Fatal(err)
		}
	}
	if maxDepth == 0 || maxDepth > 64 || full < 2 {
		t.Fatalf("80 snapshots: deepest chain %d, %d full; want chains, capped at 64", maxDepth, full)
	}
	// Delete every other snapshot, bases included.
	for i := 0; i < len(ms); i += 2 {
		if err := repo.Delete(ms[i].ID); err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i < len(ms); i += 2 {
		got, err := repo.Entries(ms[i].ID)
		if err != nil {
			t.Fatalf("snapshot %d after its neighbours were deleted: %v", i, err)
		}
		if d := firstDifference(got, want[ms[i].ID]); d != "" {
			t.Fatalf("snapshot %d changed when its base was deleted: %s", i, d)
		}
	}
	// What remains restores exactly, and the blobs it needs survive a
	// sweep.
	if _, _, err := repo.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	last := ms[len(ms)-1]
	if _, err := snapshot.Restore(ctx, s.ws, last.ID, snapshot.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := s.contents(t)["src/f19"]; got != sum([]byte("round 79")) {
		t.Fatalf("restored src/f19 has %s", got)
	}
	// A restore replaced the whole tree: the next snapshot walks it.
	m, err := snapshot.Create(ctx, s.ws, snapshot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if m.Walk != "full" || !strings.Contains(m.WalkReason, "restore") {
		t.Fatalf("snapshot after a restore: walk %q (%s); want a walk saying why", m.Walk, m.WalkReason)
	}
}

// TestOpenWriterLookedAtUntilReleased: a file open for writing through the
// mount is looked at by every snapshot until its release, whether the
// snapshot that saw it open replayed the journals or walked: its writes
// are not noted one by one, and the release comes after close(2).
func TestOpenWriterLookedAtUntilReleased(t *testing.T) {
	for _, full := range []bool{false, true} {
		t.Run(fmt.Sprintf("full=%v", full), func(t *testing.T) {
			ctx := context.Background()
			s := newScope(t)
			s.write(t, "src/keep", []byte("keep"))
			if _, err := snapshot.Create(ctx, s.ws, snapshot.Options{}); err != nil {
				t.Fatal(err)
			}
			mnt, repo := s.mountAndRepo(t)
			content := func(m *snapshot.Manifest) string {
				t.Helper()
				entries, err := repo.Entries(m.ID)
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range entries {
					if e.Path == "src/log" {
						return e.SHA256
					}
				}
				return "absent"
			}
			sum := func(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }

			f, err := os.OpenFile(filepath.Join(mnt, "src/log"), os.O_CREATE|os.O_WRONLY, 0o600)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.WriteString("one\n"); err != nil {
				t.Fatal(err)
			}
			s1, err := snapshot.Create(ctx, s.ws, snapshot.Options{Full: full})
			if err != nil {
				t.Fatal(err)
			}
			if got := content(s1); got != sum("one\n") {
				t.Fatalf("first snapshot (%s): src/log %s", s1.Walk, got)
			}
			if _, err := f.WriteString("two\n"); err != nil {
				t.Fatal(err)
			}
			s2, err := snapshot.Create(ctx, s.ws, snapshot.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if s2.Walk != "journal" {
				t.Fatalf("second snapshot walked: %s", s2.WalkReason)
			}
			if got := content(s2); got != sum("one\ntwo\n") {
				t.Fatalf("a write made after a snapshot through an open it saw is missing from the next (%s)", got)
			}
		})
	}
}

// mountAndRepo mounts the scope in a temporary directory and opens its
// snapshot repository, both undone when t ends.
func (s *scope) mountAndRepo(t *testing.T) (string, *snapshot.Repo) {
	t.Helper()
	mnt := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	m, err := fusefs.Mount(context.Background(), s.ws, mnt, fusefs.Options{})
	if err != nil {
		t.Fatalf("mount: %v", err)
	}
	t.Cleanup(func() { m.Unmount() })
	repo, err := snapshot.OpenRepo(s.vol, s.sc, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { repo.Close() })
	return mnt, repo
}
