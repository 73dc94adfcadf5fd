package snapshot_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/snapshot"
	"github.com/agentloom/loomfs/store"
)

type scope struct {
	root string // volume root
	dir  string // the scope directory on the host
	vol  *store.Volume
	ws   *store.Workspace
	sc   store.Scope
}

// newScope opens a fresh main scope under the standard policy (so a
// hidden .meta/ exists to be kept).
func newScope(t testing.TB) *scope {
	t.Helper()
	return openScope(t, t.TempDir())
}

// openScope opens the test scope on the volume at root.
func openScope(t testing.TB, root string) *scope {
	t.Helper()
	ctx := context.Background()
	vol, err := store.OpenVolume(ctx, store.Config{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vol.Close() })
	pol, _ := policy.Preset("standard")
	sc := store.Scope{Space: "sp", Agent: "ag", Session: "se"}
	ws, err := vol.Open(ctx, sc, pol)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	return &scope{root: root, dir: filepath.Join(root, sc.Dir()), vol: vol, ws: ws, sc: sc}
}

// tree writes n files of random content spread over directories, and
// returns each file's sha256 by path.
func (s *scope) tree(t testing.TB, n int) map[string]string {
	t.Helper()
	r := rand.New(rand.NewPCG(7, 9))
	want := map[string]string{}
	for i := range n {
		rel := fmt.Sprintf("src/d%02d/e%d/f%05d.txt", i%100, (i/100)%10, i)
		b := make([]byte, 512+r.IntN(2048))
		for j := range b {
			b[j] = 'a' + byte(r.IntN(26))
		}
		s.write(t, rel, b)
		want[rel] = sum(b)
	}
	s.write(t, ".meta/task.json", []byte(`{"task":1}`))
	want[".meta/task.json"] = sum([]byte(`{"task":1}`))
	return want
}

// change writes rel through the store, as the tools do, so the change
// journal records it.
func (s *scope) change(t testing.TB, rel string, b []byte) {
	t.Helper()
	if _, err := s.ws.Mkdir(context.Background(), filepath.Dir(rel), true); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ws.WriteFile(context.Background(), rel, b, nil); err != nil {
		t.Fatal(err)
	}
}

// remove removes rel through the store.
func (s *scope) remove(t testing.TB, rel string) {
	t.Helper()
	if err := s.ws.Remove(context.Background(), rel, nil); err != nil {
		t.Fatal(err)
	}
}

