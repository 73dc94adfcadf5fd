package fence

import (
	"testing"
	"time"
)

// TestMarksWindow: the bytes of a fenced node's file past its length at
// the fence are late until a re-admission closes the window; a file the
// fence did not see is late while the fence is in force, and one made
// after the re-admission is not.
func TestMarksWindow(t *testing.T) {
	root := t.TempDir()
	m, err := AddMarks(root, "a", time.Now(), Lengths{Audit: map[string]int64{"a.ledger.jsonl": 100, "a.20250501.000001.jsonl": 50}})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name     string
		off, end int64
		late     bool
	}{
		{"a.ledger.jsonl", 0, 100, false},
		{"a.ledger.jsonl", 90, 110, true},
		{"a.ledger.jsonl", 100, 120, true},
		{"a.20250501.000001.jsonl", 0, 50, false},
		{"a.20250501.000002.jsonl", 0, 10, true},
	}
	for _, c := range cases {
		if got := m.Late(c.name, c.off, c.end); got != c.late {
			t.Errorf("fenced: %s [%d,%d) late %v, want %v", c.name, c.off, c.end, got, c.late)
		}
	}
	// Another fence of the node keeps the first one's marks.
	if m, err = AddMarks(root, "a", time.Now(), Lengths{Audit: map[string]int64{"a.ledger.jsonl": 130}}); err != nil || m.Audit["a.ledger.jsonl"].Fenced != 100 || len(m.Fences) != 2 {
		t.Fatalf("fenced again: %+v %v", m, err)
	}
	m, err = Readmitted(root, "a", Lengths{Audit: map[string]int64{"a.ledger.jsonl": 140, "a.20250501.000001.jsonl": 50, "a.20250501.000002.jsonl": 30}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name     string
		off, end int64
		late     bool
	}{
		{"a.ledger.jsonl", 0, 100, false},
		{"a.ledger.jsonl", 100, 140, true},
		{"a.ledger.jsonl", 140, 160, false},
		{"a.20250501.000001.jsonl", 50, 60, false}, // nothing late in it
		{"a.20250501.000002.jsonl", 0, 30, true},
		{"a.20250501.000002.jsonl", 30, 40, false},
		{"a.20250501.000003.jsonl", 0, 10, false},
	} {
		if got := m.Late(c.name, c.off, c.end); got != c.late {
			t.Errorf("re-admitted: %s [%d,%d) late %v, want %v", c.name, c.off, c.end, got, c.late)
		}
	}
	all, err := AllMarks(root)
	if err != nil || len(all) != 1 || all["a"] == nil || all["a"].InForce {
		t.Errorf("AllMarks: %v %v", all, err)
	}
	if _, err := Read(root, "a"); err == nil {
		t.Error("the marks were read as a fence record")
	}
}

// TestMarksOfScopeRecords: journal files and call logs are marked by
// their key as audit files are, each kind apart from the others; a marker
// is late only in a scope the fence did not see one in, while the fence
// is in force, and a later fence after a re-admission starts the list
// anew.
func TestMarksOfScopeRecords(t *testing.T) {
	root := t.TempDir()
	j, c := ScopeFile("h1", "a.1.x.log"), ScopeFile("h1", "k.log")
	m, err := AddMarks(root, "a", time.Now(), Lengths{
		Journals: map[string]int64{j: 10},
		Calls:    map[string]int64{c: 20},
		Markers:  []string{"h1"},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		what string
		got  bool
		want bool
	}{
		{"journal line before its mark", m.LateJournal(j, 0, 10), false},
		{"journal line past its mark", m.LateJournal(j, 10, 15), true},
		{"journal file made after the fence", m.LateJournal(ScopeFile("h2", "a.2.y.log"), 0, 5), true},
		{"call line before its mark", m.LateCall(c, 10, 20), false},
		{"call line past its mark", m.LateCall(c, 20, 30), true},
		{"a call log's mark is not a journal's", m.LateJournal(c, 0, 5), true},
		{"marker the fence saw", m.LateMarker("h1"), false},
		{"marker the fence did not see", m.LateMarker("h2"), true},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: late %v, want %v", tc.what, tc.got, tc.want)
		}
	}
	m, err = Readmitted(root, "a", Lengths{Journals: map[string]int64{j: 15}, Calls: map[string]int64{c: 30, ScopeFile("h3", "n.log"): 7}})
	if err != nil {
		t.Fatal(err)
	}
	if !m.LateCall(c, 20, 30) || m.LateCall(c, 30, 40) || !m.LateCall(ScopeFile("h3", "n.log"), 0, 7) || m.LateCall(ScopeFile("h4", "o.log"), 0, 9) {
		t.Errorf("call windows after the re-admission: %+v", m.Calls)
	}
	if m.LateMarker("h2") {
		t.Error("a marker is late after the re-admission")
	}
	if m, err = AddMarks(root, "a", time.Now(), Lengths{Markers: []string{"h2"}}); err != nil || !m.LateMarker("h1") || m.LateMarker("h2") {
		t.Errorf("fenced again: markers %v, %v; want only h2's seen", m.Markers, err)
	}
	var nilMarks *Marks
	if nilMarks.LateJournal(j, 0, 1) || nilMarks.LateCall(c, 0, 1) || nilMarks.LateMarker("h1") {
		t.Error("a node never fenced has late records")
	}
}
