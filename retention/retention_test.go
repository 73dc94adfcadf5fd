package retention_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentloom/loomfs/callrec"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/retention"
	"github.com/agentloom/loomfs/snapshot"
	"github.com/agentloom/loomfs/store"
)

// fakeClock is the clock ages are measured against in tests.
type fakeClock struct{ t time.Time }

func (c fakeClock) Now() time.Time { return c.t }

type volume struct {
	root string
	vol  *store.Volume
}

func newVolume(t *testing.T) *volume {
	t.Helper()
	root := t.TempDir()
	vol, err := store.OpenVolume(context.Background(), store.Config{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vol.Close() })
	return &volume{root: root, vol: vol}
}

// open opens scope s (creating it, and the standard layout) with a file in it.
func (v *volume) open(t *testing.T, s string) *store.Workspace {
	t.Helper()
	sc, err := store.ParseScope(s)
	if err != nil {
		t.Fatal(err)
	}
	pol, _ := policy.Preset("standard")
	ws, err := v.vol.Open(context.Background(), sc, pol)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	if _, err := ws.Mkdir(context.Background(), "src", true); err != nil {
		t.Fatal(err)
	}
	if _, err := ws.WriteFile(context.Background(), "src/a.txt", []byte("content of "+s), nil); err != nil {
		t.Fatal(err)
	}
	return ws
}

func (v *volume) exists(t *testing.T, s string) bool {
	t.Helper()
	sc, _ := store.ParseScope(s)
	_, err := os.Stat(filepath.Join(v.root, sc.Dir(), "src/a.txt"))
	return err == nil
}

func kept(rep *retention.Report, kind, scope, reasonPart string) bool {
	for _, it := range rep.Kept {
		if it.Kind == kind && it.Scope == scope && strings.Contains(it.Reason, reasonPart) {
			return true
		}
	}
	return false
}

func removedItem(rep *retention.Report, kind, scope, id string) bool {
	for _, it := range rep.Removed {
		if it.Kind == kind && it.Scope == scope && it.Snapshot == id {
			return true
		}
	}
	return false
}