// write writes rel straight into the backing store, as something other
// than loomfs would: no change journal records it.
func (s *scope) write(t testing.TB, rel string, b []byte) {
	t.Helper()
	p := filepath.Join(s.dir, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// contents hashes every regular file of the scope directory on the host.
func (s *scope) contents(t testing.TB) map[string]string {
	t.Helper()
	got := map[string]string{}
	err := filepath.WalkDir(s.dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(s.dir, p)
		got[rel] = sum(b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// blobBytes is what the scope's snapshot contents take: the bytes and
// number of files under blobs/.
func (s *scope) blobBytes(t testing.TB) (bytes int64, files int) {
	t.Helper()
	dir := filepath.Join(s.root, store.SnapshotsDir, s.sc.Hash(), "blobs")
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			info, _ := d.Info()
			bytes += info.Size()
			files++
		}
		return err
	})
	return bytes, files
}

// waitTick waits until the volume's clock has moved past every change
// made so far, so the next snapshot can trust what it reads (see the
// index's rule on change times).
func (s *scope) waitTick(t testing.TB) {
	t.Helper()
	p := filepath.Join(s.root, "tick")
	var before syscall.Stat_t
	os.WriteFile(p, nil, 0o600)
	syscall.Stat(p, &before)
	for {
		time.Sleep(2 * time.Millisecond)
		os.WriteFile(p, []byte("x"), 0o600)
		var now syscall.Stat_t
		syscall.Stat(p, &now)
		if now.Ctim != before.Ctim {
			return
		}
	}
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func wantCode(t *testing.T, err error, code policy.Code) {
	t.Helper()
	if err == nil {
		t.Fatalf("want %s, got success", code)
	}
	if got := policy.CodeOf(err); got != code {
		t.Fatalf("want %s, got %s: %v", code, got, err)
	}
}

// TestIncremental10000Files is SPEC §6's snapshot contract on a 10,000-file
// tree: the second snapshot after 10 changes reads and writes exactly those
// 10 files' bytes; diff names exactly them; restore brings back exact
// content and hashes, hidden subtrees included.
func TestIncremental10000Files(t *testing.T) {
	ctx := context.Background()
	s := newScope(t)
	want1 := s.tree(t, 10_000)
	s.waitTick(t)

	m1, err := snapshot.Create(ctx, s.ws, snapshot.Options{Label: "first", Run: "run-1"})
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for rel := range want1 {
		info, _ := os.Stat(filepath.Join(s.dir, rel))
		total += info.Size()
	}
	if m1.Files != len(want1) || m1.NewBlobs != len(want1) || m1.NewBytes != total || m1.Hashed != len(want1) {
		t.Fatalf("first snapshot: files %d new blobs %d new bytes %d hashed %d; want %d files of %d bytes, all new", m1.Files, m1.NewBlobs, m1.NewBytes, m1.Hashed, len(want1), total)
	}
	if m1.Label != "first" || m1.Run != "run-1" {
		t.Errorf("manifest label %q run %q", m1.Label, m1.Run)
	}
	bytes1, blobs1 := s.blobBytes(t)
	if bytes1 != total || blobs1 != len(want1) {
		t.Fatalf("blobs hold %d bytes in %d files after the first snapshot, want %d in %d", bytes1, blobs1, total, len(want1))
	}

	// Change 10 files: new content, some longer and some shorter.
	var changed []string
	var changedBytes int64
	for i := range 10 {
		rel := fmt.Sprintf("src/d%02d/e%d/f%05d.txt", (i*997)%100, ((i*997)/100)%10, i*997)
		b := []byte(strings.Repeat(fmt.Sprintf("changed %d\n", i), 10+i*30))
		s.change(t, rel, b)
		changed = append(changed, rel)
		changedBytes += int64(len(b))
	}
	slices.Sort(changed)
	s.waitTick(t)

	m2, err := snapshot.Create(ctx, s.ws, snapshot.Options{Label: "second"})
	if err != nil {
		t.Fatal(err)
	}
	if m2.Walk != "journal" {
		t.Errorf("second snapshot walked the scope (%s: %s); the journal should have served", m2.Walk, m2.WalkReason)
	}
	if m2.Hashed != 10 || m2.NewBlobs != 10 || m2.NewBytes != changedBytes {
		t.Fatalf("second snapshot read %d files and wrote %d blobs, %d bytes; want exactly the 10 changed files, %d bytes", m2.Hashed, m2.NewBlobs, m2.NewBytes, changedBytes)
	}
	bytes2, blobs2 := s.blobBytes(t)
	if bytes2-bytes1 != changedBytes || blobs2-blobs1 != 10 {
		t.Fatalf("blobs grew by %d bytes in %d files, want %d bytes in 10", bytes2-bytes1, blobs2-blobs1, changedBytes)
	}
	t.Logf("10,000 files: first snapshot %.3fs, incremental after 10 changes %.3fs writing %d bytes", m1.Duration, m2.Duration, m2.NewBytes)

	d, err := snapshot.Diff(ctx, s.ws, m1.ID, m2.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(d.Changed, changed) || len(d.Added) != 0 || len(d.Removed) != 0 {
		t.Fatalf("diff %s %s: added %v changed %v removed %v; want changed %v only", m1.ID, m2.ID, d.Added, d.Changed, d.Removed, changed)
	}

	// Change the live scope: one file added, one removed, one rewritten.
	s.write(t, "src/new.txt", []byte("new"))
	os.Remove(filepath.Join(s.dir, "src/d00/e0/f00000.txt"))
	s.write(t, "src/d01/e0/f00001.txt", []byte("rewritten"))
	d, err = snapshot.Diff(ctx, s.ws, m2.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(d.Added, []string{"src/new.txt"}) || !slices.Equal(d.Removed, []string{"src/d00/e0/f00000.txt"}) || !slices.Equal(d.Changed, []string{"src/d01/e0/f00001.txt"}) {
		t.Fatalf("diff against the live scope: added %v changed %v removed %v", d.Added, d.Changed, d.Removed)
	}

	// Restore the first snapshot: exact content and hashes come back,
	// the hidden .meta/ too, and what was added since is gone.
	if _, err := snapshot.Restore(ctx, s.ws, m1.ID, snapshot.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	got := s.contents(t)
	if len(got) != len(want1) {
		t.Fatalf("restored %d files, want %d", len(got), len(want1))
	}
	for rel, h := range want1 {
		if got[rel] != h {
			t.Fatalf("%s restored with sha256 %q, want %s", rel, got[rel], h)
		}
	}
	// The Workspace follows the restore: it reads the restored tree.
	b, _, err := s.ws.ReadFile(ctx, changed[0])
	if err != nil || sum(b) != want1[changed[0]] {
		t.Fatalf("read through the workspace after restore: %v (sha256 %s, want %s)", err, sum(b), want1[changed[0]])
	}
	// Nothing of the swap is left beside the scope directory.
	ents, _ := os.ReadDir(filepath.Dir(s.dir))
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), store.RestorePrefix) {
			t.Errorf("restore left %s beside the scope", e.Name())
		}
	}
	// Nothing of the snapshots is inside the scope.
	if _, err := os.Stat(filepath.Join(s.root, store.SnapshotsDir, s.sc.Hash(), "blobs")); err != nil {
		t.Errorf("snapshots are not under the volume root: %v", err)
	}

	// A snapshot right after the restore reads nothing again.
	s.waitTick(t)
	m3, err := snapshot.Create(ctx, s.ws, snapshot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if m3.Hashed != 0 || m3.NewBytes != 0 {
		t.Errorf("snapshot after restore read %d files and wrote %d bytes; the restore should have left an index", m3.Hashed, m3.NewBytes)
	}
}

// TestRestoreRefusedWhileBusy: restore refuses while a command runs (its
// execution marker is present) and while the scope is quarantined, and
// changes nothing then.
func TestRestoreRefusedWhileBusy(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name  string
		setup func(t *testing.T, s *scope) (undo func())
		code  policy.Code
	}{
		{"during a command (execution marker present)", func(t *testing.T, s *scope) func() {
			unlock, err := s.ws.Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.ws.SetMarker(store.Marker{Container: "loomfs-test", Node: "n1", Time: time.Now()}); err != nil {
				t.Fatal(err)
			}
			return func() { s.ws.ClearMarker(); unlock() }
		}, policy.Conflict},
		{"while quarantined", func(t *testing.T, s *scope) func() {
			if err := s.ws.Quarantine(store.Marker{Container: "loomfs-test", Node: "n1", Time: time.Now()}, "test"); err != nil {
				t.Fatal(err)
			}
			return func() {
				if err := s.vol.ClearQuarantine(s.sc, "loomfs-test"); err != nil {
					t.Fatal(err)
				}
			}
		}, policy.Quarantined},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newScope(t)
			s.write(t, "src/a.txt", []byte("one"))
			m, err := snapshot.Create(ctx, s.ws, snapshot.Options{})
			if err != nil {
				t.Fatal(err)
			}
			s.write(t, "src/a.txt", []byte("two"))
			undo := tc.setup(t, s)
			_, err = snapshot.Restore(ctx, s.ws, m.ID, snapshot.RestoreOptions{})
			wantCode(t, err, tc.code)
			if b, _ := os.ReadFile(filepath.Join(s.dir, "src/a.txt")); string(b) != "two" {
				t.Fatalf("a refused restore changed the scope: %q", b)
			}
			undo()
			if _, err := snapshot.Restore(ctx, s.ws, m.ID, snapshot.RestoreOptions{}); err != nil {
				t.Fatalf("restore once idle: %v", err)
			}
			if b, _ := os.ReadFile(filepath.Join(s.dir, "src/a.txt")); string(b) != "one" {
				t.Fatalf("restored content %q, want one", b)
			}
		})
	}
}

// TestSkippedObjects: symlinks, hard links and special files never enter a
// snapshot; they are reported, and a restore does not bring them back.
func TestSkippedObjects(t *testing.T) {
	ctx := context.Background()
	s := newScope(t)
	s.write(t, "src/ok.txt", []byte("ok"))
	s.write(t, "src/linked.txt", []byte("linked"))
	must(t, os.Symlink("/etc/passwd", filepath.Join(s.dir, "src/sym")))
	must(t, os.Link(filepath.Join(s.dir, "src/linked.txt"), filepath.Join(s.dir, "src/hard")))
	must(t, syscall.Mkfifo(filepath.Join(s.dir, "src/fifo"), 0o600))
	m, err := snapshot.Create(ctx, s.ws, snapshot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reasons := map[string]string{}
	for _, sk := range m.Skipped {
		reasons[sk.Path] = sk.Reason
	}
	want := map[string]string{
		"src/sym":        string(policy.SymlinkRefused),
		"src/hard":       string(policy.HardlinkRefused),
		"src/linked.txt": string(policy.HardlinkRefused),
		"src/fifo":       string(policy.SpecialFileRefused),
	}
	for p, r := range want {
		if reasons[p] != r {
			t.Errorf("%s skipped as %q, want %q (skipped: %v)", p, reasons[p], r, m.Skipped)
		}
	}
	if m.Files != 1 {
		t.Errorf("snapshot holds %d files, want only src/ok.txt", m.Files)
	}
	if _, err := snapshot.Restore(ctx, s.ws, m.ID, snapshot.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	got := s.contents(t)
	if len(got) != 1 || got["src/ok.txt"] != sum([]byte("ok")) {
		t.Errorf("restored %v, want src/ok.txt only", got)
	}
	if _, err := os.Lstat(filepath.Join(s.dir, "src/sym")); err == nil {
		t.Errorf("restore brought back a symlink")
	}
}

// TestListGetDeleteSweep: list shows every snapshot oldest first; a
// deleted snapshot's contents no other snapshot uses are swept.
func TestListGetDeleteSweep(t *testing.T) {
	ctx := context.Background()
	s := newScope(t)
	s.write(t, "src/keep.txt", []byte("kept in both"))
	s.write(t, "src/old.txt", []byte("only in the first"))
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	m1, err := snapshot.Create(ctx, s.ws, snapshot.Options{Time: base})
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(s.dir, "src/old.txt"))
	m2, err := snapshot.Create(ctx, s.ws, snapshot.Options{Time: base.Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	repo, err := snapshot.OpenRepo(s.vol, s.sc, false)
	if err != nil {
		t.Fatal(err)
	}
	defer repo.Close()
	ms, err := repo.List()
	if err != nil || len(ms) != 2 || ms[0].ID != m1.ID || ms[1].ID != m2.ID {
		t.Fatalf("list: %v %v", ms, err)
	}
	if _, err := repo.Get("../../etc"); policy.CodeOf(err) != policy.InvalidInput {
		t.Errorf("a path as snapshot id: %v", err)
	}
	if _, err := repo.Get("20990101T000000.000Z-abcdef"); policy.CodeOf(err) != policy.NotFound {
		t.Errorf("a missing snapshot: %v", err)
	}
	must(t, repo.Delete(m1.ID))
	n, bytes, err := repo.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 || bytes != int64(len("only in the first")) {
		t.Fatalf("sweep removed %d blobs, %d bytes; want the one only the deleted snapshot used", n, bytes)
	}
	if _, err := snapshot.Restore(ctx, s.ws, m2.ID, snapshot.RestoreOptions{}); err != nil {
		t.Fatalf("the remaining snapshot no longer restores: %v", err)
	}
}

func exists(dir, rel string) bool {
	_, err := os.Lstat(filepath.Join(dir, rel))
	return err == nil
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestIndexOverManyRounds: over many snapshots with changes, deletions
// and additions, each manifest names exactly the content on disk, and each
// snapshot reads only the files that changed since the last.
func TestIndexOverManyRounds(t *testing.T) {
	for _, tc := range []struct {
		name string
		full bool // changes made behind loomfs's back, seen by walks
	}{{"journal", false}, {"walk", true}} {
		t.Run(tc.name, func(t *testing.T) { indexOverManyRounds(t, tc.full) })
	}
}

func indexOverManyRounds(t *testing.T, full bool) {
	ctx := context.Background()
	s := newScope(t)
	change, remove, walk := s.change, s.remove, "journal"
	if full {
		change, walk = s.write, "full"
		remove = func(t testing.TB, rel string) { os.Remove(filepath.Join(s.dir, rel)) }
	}
	for i := range 200 {
		s.write(t, fmt.Sprintf("src/f%03d", i), []byte(fmt.Sprint("initial ", i)))
	}
	s.waitTick(t)
	if _, err := snapshot.Create(ctx, s.ws, snapshot.Options{}); err != nil {
		t.Fatal(err)
	}
	repo, err := snapshot.OpenRepo(s.vol, s.sc, false)
	if err != nil {
		t.Fatal(err)
	}
	defer repo.Close()
	for round := range 40 {
		for k := range 3 {
			change(t, fmt.Sprintf("src/f%03d", (round*7+k*13)%200), []byte(fmt.Sprint("round ", round, " change ", k)))
		}
		if rel := fmt.Sprintf("src/f%03d", (round*11+5)%200); exists(s.dir, rel) {
			remove(t, rel)
		}
		change(t, fmt.Sprintf("src/new%03d", round), []byte(fmt.Sprint("new in round ", round)))
		s.waitTick(t)
		m, err := snapshot.Create(ctx, s.ws, snapshot.Options{Full: full})
		if err != nil {
			t.Fatal(err)
		}
		if m.Walk != walk {
			t.Errorf("round %d: walk %q (%s), want %q", round, m.Walk, m.WalkReason, walk)
		}
		want := s.contents(t)
		// 3 changed and 1 new; a changed file may be the one deleted.
		if m.Hashed < 3 || m.Hashed > 4 {
			t.Errorf("round %d read %d files, want the 3 or 4 written still there", round, m.Hashed)
		}
		es, err := repo.Entries(m.ID)
		if err != nil {
			t.Fatal(err)
		}
		files := 0
		for _, e := range es {
			if e.Type != "file" {
				continue
			}
			files++
			if want[e.Path] != e.SHA256 {
				t.Fatalf("round %d: manifest says %s has %s, disk has %s", round, e.Path, e.SHA256, want[e.Path])
			}
		}
		if files != len(want) {
			t.Fatalf("round %d: manifest has %d files, disk %d", round, files, len(want))
		}
	}
}

// TestEmulatedLinks: a snapshot keeps an emulated link, by a walk and by
// the change journal, and restore brings it back as a link: a marked
// file, never a symlink.
func TestEmulatedLinks(t *testing.T) {
	ctx := context.Background()
	s := newScope(t)
	s.write(t, "src/target.txt", []byte("x"))
	if _, err := s.ws.Symlink(ctx, "src/link", "target.txt"); err != nil {
		t.Fatal(err)
	}
	first, err := snapshot.Create(ctx, s.ws, snapshot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Skipped) != 0 {
		t.Fatalf("skipped %v", first.Skipped)
	}
	must(t, s.ws.Remove(ctx, "src/link", nil))
	if _, err := s.ws.Symlink(ctx, "src/abs", "/etc/passwd"); err != nil {
		t.Fatal(err)
	}
	second, err := snapshot.Create(ctx, s.ws, snapshot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if second.Walk != "journal" || second.Hashed != 1 {
		t.Errorf("second snapshot: walk %q, %d read; want the journal's one change", second.Walk, second.Hashed)
	}
	wantLinks := func(links map[string]string, gone ...string) {
		t.Helper()
		for rel, target := range links {
			got, _, err := s.ws.ReadLink(rel)
			if err != nil || got != target {
				t.Errorf("%s: link to %q (%v), want %q", rel, got, err, target)
			}
			var st unix.Stat_t
			must(t, unix.Lstat(filepath.Join(s.dir, rel), &st))
			if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Mode&0o7777 != policy.LinkPerm {
				t.Errorf("%s restored with mode %o", rel, st.Mode)
			}
		}
		for _, rel := range gone {
			if _, err := os.Lstat(filepath.Join(s.dir, rel)); !os.IsNotExist(err) {
				t.Errorf("%s is there: %v", rel, err)
			}
		}
	}
	for _, c := range []struct {
		m     *snapshot.Manifest
		links map[string]string
		gone  string
	}{
		{first, map[string]string{"src/link": "target.txt"}, "src/abs"},
		{second, map[string]string{"src/abs": "/etc/passwd"}, "src/link"},
	} {
		if _, err := snapshot.Restore(ctx, s.ws, c.m.ID, snapshot.RestoreOptions{}); err != nil {
			t.Fatal(err)
		}
		wantLinks(c.links, c.gone)
	}
	entries, err := s.ws.ReadDir(ctx, "src")
	must(t, err)
	for _, e := range entries {
		if e.Kind == policy.KindSymlink {
			t.Errorf("restore made a symlink: %s", e.Name)
		}
	}
	// Restored and unchanged, a link is not read again.
	third, err := snapshot.Create(ctx, s.ws, snapshot.Options{})
	must(t, err)
	if third.Files != second.Files {
		t.Errorf("snapshot after restore holds %d files, want %d", third.Files, second.Files)
	}
}

// TestRestoreSweepsKilledRestores: a restore killed on the way leaves its
// tree beside the scope directory (half built before the swap, the old
// one after it), outside every scope and account; the scope's next
// restore removes it, and leaves another scope's alone.
func TestRestoreSweepsKilledRestores(t *testing.T) {
	s := newScope(t)
	ctx := context.Background()
	s.write(t, "x.txt", []byte("x"))
	m, err := snapshot.Create(ctx, s.ws, snapshot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	other := store.Scope{Space: "sp", Agent: "ag", Session: "se", Run: "r1", Instance: "i1"}
	parent := filepath.Dir(s.dir)
	killed := filepath.Join(parent, store.RestorePrefix+s.sc.Hash()+"-0123456789abcdef")
	theirs := filepath.Join(parent, store.RestorePrefix+other.Hash()+"-0123456789abcdef")
	for _, d := range []string{killed, theirs} {
		if err := os.MkdirAll(filepath.Join(d, "src"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "src", "old.txt"), []byte("the old tree"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := snapshot.Restore(ctx, s.ws, m.ID, snapshot.RestoreOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(killed); !os.IsNotExist(err) {
		t.Errorf("a killed restore's tree is still beside the scope after the next restore (%v)", err)
	}
	if _, err := os.Stat(filepath.Join(theirs, "src", "old.txt")); err != nil {
		t.Errorf("another scope's restore tree was touched: %v", err)
	}
	ents, _ := os.ReadDir(parent)
	for _, e := range ents {
		if n := e.Name(); strings.HasPrefix(n, store.RestorePrefix) && filepath.Join(parent, n) != theirs {
			t.Errorf("%s is beside the scope after the restore", n)
		}
	}
}
