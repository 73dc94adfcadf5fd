package fork_test

import (
	"context"
	"slices"
	"testing"

	"github.com/agentloom/loomfs/fork"
)

// TestReadStatus checks what an agent in a fork sees of it: its base,
// what a merge would bring over, what changed in the source since, and
// the conflicts, from one read of its record.
func TestReadStatus(t *testing.T) {
	_, main, child := forked(t, nil)
	write(t, child, "src/a.go", "package a // the fork's\n")
	write(t, child, "src/b.go", "package b // the fork's\n")
	write(t, main, "src/b.go", "package b // main's\n")
	write(t, main, "logs/new.log", "later\n")
	st, err := fork.ReadStatus(context.Background(), child, main, 10)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := fork.ReadRecord(child.Volume(), child.Scope())
	if err != nil {
		t.Fatal(err)
	}
	if st.From != main.Scope().String() || st.Base != rec.Snapshot || !st.ForkedAt.Equal(rec.Created) {
		t.Errorf("status from %s, base %s at %v; want %s, %s at %v", st.From, st.Base, st.ForkedAt, main.Scope(), rec.Snapshot, rec.Created)
	}
	if len(st.Mergeable) != 1 || st.Mergeable[0].Path != "src/a.go" || st.Mergeable[0].Op != "write" {
		t.Errorf("mergeable %+v, want src/a.go written", st.Mergeable)
	}
	if len(st.Conflicts) != 1 || st.Conflicts[0].Path != "src/b.go" || st.Conflicts[0].Type != fork.BothModified {
		t.Errorf("conflicts %+v, want src/b.go both_modified", st.Conflicts)
	}
	if !slices.Contains(st.SourceChanged, "src/b.go") || !slices.Contains(st.SourceChanged, "logs/new.log") {
		t.Errorf("source changed %v, want src/b.go and logs/new.log", st.SourceChanged)
	}
}
