package fusefs

import (
	"slices"
	"testing"

	"github.com/agentloom/loomfs/store"
)

// TestJournalNotesEveryChange: every change a program makes through the
// mount is in the scope's change journal by the time the program has
// finished (no sleep: close(2) waits for the FLUSH that notes a written
// file), a moved directory with everything in it. Reads note nothing.
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
	for _, tc := range cases {
		if out, err := runIn(t, e.mnt, tc.cmd); err != nil {
			t.Fatalf("%s: %v\n%s", tc.cmd, err, out)
		}
		files, err := e.ws.ReadJournal(cursor)
		if err != nil {
			t.Fatal(err)
		}
		var got []store.JournalChange
		cursor = map[string]int64{}
		for _, f := range files {
			got = append(got, f.Changes...)
			cursor[f.Name] = f.Size
		}
		got = slices.Compact(got)
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: journal has %+v, want %+v", tc.cmd, got, tc.want)
		}
	}
}
