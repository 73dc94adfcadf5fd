package fusefs

import (
	"slices"
	"testing"

	"github.com/agentloom/loomfs/store"
)

// TestJournalNotesEveryChange: every change a program makes through the
// mount is in the scope's change journal by the time the program has
// finished (no sleep: a file written is noted when it is opened, and the
// release, which comes after close(2), ends its open in the journal), a
// moved directory with everything in it. Reads note nothing.
func TestJournalNotesEveryChange(t *testing.T) {
	e := newEnv(t)
	mustWrite(t, e.host("d/old"), "x")
	mustWrite(t, e.host("keep"), "x")
	c := func(p string) store.JournalChange { return store.JournalChange{Path: p} }
	tree := func(p string) store.JournalChange { return store.JournalChange{Path: p, Subtree: true} }
	cases := []struct {
		cmd  string
		want []store.JournalChange
	}{
		{"cat keep d/old >/dev/null; ls -R >/dev/null", nil},
		{"printf new > f", []store.JournalChange{c("f")}},
		{"printf more >> f", []store.JournalChange{c("f")}},
		{"exec 3>>keep; printf a >&3; printf b >&3; exec 3>&-", []store.JournalChange{c("keep")}},
		{"truncate -s 1 f", []store.JournalChange{c("f")}},
		{"chmod 0400 f", []store.JournalChange{c("f")}},
		{"touch -d 2001-01-01 keep", []store.JournalChange{c("keep")}},
		{"mkdir e", []store.JournalChange{c("e")}},
		{"mv f e/g", []store.JournalChange{c("f"), c("e/g")}},
		{"mv d moved", []store.JournalChange{tree("d"), tree("moved")}},
		{"rm moved/old", []store.JournalChange{c("moved/old")}},
		{"rmdir moved", []store.JournalChange{c("moved")}},
		{"fallocate -l 100 e/g", []store.JournalChange{c("e/g")}},
	}
	var cursor map[string]int64
	read := func() ([]store.JournalChange, map[string]int64) {
		t.Helper()
		files, err := e.ws.ReadJournal(cursor)
		if err != nil {
			t.Fatal(err)
		}
		var got []store.JournalChange
		next := map[string]int64{}
		for _, f := range files {
			for _, c := range f.Changes {
				// What a snapshot reads: the path, and whether a subtree.
				got = append(got, store.JournalChange{Path: c.Path, Subtree: c.Subtree})
			}
			next[f.Name] = f.Size
		}
		return slices.Compact(got), next
	}
	for _, tc := range cases {
		if out, err := runIn(t, e.mnt, tc.cmd); err != nil {
			t.Fatalf("%s: %v\n%s", tc.cmd, err, out)
		}
		got, _ := read()
		for _, w := range tc.want {
			if !slices.Contains(got, w) {
				t.Errorf("%s: %+v is not in the journal when the command has finished: %+v", tc.cmd, w, got)
			}
		}
		// Once the kernel has released the files the command opened,
		// the journal holds exactly its changes, and a reader moves past
		// them.
		waitReleased(t, e.m)
		got, cursor = read()
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: journal has %+v, want %+v", tc.cmd, got, tc.want)
		}
	}
}

// TestJournalSaysWhat: each line says what the change was, that the
// projection made it, and for which command's call; a rename names both
// paths, once each.
func TestJournalSaysWhat(t *testing.T) {
	e := newEnv(t, withOptions(func(o *Options) { o.CallID = "cmd-7" }))
	mustWrite(t, e.host("old"), "x")
	type line struct {
		kind     byte
		op, path string
		to, from string
	}
	cases := []struct {
		cmd  string
		want []line
	}{
		{"printf new > f", []line{{'o', store.OpCreate, "f", "", ""}, {'x', store.OpWrite, "f", "", ""}}},
		{"mkdir d", []line{{'c', store.OpMkdir, "d", "", ""}}},
		{"chmod 0400 f", []line{{'c', store.OpSetattr, "f", "", ""}}},
		{"mv f d/g", []line{{'c', store.OpRename, "f", "d/g", ""}, {'c', store.OpRename, "d/g", "", "f"}}},
		{"rm old", []line{{'c', store.OpDelete, "old", "", ""}}},
		// Removed while still open: the delete has its line, though the
		// open's end covers the file for a snapshot.
		{"exec 3>h; rm h; exec 3>&-", []line{{'o', store.OpCreate, "h", "", ""}, {'c', store.OpDelete, "h", "", ""}, {'x', store.OpWrite, "h", "", ""}}},
	}
	var cursor map[string]int64
	for _, tc := range cases {
		if out, err := runIn(t, e.mnt, tc.cmd); err != nil {
			t.Fatalf("%s: %v\n%s", tc.cmd, err, out)
		}
		waitReleased(t, e.m)
		files, err := e.ws.ReadJournal(cursor)
		if err != nil {
			t.Fatal(err)
		}
		var got []line
		cursor = map[string]int64{}
		for _, f := range files {
			for _, c := range f.Changes {
				got = append(got, line{c.Kind, c.Op, c.Path, c.To, c.From})
				if c.Source != store.SourceProjection || c.Call != "cmd-7" || c.Time == 0 {
					t.Errorf("%s: %s line of %s says source %q call %q time %d", tc.cmd, string(c.Kind), c.Path, c.Source, c.Call, c.Time)
				}
			}
			cursor[f.Name] = f.End
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: lines %+v, want %+v", tc.cmd, got, tc.want)
		}
	}
}
