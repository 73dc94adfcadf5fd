package store_test

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/snapshot"
	"github.com/agentloom/loomfs/store"
)

// TestJournal: each change through the store is a line in the process's
// journal, written after the change; a reader picks up from an offset;
// the writer holds its file until Close, which ends it.
func TestJournal(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	root, vol := e.root, e.vol
	sc := store.Scope{Space: "sp", Agent: "ag", Session: "se"}
	ws := e.open(t, sc, nil)
	if fs, err := ws.ReadJournal(nil); err != nil || len(fs) != 0 {
		t.Fatalf("before any change: %v %v", fs, err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	_, err := ws.Mkdir(ctx, "d", false)
	must(err)
	_, err = ws.WriteFile(ctx, "d/a b", []byte("x"), nil)
	must(err)
	must(ws.Remove(ctx, "d/a b", nil))
	ws.NoteChange("odd\tname", true)

	fs, err := ws.ReadJournal(nil)
	must(err)
	if len(fs) != 1 || !fs[0].Live || fs[0].Ended {
		t.Fatalf("one live journal expected: %+v", fs)
	}
	want := []store.JournalChange{{Path: "d"}, {Path: "d/a b"}, {Path: "d/a b"}, {Path: "odd\tname", Subtree: true}}
	if got := fs[0].Changes; !slices.Equal(journalPaths(got), want) {
		t.Fatalf("changes %+v, want %+v", got, want)
	}
	// From the offset read, nothing new; then only what follows.
	cursor := map[string]int64{fs[0].Name: fs[0].Size}
	again, err := ws.ReadJournal(cursor)
	must(err)
	if len(again[0].Changes) != 0 {
		t.Fatalf("read again past the cursor: %+v", again[0].Changes)
	}
	_, err = ws.WriteFile(ctx, "c", []byte("y"), nil)
	must(err)
	again, err = ws.ReadJournal(cursor)
	must(err)
	if !slices.Equal(journalPaths(again[0].Changes), []store.JournalChange{{Path: "c"}}) {
		t.Fatalf("after the cursor: %+v", again[0].Changes)
	}

	// Close ends the file and lets it go; nothing is noted after.
	must(ws.Close())
	ws.NoteChange("late", false)
	after, err := vol.JournalFiles(sc)
	must(err)
	if len(after) != 1 || after[0].Live {
		t.Fatalf("after Close: %+v", after)
	}
	ended, err := vol.JournalFiles(sc)
	must(err)
	dir := filepath.Join(root, store.LocksDir, sc.Hash(), store.JournalDir)
	b, err := os.ReadFile(filepath.Join(dir, ended[0].Name))
	must(err)
	if !regexp.MustCompile(`t "odd\\tname"\t\{"ts":\d+\}\nc c\t\{"op":"create","ts":\d+\}\nend\n$`).Match(b) {
		t.Fatalf("journal file ends %q", b)
	}

	// A cursor past a file's end, or naming a file gone, is refused: the
	// changes it held are lost to the reader.
	ws2 := e.open(t, sc, nil)
	if _, err := ws2.ReadJournal(map[string]int64{ended[0].Name: int64(len(b)) + 1}); !errors.Is(err, store.ErrJournalGone) {
		t.Errorf("cursor past the end: %v", err)
	}
	must(vol.RemoveJournal(sc, ended[0].Name))
	if _, err := ws2.ReadJournal(map[string]int64{ended[0].Name: 3}); !errors.Is(err, store.ErrJournalGone) {
		t.Errorf("cursor naming a removed file: %v", err)
	}
	// A damaged line is an error, not a silent skip.
	must(os.WriteFile(filepath.Join(dir, "x.1.00.log"), []byte("c ok\nwhat is this\n"), 0o600))
	if _, err := ws2.ReadJournal(nil); err == nil || !strings.Contains(err.Error(), "malformed") {
		t.Errorf("damaged journal read: %v", err)
	}
}

// TestJournalOpens: an open for writing is noted when it is made and when
// it ends; while it is going, the offset a reader is given stays at its o
// line, so every read looks at the file again (the writes in between are
// not noted, nor other changes to its file). A new file carries the opens
// still going over, at the path their file has now.
func TestJournalOpens(t *testing.T) {
	e := newEnv(t)
	sc := store.Scope{Space: "sp", Agent: "ag", Session: "se"}
	ws := e.open(t, sc, nil)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	read := func(from map[string]int64) []store.JournalFile {
		t.Helper()
		fs, err := ws.ReadJournal(from)
		must(err)
		return fs
	}
	must(ws.ReadyToChange())
	ws.NoteChange("before", false)
	path := "a"
	open := ws.NoteOpen(func() string { return path })
	ws.NoteChange("after", false)
	ws.NoteChangeBy("a", false, store.Change{Op: store.OpSetattr}) // its writer setting its times (tar): covered, no line

	fs := read(nil)
	held := fs[0].Size
	if want := int64(len(firstLine(t, ws, fs[0].Name))); held != want {
		t.Fatalf("offset %d with an open going, want %d (its o line)", held, want)
	}
	cursor := map[string]int64{fs[0].Name: held}
	again := read(cursor)
	want := []store.JournalChange{{Path: "a"}, {Path: "after"}}
	if !slices.Equal(journalPaths(again[0].Changes), want) || again[0].Size != held {
		t.Fatalf("read again from the held offset: %+v at %d, want %+v at %d", again[0].Changes, again[0].Size, want, held)
	}

	// Renamed while open; the journal rotates: the new file starts with
	// the open, at its new path, and the old one, ended, is read to its
	// end.
	path = "b"
	store.RotateJournalAt(t, 1)
	ws.NoteChange("rotated", false)
	fs = read(cursor)
	if len(fs) != 2 {
		t.Fatalf("after a rotation: %+v", fs)
	}
	var old, cur store.JournalFile
	for _, f := range fs {
		if f.Name == again[0].Name {
			old = f
		} else {
			cur = f
		}
	}
	if !old.Ended || old.Size == held {
		t.Errorf("the rotated file: %+v, want ended and read to its end", old)
	}
	if want := []store.JournalChange{{Path: "b"}, {Path: "rotated"}}; !slices.Equal(journalPaths(cur.Changes), want) || cur.Size != 0 {
		t.Fatalf("the new file: %+v at %d, want %+v held at 0", cur.Changes, cur.Size, want)
	}

	// The open ends: read past it at last.
	store.RotateJournalAt(t, 1<<20)
	ws.NoteClose(open)
	ws.NoteClose(open) // a second close notes nothing
	cursor = map[string]int64{old.Name: old.Size, cur.Name: cur.Size}
	fs = read(cursor)
	for _, f := range fs {
		if f.Name != cur.Name {
			continue
		}
		if want := []store.JournalChange{{Path: "b"}, {Path: "rotated"}, {Path: "b"}}; !slices.Equal(journalPaths(f.Changes), want) {
			t.Fatalf("after the close: %+v, want %+v", f.Changes, want)
		}
		b, err := os.ReadFile(filepath.Join(e.root, store.LocksDir, sc.Hash(), store.JournalDir, f.Name))
		must(err)
		if f.Size != int64(len(b)) {
			t.Fatalf("offset %d after the close, want the end %d", f.Size, len(b))
		}
	}
}

// TestNoJournalNoChange: when the change journal can't be written, a
// change is refused before it is made, so no snapshot can miss it.
func TestNoJournalNoChange(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	root := e.root
	sc := store.Scope{Space: "sp", Agent: "ag", Session: "se"}
	ws := e.open(t, sc, nil)
	// Something that is not a directory where the journals go.
	if err := os.WriteFile(filepath.Join(root, store.LocksDir, sc.Hash(), store.JournalDir), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := ws.WriteFile(ctx, "a", []byte("x"), nil)
	if policy.CodeOf(err) != policy.VolumeUnavailable || !strings.Contains(err.Error(), "change journal") {
		t.Fatalf("write without a journal: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(root, sc.Dir(), "a")); !os.IsNotExist(err) {
		t.Fatalf("the refused write was made: %v", err)
	}
	if _, err := ws.Mkdir(ctx, "d", false); policy.CodeOf(err) != policy.VolumeUnavailable {
		t.Fatalf("mkdir without a journal: %v", err)
	}
}

// journalPaths keeps what a snapshot reads of each change: its path and whether
// it covers a subtree.
func journalPaths(cs []store.JournalChange) []store.JournalChange {
	out := make([]store.JournalChange, len(cs))
	for i, c := range cs {
		out[i] = store.JournalChange{Path: c.Path, Subtree: c.Subtree}
	}
	return out
}

// firstLine is the first line of journal file name, with its newline.
func firstLine(t *testing.T, ws *store.Workspace, name string) string {
	t.Helper()
	fs, err := ws.ReadJournal(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fs {
		if f.Name == name && len(f.Changes) > 0 {
			return strings.Repeat("x", int(f.Changes[0].End))
		}
	}
	t.Fatalf("journal %s has no lines", name)
	return ""
}

// TestJournalDetail: a line says what the change was and who made it
// after a tab, for the change feed; a line of an older writer, without
// it, is read as before.
func TestJournalDetail(t *testing.T) {
	e := newEnv(t)
	sc := store.Scope{Space: "sp", Agent: "ag", Session: "se"}
	ws := e.open(t, sc, nil)
	if err := ws.ReadyToChange(); err != nil {
		t.Fatal(err)
	}
	ws.NoteChangeBy("d", true, store.Change{Op: store.OpRename, To: "e", Source: store.SourceProjection, Call: "call-1"})
	ws.NoteChangeBy("e", true, store.Change{Op: store.OpRename, From: "d", Source: store.SourceProjection, Call: "call-1"})
	if _, err := ws.WriteFile(store.WithChange(context.Background(), store.Change{Source: store.SourceTool, Call: "call-2"}), "f", []byte("x"), nil); err != nil {
		t.Fatal(err)
	}
	fs, err := ws.ReadJournal(nil)
	if err != nil || len(fs) != 1 {
		t.Fatalf("ReadJournal: %v %+v", err, fs)
	}
	cs := fs[0].Changes
	if len(cs) != 3 {
		t.Fatalf("changes %+v", cs)
	}
	for i, want := range []store.Change{
		{Op: store.OpRename, To: "e", Source: store.SourceProjection, Call: "call-1"},
		{Op: store.OpRename, From: "d", Source: store.SourceProjection, Call: "call-1"},
		{Op: store.OpCreate, Source: store.SourceTool, Call: "call-2"},
	} {
		got := cs[i].Change
		if got.Time == 0 {
			t.Errorf("change %d has no time", i)
		}
		got.Time = 0
		if got != want {
			t.Errorf("change %d: %+v, want %+v", i, got, want)
		}
	}
	if cs[2].End != fs[0].End {
		t.Errorf("last line ends at %d, file read to %d", cs[2].End, fs[0].End)
	}
	node, pid := store.JournalWriter(fs[0].Name)
	if node == "" || pid != os.Getpid() {
		t.Errorf("writer of %s: %q %d", fs[0].Name, node, pid)
	}

	dir := filepath.Join(e.root, store.LocksDir, sc.Hash(), store.JournalDir)
	if err := os.WriteFile(filepath.Join(dir, "old.1.00.log"), []byte("c plain\nt tree\nend\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fs, err = ws.ReadJournal(map[string]int64{fs[0].Name: fs[0].End})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fs {
		if f.Name == "old.1.00.log" && !slices.Equal(journalPaths(f.Changes), []store.JournalChange{{Path: "plain"}, {Path: "tree", Subtree: true}}) {
			t.Errorf("an older writer's lines: %+v", f.Changes)
		}
	}
}

// TestJournalOpenCoversItsWriter: while a file is open for writing, its
// writer's change of its attributes needs no line (the open covers it),
// but anyone else's change, and any other kind of change, keeps its line
// for the change feed.
func TestJournalOpenCoversItsWriter(t *testing.T) {
	e := newEnv(t)
	sc := store.Scope{Space: "sp", Agent: "ag", Session: "se"}
	ws := e.open(t, sc, nil)
	if err := ws.ReadyToChange(); err != nil {
		t.Fatal(err)
	}
	mine := store.Change{Source: store.SourceProjection, Call: "call-1"}
	open := ws.NoteOpenBy(func() string { return "f" }, store.Change{Op: store.OpCreate, Source: mine.Source, Call: mine.Call})
	cases := []struct {
		name string
		c    store.Change
		line bool
	}{
		{"its writer sets its times", store.Change{Op: store.OpSetattr, Source: mine.Source, Call: mine.Call}, false},
		{"another call sets its times", store.Change{Op: store.OpSetattr, Source: mine.Source, Call: "call-2"}, true},
		{"a tool sets its mode", store.Change{Op: store.OpSetattr, Source: store.SourceTool}, true},
		{"its writer deletes it", store.Change{Op: store.OpDelete, Source: mine.Source, Call: mine.Call}, true},
	}
	var want []store.Change
	want = append(want, store.Change{Op: store.OpCreate, Source: mine.Source, Call: mine.Call})
	for _, tc := range cases {
		ws.NoteChangeBy("f", false, tc.c)
		if tc.line {
			want = append(want, tc.c)
		}
	}
	ws.NoteClose(open)
	want = append(want, store.Change{Op: store.OpWrite, Source: mine.Source, Call: mine.Call})
	fs, err := ws.ReadJournal(nil)
	if err != nil || len(fs) != 1 {
		t.Fatalf("ReadJournal: %v %+v", err, fs)
	}
	var got []store.Change
	for _, c := range fs[0].Changes {
		c.Change.Time = 0
		got = append(got, c.Change)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("lines %+v\nwant  %+v", got, want)
	}
}

// TestJournalOpenWaitsForNextLine: the lines of an open (its o line and
// its x line) go out with the next line, in one write, or on their own a
// little later; a reader in the same process finds them at once, and
// JournalFiles gives the size of this process's file as it is on disk
// without opening it.
func TestJournalOpenWaitsForNextLine(t *testing.T) {
	e := newEnv(t)
	sc := store.Scope{Space: "sp", Agent: "ag", Session: "se"}
	ws := e.open(t, sc, nil)
	if err := ws.ReadyToChange(); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(e.root, store.LocksDir, sc.Hash(), store.JournalDir)
	onDisk := func() string {
		t.Helper()
		files, err := filepath.Glob(filepath.Join(dir, "*.log"))
		if err != nil || len(files) != 1 {
			t.Fatalf("journal files %v: %v", files, err)
		}
		b, err := os.ReadFile(files[0])
		if err != nil {
			t.Fatal(err)
		}
		var kinds []string
		for _, l := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
			if l != "" {
				kinds = append(kinds, strings.SplitN(l, "\t", 2)[0])
			}
		}
		return strings.Join(kinds, ",")
	}
	store.LingerJournalOpens(t, time.Hour)
	a := ws.NoteOpen(func() string { return "a" })
	if got := onDisk(); got != "" {
		t.Fatalf("after the open: %q, want its o line held back", got)
	}
	ws.NoteClose(a)
	if got := onDisk(); got != "" {
		t.Fatalf("after the close: %q, want both lines held back", got)
	}
	ws.NoteChange("b", false)
	if got := onDisk(); got != "o a,x a,c b" {
		t.Fatalf("after the next change: %q, want the open's lines first", got)
	}

	c := ws.NoteOpen(func() string { return "c" })
	ws.NoteClose(c)
	fs, err := ws.ReadJournal(nil)
	if err != nil || len(fs) != 1 || len(fs[0].Changes) != 5 || fs[0].Changes[4].Kind != 'x' {
		t.Fatalf("a reader in this process: %+v %v, want the x line of c read", fs, err)
	}
	files, err := ws.JournalFiles()
	if err != nil || len(files) != 1 || !files[0].Live {
		t.Fatalf("JournalFiles: %+v %v", files, err)
	}
	st, err := os.Stat(filepath.Join(dir, files[0].Name))
	if err != nil || st.Size() != files[0].Size {
		t.Fatalf("JournalFiles says %d bytes, the file has %v (%v)", files[0].Size, st.Size(), err)
	}

	store.LingerJournalOpens(t, time.Millisecond)
	d := ws.NoteOpen(func() string { return "d" })
	ws.NoteClose(d)
	deadline := time.Now().Add(5 * time.Second)
	for onDisk() != "o a,x a,c b,o c,x c,o d,x d" {
		if time.Now().After(deadline) {
			t.Fatalf("the lone open's lines were never written: %q", onDisk())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestSnapshotAfterAnOpenJustNoted: a snapshot taken, as by another
// process, right after a mount created a file finds it, although the
// open's line is still waiting to be written: the snapshot reads the
// journals only once store.JournalLag has passed since it began.
func TestSnapshotAfterAnOpenJustNoted(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	store.LingerJournalOpens(t, 300*time.Millisecond)
	mount := e.open(t, mainScope, nil)
	admin := e.openAnew(t, mainScope)
	first, err := snapshot.Create(ctx, admin, snapshot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := mount.ReadyToChange(); err != nil {
		t.Fatal(err)
	}
	mkfile(t, filepath.Join(e.dir(mainScope), "new"), "made through the mount")
	o := mount.NoteOpen(func() string { return "new" })
	t.Cleanup(func() { mount.NoteClose(o) })
	m, err := snapshot.Create(ctx, admin, snapshot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if m.Walk != "journal" || m.Files != first.Files+1 {
		t.Fatalf("snapshot right after the open: walk %q, %d files, want the journal's and %d", m.Walk, m.Files, first.Files+1)
	}
}

// TestJournalEndedSettled: a journal file its writer ended is trusted by a
// reader whose cursor is at its end, and, once read to its end line, is
// not opened again by the same Workspace; a file whose writer died
// without ending it is looked at every time, and never trusted.
func TestJournalEndedSettled(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	sc := store.Scope{Space: "sp", Agent: "ag", Session: "se"}
	writer := e.open(t, sc, nil)
	if _, err := writer.WriteFile(ctx, "a", []byte("x"), nil); err != nil {
		t.Fatal(err)
	}
	if err := writer.Close(); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(e.root, store.LocksDir, sc.Hash(), store.JournalDir)
	const dead = "dead.1.000000.log"
	if err := os.WriteFile(filepath.Join(dir, dead), []byte("c b\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	reader := e.open(t, sc, nil)
	files, err := reader.ReadJournal(nil)
	if err != nil || len(files) != 2 {
		t.Fatalf("first read: %+v %v", files, err)
	}
	cursor := map[string]int64{}
	var ended string
	for _, f := range files {
		cursor[f.Name] = f.End
		if f.Name != dead {
			ended = f.Name
		}
	}
	trusted := func(files []store.JournalFile) map[string]bool {
		m := map[string]bool{}
		for _, f := range files {
			m[f.Name] = f.Trusted()
		}
		return m
	}
	want := map[string]bool{ended: true, dead: false}

	// A reader of its own (nothing kept) at the end of each file.
	fresh := e.open(t, sc, nil)
	again, err := fresh.ReadJournal(cursor)
	if err != nil || !maps.Equal(trusted(again), want) {
		t.Fatalf("read at the files' ends: %+v %v, want trusted %v", again, err, want)
	}

	// The reader that read them: the ended file is not opened again.
	before := store.JournalFileOpens()
	sizes, err := reader.JournalFiles()
	if err != nil || len(sizes) != 2 {
		t.Fatalf("sizes: %+v %v", sizes, err)
	}
	again, err = reader.ReadJournal(cursor)
	if err != nil || !maps.Equal(trusted(again), want) {
		t.Fatalf("read again: %+v %v, want trusted %v", again, err, want)
	}
	if opened := store.JournalFileOpens() - before; opened != 2 {
		t.Errorf("%d journal files opened to describe and read two, one ended: want 2 (the dead one's)", opened)
	}

	// Removed, it is gone from the reader's view too.
	if err := e.vol.RemoveJournal(sc, ended); err != nil {
		t.Fatal(err)
	}
	if sizes, err := reader.JournalFiles(); err != nil || len(sizes) != 1 || sizes[0].Name != dead {
		t.Errorf("after the ended file's removal: %+v %v", sizes, err)
	}
	if _, err := reader.ReadJournal(cursor); !errors.Is(err, store.ErrJournalGone) {
		t.Errorf("a cursor naming the removed file: %v", err)
	}
}