// TestCollect is SPEC §6's retention: sessions and snapshots older than the
// limit are reclaimed unless pinned; a scope running a command, holding its
// lock or quarantined is never touched; a dry run removes nothing. Ages are
// faked through the clock.
func TestCollect(t *testing.T) {
	ctx := context.Background()
	v := newVolume(t)
	now := time.Now()

	old := v.open(t, "sp/ag/old")
	child := v.open(t, "sp/ag/old/run1/sub-1")
	_ = child
	v.open(t, "sp/ag/pinned")
	running := v.open(t, "sp/ag/running")
	locked := v.open(t, "sp/ag/locked")
	quarantined := v.open(t, "sp/ag/quarantined")

	if _, err := retention.PinItem(v.vol, store.Scope{Space: "sp", Agent: "ag", Session: "pinned"}, "", "keep for audit", now); err != nil {
		t.Fatal(err)
	}
	// A command runs in "running": its marker is present (its lock is
	// taken and released here; the marker alone must keep gc away).
	unlock, err := running.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := running.SetMarker(store.Marker{Container: "c-running", Node: "n1", Time: now}); err != nil {
		t.Fatal(err)
	}
	unlock()
	// Someone holds the lock of "locked".
	unlockHeld, err := locked.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer unlockHeld()
	if err := quarantined.Quarantine(store.Marker{Container: "c-q", Node: "n1", Time: now}, "test"); err != nil {
		t.Fatal(err)
	}

	// Snapshots of "running"'s neighbour: an old one, an old pinned one
	// and a recent one (created 5 days after now, so 3 days old below).
	snapWS := v.open(t, "sp/ag/snaps")
	s1, err := snapshot.Create(ctx, snapWS, snapshot.Options{Time: now})
	if err != nil {
		t.Fatal(err)
	}
	s2, err := snapshot.Create(ctx, snapWS, snapshot.Options{Time: now.Add(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	snapWS.WriteFile(ctx, "src/b.txt", []byte("only in the recent snapshot"), nil)
	s3, err := snapshot.Create(ctx, snapWS, snapshot.Options{Time: now.Add(5 * 24 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := retention.PinItem(v.vol, snapWS.Scope(), s2.ID, "", now); err != nil {
		t.Fatal(err)
	}
	// "snaps" itself stays in use: pin its session so only its snapshots
	// are at stake.
	if _, err := retention.PinItem(v.vol, snapWS.Scope(), "", "", now); err != nil {
		t.Fatal(err)
	}

	everything := []string{"sp/ag/old", "sp/ag/old/run1/sub-1", "sp/ag/pinned", "sp/ag/running", "sp/ag/locked", "sp/ag/quarantined", "sp/ag/snaps"}

	t.Run("younger than the limit: nothing is removed", func(t *testing.T) {
		rep, err := retention.Collect(ctx, v.vol, retention.Options{Clock: fakeClock{now.Add(3 * 24 * time.Hour)}})
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Removed) != 0 {
			t.Fatalf("removed %+v from a volume 3 days old", rep.Removed)
		}
	})

	clock := fakeClock{now.Add(8 * 24 * time.Hour)}
	t.Run("dry run lists and removes nothing", func(t *testing.T) {
		var progress bytes.Buffer
		rep, err := retention.Collect(ctx, v.vol, retention.Options{Clock: clock, DryRun: true, Progress: &progress})
		if err != nil {
			t.Fatal(err)
		}
		if !removedItem(rep, retention.KindSession, "sp/ag/old", "") || !removedItem(rep, retention.KindSnapshot, "sp/ag/snaps", s1.ID) {
			t.Fatalf("dry run does not list what it would remove: %+v", rep.Removed)
		}
		for _, s := range everything {
			if !v.exists(t, s) {
				t.Errorf("dry run removed %s", s)
			}
		}
		repo, _ := snapshot.OpenRepo(v.vol, snapWS.Scope(), false)
		ms, _ := repo.List()
		repo.Close()
		if len(ms) != 3 {
			t.Errorf("dry run removed snapshots: %d left", len(ms))
		}
		if !strings.Contains(progress.String(), "would be removed") {
			t.Errorf("dry run progress does not say so:\n%s", progress.String())
		}
	})

	t.Run("old sessions and snapshots go; pinned and busy stay", func(t *testing.T) {
		var progress bytes.Buffer
		rep, err := retention.Collect(ctx, v.vol, retention.Options{Clock: clock, Progress: &progress})
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Errors) > 0 {
			t.Fatalf("errors: %v", rep.Errors)
		}
		for _, gone := range []string{"sp/ag/old", "sp/ag/old/run1/sub-1"} {
			if v.exists(t, gone) {
				t.Errorf("%s, older than 7 days, was kept", gone)
			}
		}
		for _, stay := range []string{"sp/ag/pinned", "sp/ag/running", "sp/ag/locked", "sp/ag/quarantined", "sp/ag/snaps"} {
			if !v.exists(t, stay) {
				t.Errorf("%s was removed", stay)
			}
		}
		for scope, why := range map[string]string{
			"sp/ag/pinned":      "pinned",
			"sp/ag/running":     "command is running",
			"sp/ag/locked":      "lock is held",
			"sp/ag/quarantined": "quarantined",
		} {
			if !kept(rep, retention.KindSession, scope, why) {
				t.Errorf("%s not reported kept because %q: %+v", scope, why, rep.Kept)
			}
		}
		// gc never quarantines a scope whose marker it found.
		if err := running.CheckQuarantine(); err != nil {
			t.Errorf("gc quarantined the running scope: %v", err)
		}
		if !removedItem(rep, retention.KindSnapshot, "sp/ag/snaps", s1.ID) {
			t.Errorf("old snapshot %s not removed: %+v", s1.ID, rep.Removed)
		}
		repo, err := snapshot.OpenRepo(v.vol, snapWS.Scope(), false)
		if err != nil {
			t.Fatal(err)
		}
		defer repo.Close()
		ms, _ := repo.List()
		var ids []string
		for _, m := range ms {
			ids = append(ids, m.ID)
		}
		if len(ids) != 2 || ids[0] != s2.ID || ids[1] != s3.ID {
			t.Errorf("snapshots left %v, want the pinned %s and the recent %s", ids, s2.ID, s3.ID)
		}
		if _, err := snapshot.Restore(ctx, snapWS, s2.ID, snapshot.RestoreOptions{}); err != nil {
			t.Errorf("the pinned snapshot no longer restores: %v", err)
		}
		if !strings.Contains(progress.String(), "gc: sessions:") {
			t.Errorf("no progress lines:\n%s", progress.String())
		}
		_ = old
	})

	t.Run("unpinned, the session goes too", func(t *testing.T) {
		if err := retention.Unpin(v.vol, store.Scope{Space: "sp", Agent: "ag", Session: "pinned"}, ""); err != nil {
			t.Fatal(err)
		}
		if _, err := retention.Collect(ctx, v.vol, retention.Options{Clock: clock}); err != nil {
			t.Fatal(err)
		}
		if v.exists(t, "sp/ag/pinned") {
			t.Errorf("unpinned old session kept")
		}
	})
}

func TestPins(t *testing.T) {
	v := newVolume(t)
	ws := v.open(t, "sp/ag/s1/run1/sub-1")
	m, err := snapshot.Create(context.Background(), ws, snapshot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if _, err := retention.PinItem(v.vol, ws.Scope(), "", "session note", now); err != nil {
		t.Fatal(err)
	}
	if _, err := retention.PinItem(v.vol, ws.Scope(), m.ID, "", now); err != nil {
		t.Fatal(err)
	}
	if _, err := retention.PinItem(v.vol, ws.Scope(), "20990101T000000.000Z-000000", "", now); policy.CodeOf(err) != policy.NotFound {
		t.Errorf("pinning a missing snapshot: %v", err)
	}
	pins, err := retention.Pins(v.vol)
	if err != nil {
		t.Fatal(err)
	}
	// A child scope's session pin is the session's: kept with its main scope.
	if len(pins) != 2 || pins[0].Scope != "sp/ag/s1" || pins[0].Note != "session note" || pins[1].Scope != "sp/ag/s1/run1/sub-1" || pins[1].Snapshot != m.ID {
		t.Fatalf("pins %+v", pins)
	}
	if err := retention.Unpin(v.vol, ws.Scope(), m.ID); err != nil {
		t.Fatal(err)
	}
	if err := retention.Unpin(v.vol, ws.Scope(), m.ID); policy.CodeOf(err) != policy.NotFound {
		t.Errorf("unpinning twice: %v", err)
	}
}

// TestClearTemporary: at run end tmp/ is emptied (the directory stays),
// nothing else is touched, usage follows; refused while a command runs.
func TestClearTemporary(t *testing.T) {
	ctx := context.Background()
	v := newVolume(t)
	ws := v.open(t, "sp/ag/s1")
	for _, d := range []string{"tmp", "tmp/deep"} {
		if _, err := ws.Mkdir(ctx, d, true); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"tmp/x", "tmp/deep/y"} {
		if _, err := ws.WriteFile(ctx, f, []byte("12345"), nil); err != nil {
			t.Fatal(err)
		}
	}
	before, _ := ws.Usage(ctx)

	unlock, _ := ws.Lock(ctx)
	ws.SetMarker(store.Marker{Container: "c1", Time: time.Now()})
	_, err := retention.ClearTemporary(ctx, ws, retention.ClearOptions{})
	if policy.CodeOf(err) != policy.Conflict {
		t.Fatalf("clear during a command: %v", err)
	}
	ws.ClearMarker()
	unlock()

	u, err := retention.ClearTemporary(ctx, ws, retention.ClearOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if u.Files != 3 || u.Bytes != 10 {
		t.Errorf("cleared %+v, want 3 entries of 10 bytes", u)
	}
	dir := filepath.Join(v.root, ws.Scope().Dir())
	ents, err := os.ReadDir(filepath.Join(dir, "tmp"))
	if err != nil || len(ents) != 0 {
		t.Errorf("tmp/ after clearing: %v %v", ents, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "src/a.txt")); err != nil {
		t.Errorf("clearing tmp/ touched src/: %v", err)
	}
	after, _ := ws.Usage(ctx)
	if after.Bytes != before.Bytes-10 || after.Files != before.Files-3 {
		t.Errorf("usage %+v after clearing, want %+v less 10 bytes and 3 entries", after, before)
	}
}

// TestSweepTemporaries: gc removes the hidden temporary files an
// interrupted atomic write or health probe left behind once they are an
// hour old, and nothing else; a dry run only counts them.
func TestSweepTemporaries(t *testing.T) {
	ctx := context.Background()
	v := newVolume(t)
	v.open(t, "sp/ag/s")
	sc, _ := store.ParseScope("sp/ag/s")
	dir := filepath.Join(v.root, sc.Dir(), "src")
	leftover := filepath.Join(dir, policy.InternalPrefix+"tmp-0123456789abcdef")
	probe := filepath.Join(v.root, sc.Dir(), policy.ProbePrefix+"0123456789abcdef")
	other := filepath.Join(dir, policy.InternalPrefix+"other")
	link := filepath.Join(dir, policy.InternalPrefix+"tmp-link")
	if err := os.WriteFile(leftover, []byte("half a write"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(probe, []byte("loomfs probe 0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(other, []byte("x"), 0o600)
	os.Symlink("/etc/passwd", link)
	temps := func(rep *retention.Report) int {
		n := 0
		for _, it := range rep.Removed {
			if it.Kind == retention.KindTemporary {
				n++
			}
		}
		return n
	}

	// Young: left alone.
	rep, err := retention.Collect(ctx, v.vol, retention.Options{Clock: fakeClock{time.Now()}})
	if err != nil || temps(rep) != 0 {
		t.Fatalf("a fresh temporary file was swept: %+v %v", rep, err)
	}
	later := fakeClock{time.Now().Add(2 * time.Hour)}
	rep, err = retention.Collect(ctx, v.vol, retention.Options{Clock: later, DryRun: true})
	both := int64(len("half a write") + len("loomfs probe 0123456789abcdef\n"))
	if err != nil || temps(rep) != 1 || rep.Freed != both {
		t.Fatalf("dry run: %+v %v", rep, err)
	}
	if _, err := os.Stat(leftover); err != nil {
		t.Fatal("the dry run removed it")
	}
	rep, err = retention.Collect(ctx, v.vol, retention.Options{Clock: later})
	if err != nil || temps(rep) != 1 || rep.Freed != both {
		t.Fatalf("sweep: %+v %v", rep, err)
	}
	for _, gone := range []string{leftover, probe} {
		if _, err := os.Stat(gone); !os.IsNotExist(err) {
			t.Errorf("%s still there: %v", filepath.Base(gone), err)
		}
	}
	for _, keep := range []string{other, link, filepath.Join(dir, "a.txt")} {
		if _, err := os.Lstat(keep); err != nil {
			t.Errorf("%s was removed: %v", filepath.Base(keep), err)
		}
	}
}

// TestJournalsTrimmed: every process that changes a scope leaves a change
// journal; gc removes them once a scope has many, and a snapshot after
// that walks the scope instead of trusting journals it can no longer read.
func TestJournalsTrimmed(t *testing.T) {
	ctx := context.Background()
	v := newVolume(t)
	ws := v.open(t, "sp/ag/se")
	if _, err := snapshot.Create(ctx, ws, snapshot.Options{}); err != nil {
		t.Fatal(err)
	}
	ws.Close()
	// 70 processes each write a file and end.
	pol, _ := policy.Preset("standard")
	for i := range 70 {
		w, err := v.vol.Open(ctx, ws.Scope(), pol)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.WriteFile(ctx, "src/n"+strings.Repeat("x", i%5)+string(rune('a'+i%26)), []byte{byte(i)}, nil); err != nil {
			t.Fatal(err)
		}
		w.Close()
	}
	journals := func() int {
		fs, err := v.vol.JournalFiles(ws.Scope())
		if err != nil {
			t.Fatal(err)
		}
		return len(fs)
	}
	if n := journals(); n != 71 {
		t.Fatalf("%d journal files, want one per process (71)", n)
	}
	now := fakeClock{time.Now()}
	rep, err := retention.Collect(ctx, v.vol, retention.Options{Clock: now, MaxAge: time.Hour, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if n := journals(); n != 71 || !hasItem(rep.Removed, retention.KindJournal, "71 change journals") {
		t.Fatalf("dry run: %d journal files left, report %+v", n, rep.Removed)
	}
	rep, err = retention.Collect(ctx, v.vol, retention.Options{Clock: now, MaxAge: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if n := journals(); n != 0 || !hasItem(rep.Removed, retention.KindJournal, "71 change journals") {
		t.Fatalf("gc: %d journal files left, report %+v", n, rep.Removed)
	}
	w, err := v.vol.Open(ctx, ws.Scope(), pol)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	m, err := snapshot.Create(ctx, w, snapshot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if m.Walk != "full" || m.Files != 71 {
		t.Fatalf("snapshot after the trim: walk %q (%s), %d files; want a walk finding all 71", m.Walk, m.WalkReason, m.Files)
	}
}

func hasItem(items []retention.Item, kind, reason string) bool {
	for _, it := range items {
		if it.Kind == kind && strings.Contains(it.Reason, reason) {
			return true
		}
	}
	return false
}

// TestStateOfEndedSessions: the call records and the quota account of a
// session gc removes go with it, and nothing of them is left under the
// lock directory.
func TestStateOfEndedSessions(t *testing.T) {
	ctx := context.Background()
	v := newVolume(t)
	ws := v.open(t, "sp/ag/old")
	for i := range 3 {
		id := fmt.Sprintf("c-%d", i)
		if _, err := ws.BeginCall(context.Background(), id, "workspace_write", []byte("{}")); err != nil {
			t.Fatal(err)
		}
		if err := ws.FinishCall(id, "workspace_write", []byte("{}"), []byte(`{}`), nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ws.WriteFile(ctx, "a.txt", []byte("counted"), nil); err != nil {
		t.Fatal(err)
	}
	calls := filepath.Join(v.root, store.LocksDir, ws.Scope().Hash(), callrec.Dir)
	if ents, err := os.ReadDir(calls); err != nil || len(ents) == 0 {
		t.Fatalf("no call records before gc: %v, %v", ents, err)
	}
	account := filepath.Join(v.root, store.LocksDir, ws.Scope().Hash(), store.QuotaDir)
	if _, err := os.Stat(account); err != nil {
		t.Fatalf("no quota account before gc: %v", err)
	}
	ws.Close()
	if _, err := retention.Collect(ctx, v.vol, retention.Options{Clock: fakeClock{time.Now().Add(30 * 24 * time.Hour)}}); err != nil {
		t.Fatal(err)
	}
	if v.exists(t, "sp/ag/old") {
		t.Fatal("the old session was kept")
	}
	if _, err := os.Stat(calls); !os.IsNotExist(err) {
		t.Errorf("the call records of a removed session are still there: %v", err)
	}
	if _, err := os.Stat(account); !os.IsNotExist(err) {
		t.Errorf("the quota account of a removed session is still there: %v", err)
	}
}
