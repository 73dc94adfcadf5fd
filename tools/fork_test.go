package tools

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/agentloom/loomfs/fork"
	"github.com/agentloom/loomfs/store"
)

// TestForkStatus: an agent in a forked scope sees its base, what a merge
// would bring back, the conflicts and what changed in the source; in a
// scope that is no fork, forked is false.
func TestForkStatus(t *testing.T) {
	root := t.TempDir()
	vol, err := store.OpenVolume(context.Background(), store.Config{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vol.Close() })
	box := func(sc store.Scope) *Toolbox {
		ws, err := vol.Open(context.Background(), sc, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ws.Close() })
		return &Toolbox{WS: ws}
	}
	main := box(store.Scope{Space: "sp", Agent: "ag", Session: "se"})
	child := box(store.Scope{Space: "sp", Agent: "ag", Session: "se", Run: "r1", Instance: "sub-1"})

	if got := mustCall(t, child, ForkStatus, map[string]any{}); got["forked"] != false || len(got["forks"].([]any)) != 0 || got["base"] != nil {
		t.Fatalf("status of a scope that is no fork: %v", got)
	}
	for _, f := range []string{"a.txt", "b.txt", "c.txt"} {
		mustCall(t, main, Write, map[string]any{"path": f, "content": f})
	}
	if _, err := fork.Fork(context.Background(), main.WS, child.WS, fork.Options{}); err != nil {
		t.Fatal(err)
	}
	mustCall(t, child, Write, map[string]any{"path": "a.txt", "content": "child's a"})
	mustCall(t, child, Write, map[string]any{"path": "b.txt", "content": "child's b"})
	mustCall(t, main, Write, map[string]any{"path": "b.txt", "content": "main's b"})
	mustCall(t, main, Write, map[string]any{"path": "d.txt", "content": "main's d"})

	got := mustCall(t, child, ForkStatus, map[string]any{})
	b, _ := json.Marshal(got)
	var st struct {
		Forked        bool            `json:"forked"`
		From          string          `json:"from"`
		Base          string          `json:"base"`
		Mergeable     []fork.Applied  `json:"mergeable"`
		Conflicts     []fork.Conflict `json:"conflicts"`
		SourceChanged []string        `json:"source_changed"`
		Truncated     bool            `json:"truncated"`
	}
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	if !st.Forked || st.From != "sp/ag/se" || st.Base == "" {
		t.Errorf("status %s: want forked from sp/ag/se with a base", b)
	}
	if len(st.Mergeable) != 1 || st.Mergeable[0].Path != "a.txt" || st.Mergeable[0].Op != "write" {
		t.Errorf("mergeable %+v, want a.txt written", st.Mergeable)
	}
	if len(st.Conflicts) != 1 || st.Conflicts[0].Path != "b.txt" || st.Conflicts[0].Type != fork.BothModified {
		t.Errorf("conflicts %+v, want b.txt both_modified", st.Conflicts)
	}
	if !slices.Equal(st.SourceChanged, []string{"b.txt", "d.txt"}) {
		t.Errorf("source_changed %v, want b.txt and d.txt", st.SourceChanged)
	}
	if strings.Contains(string(b), root) {
		t.Errorf("status %s shows a host path", b)
	}
	// limit bounds each list and says so.
	got = mustCall(t, child, ForkStatus, map[string]any{"limit": 1})
	if got["truncated"] != true || len(got["source_changed"].([]any)) != 1 {
		t.Errorf("limited status %v: want one source path and truncated", got)
	}
	// The parent sees its fork's merge preview.
	got = mustCall(t, main, ForkStatus, map[string]any{})
	b, _ = json.Marshal(got["forks"])
	var forks []struct {
		Scope     string          `json:"scope"`
		Mergeable int             `json:"mergeable"`
		Conflicts []fork.Conflict `json:"conflicts"`
	}
	if err := json.Unmarshal(b, &forks); err != nil {
		t.Fatal(err)
	}
	if got["forked"] != false || len(forks) != 1 || forks[0].Scope != "sp/ag/se/r1/sub-1" || forks[0].Mergeable != 1 || len(forks[0].Conflicts) != 1 || forks[0].Conflicts[0].Path != "b.txt" {
		t.Errorf("main's status %v: want its fork sub-1 with one mergeable change and b.txt in conflict", got)
	}
	// Nothing changed: the merge preview left both scopes as they were.
	if got := mustCall(t, main, Read, map[string]any{"path": "a.txt"}); got["content"] != "a.txt" {
		t.Errorf("main's a.txt: %v", got["content"])
	}
}
