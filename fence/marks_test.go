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
	m, err := AddMarks(root, "a", time.Now(), map[string]int64{"a.ledger.jsonl": 100, "a.20250501.000001.jsonl": 50})
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
	if m, err = AddMarks(root, "a", time.Now(), map[string]int64{"a.ledger.jsonl": 130}); err != nil || m.Audit["a.ledger.jsonl"].Fenced != 100 || len(m.Fences) != 2 {
		t.Fatalf("fenced again: %+v %v", m, err)
	}
	m, err = Readmitted(root, "a", map[string]int64{"a.ledger.jsonl": 140, "a.20250501.000001.jsonl": 50, "a.20250501.000002.jsonl": 30})
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
