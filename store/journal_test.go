package store_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agentloom/loomfs/policy"
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
	if got := fs[0].Changes; !slices.Equal(got, want) {
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
	if !slices.Equal(again[0].Changes, []store.JournalChange{{Path: "c"}}) {
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
	if !strings.HasSuffix(string(b), "t \"odd\\tname\"\nc c\nend\n") {
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
