package audit

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentloom/loomfs/fence"
)

// TestFencedNodeLateRecords: what a fenced node still writes to its audit
// chain after its fence (a writer that was only paused, where the storage
// could not refuse it), in its open file and in files it starts, is
// skipped by readers and reported by Verify, which still checks those
// lines as links of the chain; the other node's records are untouched.
// After a re-admission the node's new records are read again, and the
// window of late ones stays closed where it was.
func TestFencedNodeLateRecords(t *testing.T) {
	root := t.TempDir()
	dir := Dir(root)
	write := func(node string, n int, what string, opts Options) {
		t.Helper()
		opts.Node = node
		l := openLog(t, root, opts)
		for i := range n {
			e := sampleEvent()
			e.Path = fmt.Sprintf("%s-%d", what, i)
			if err := l.Record(context.Background(), e); err != nil {
				t.Fatal(err)
			}
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
	paths := func(node string) (before, late, after int) {
		t.Helper()
		err := Query(dir, Filter{Node: node}, func(r Record) error {
			switch {
			case strings.HasPrefix(r.Path, "before"):
				before++
			case strings.HasPrefix(r.Path, "late"):
				late++
			case strings.HasPrefix(r.Path, "readmitted"):
				after++
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return
	}
	write("a", 5, "before", Options{})
	write("b", 3, "before", Options{})

	lengths, err := FenceLengths(dir, "a")
	if err != nil {
		t.Fatal(err)
	}
	if len(lengths) != 2 {
		t.Fatalf("node a's audit files at its fence: %v, want its chain file and its ledger", lengths)
	}
	if _, err := fence.AddMarks(root, "a", time.Now(), fence.Lengths{Audit: lengths}); err != nil {
		t.Fatal(err)
	}
	// Node a wakes up: a late writer appends to its chain, and one with
	// small files starts new ones.
	write("a", 4, "late", Options{})
	write("a", 20, "late", Options{MaxFileBytes: 2 << 10})
	write("b", 2, "after", Options{})

	if before, late, _ := paths("a"); before != 5 || late != 0 {
		t.Errorf("query of node a after its fence: %d records before, %d late; want 5 and 0", before, late)
	}
	if before, _, _ := paths("b"); before != 3 {
		t.Errorf("query of node b: %d records before the fence, want 3", before)
	}
	rep, err := Verify(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Fatalf("verify with node a's late records: %v", rep.Problems)
	}
	var fa *FencedNode
	for i := range rep.Fenced {
		if rep.Fenced[i].Node == "a" {
			fa = &rep.Fenced[i]
		}
	}
	// 24 events, and the checkpoints and ledger entries of three writers.
	if fa == nil || !fa.InForce || fa.LateRecords < 24 || len(fa.LateFiles) < 3 {
		t.Fatalf("verify's account of fenced node a: %+v; want its late lines in its ledger and chain files", fa)
	}
	said := false
	for _, w := range rep.Warnings {
		said = said || strings.Contains(w.Message, "node a was fenced") && strings.Contains(w.Message, fmt.Sprintf("%d lines", fa.LateRecords))
	}
	if !said || !strings.Contains(rep.String(), "after its fence") {
		t.Errorf("verify does not say what node a wrote after its fence: %s %v", rep, rep.Warnings)
	}
	if len(rep.Fenced) != 1 {
		t.Errorf("fenced nodes in the report: %+v, want a alone", rep.Fenced)
	}

	// Re-admitted (its old writers stopped): what it writes from then on
	// is read; what it wrote while fenced stays skipped.
	lengths, err = FenceLengths(dir, "a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fence.Readmitted(root, "a", fence.Lengths{Audit: lengths}); err != nil {
		t.Fatal(err)
	}
	write("a", 3, "readmitted", Options{})
	if before, late, after := paths("a"); before != 5 || late != 0 || after != 3 {
		t.Errorf("query of node a after its re-admission: %d before, %d late, %d after; want 5, 0, 3", before, late, after)
	}
	rep2, err := Verify(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !rep2.OK() || len(rep2.Fenced) != 1 || rep2.Fenced[0].InForce || rep2.Fenced[0].LateRecords != fa.LateRecords {
		t.Errorf("verify after the re-admission: %v %+v; want the same %d late lines, the fence no longer in force", rep2.Problems, rep2.Fenced, fa.LateRecords)
	}
}

// TestFenceLengthsNodeOnly: the marks of a node's fence cover its own
// files alone, and a volume with no audit directory has none.
func TestFenceLengthsNodeOnly(t *testing.T) {
	root := t.TempDir()
	if got, err := FenceLengths(Dir(root), "a"); err != nil || len(got) != 0 {
		t.Fatalf("no audit directory: %v %v", got, err)
	}
	for _, node := range []string{"a", "ab", "a.b", "b"} {
		l := openLog(t, root, Options{Node: node})
		if err := l.Record(context.Background(), sampleEvent()); err != nil {
			t.Fatal(err)
		}
		l.Close()
	}
	got, err := FenceLengths(Dir(root), "a")
	if err != nil {
		t.Fatal(err)
	}
	for name, size := range got {
		if p := parseName(name); p.w.node != "a" || size == 0 {
			t.Errorf("node a's marks hold %s (%d bytes)", name, size)
		}
		if _, err := os.Stat(filepath.Join(Dir(root), name)); err != nil {
			t.Error(err)
		}
	}
	if len(got) != 2 {
		t.Errorf("node a's files: %v, want 2", got)
	}
}

// TestFencedNodeLostTail: records a fenced node wrote before its fence but
// that never reached the storage (an evicted client's unflushed writes),
// while the ledger entry that names them did, are lost to the fence: a
// warning that says so, not a cut chain. A chain shortened after the
// fence, below its mark, is still a cut.
func TestFencedNodeLostTail(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cutAfter bool // cut the chain after the marks were taken
	}{
		{"records that never landed before the fence", false},
		{"a chain cut after the fence", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			dir := Dir(root)
			l := openLog(t, root, Options{Node: "a"})
			for i := range 5 {
				e := sampleEvent()
				e.Path = fmt.Sprintf("before-%d", i)
				if err := l.Record(context.Background(), e); err != nil {
					t.Fatal(err)
				}
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			cut := func() {
				t.Helper()
				files, err := filepath.Glob(filepath.Join(dir, "a.*.jsonl"))
				files = slices.DeleteFunc(files, func(f string) bool { return filepath.Base(f) == ledgerFileName("a") })
				if err != nil || len(files) == 0 {
					t.Fatalf("node a's chain files: %v %v", files, err)
				}
				chain := files[len(files)-1]
				data, err := os.ReadFile(chain)
				if err != nil {
					t.Fatal(err)
				}
				lines := strings.SplitAfter(strings.TrimSuffix(string(data), "\n"), "\n")
				// The close record and the last event.
				kept := strings.Join(lines[:len(lines)-2], "")
				if err := os.WriteFile(chain, []byte(kept), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if !tc.cutAfter {
				cut()
			}
			lengths, err := FenceLengths(dir, "a")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := fence.AddMarks(root, "a", time.Now(), fence.Lengths{Audit: lengths}); err != nil {
				t.Fatal(err)
			}
			if tc.cutAfter {
				cut()
			}
			rep, err := Verify(dir)
			if err != nil {
				t.Fatal(err)
			}
			if tc.cutAfter {
				if rep.OK() {
					t.Errorf("verify of a chain cut after its node's fence: %s; want a problem", rep)
				}
				return
			}
			if !rep.OK() {
				t.Fatalf("verify of records lost to the fence: %v; want warnings only", rep.Problems)
			}
			said := false
			for _, w := range rep.Warnings {
				said = said || strings.Contains(w.Message, "never reached the storage")
			}
			if !said {
				t.Errorf("verify does not say what the fence lost: %v", rep.Warnings)
			}
		})
	}
}
