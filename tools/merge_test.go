package tools

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/fork"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// events keeps the audit events a toolbox records.
type events struct {
	mu  sync.Mutex
	all []audit.Event
}

func (e *events) Record(ctx context.Context, ev audit.Event) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.all = append(e.all, ev)
	return nil
}

func (e *events) scopes(op, result string) map[string]bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := map[string]bool{}
	for _, ev := range e.all {
		if ev.Op == op && ev.Result == result {
			out[ev.Scope] = true
		}
	}
	return out
}

var (
	mergeMain  = store.Scope{Space: "sp", Agent: "ag", Session: "se"}
	mergeChild = store.Scope{Space: "sp", Agent: "ag", Session: "se", Run: "r1", Instance: "sub-1"}
)

// forkedBoxes opens main and a child under pol, seeds main, forks it into
// the child, and returns the two toolboxes and the volume's root.
func forkedBoxes(t *testing.T, pol *policy.Policy) (main, child *Toolbox, rec *events, root string) {
	t.Helper()
	root = t.TempDir()
	vol, err := store.OpenVolume(context.Background(), store.Config{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vol.Close() })
	rec = &events{}
	box := func(sc store.Scope) *Toolbox {
		ws, err := vol.Open(context.Background(), sc, pol.WithScope(sc.Main()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ws.Close() })
		return &Toolbox{WS: ws, Audit: rec}
	}
	main, child = box(mergeMain), box(mergeChild)
	for _, f := range []string{"src/a.txt", "src/b.txt", "output/r.txt"} {
		mustCall(t, main, Write, map[string]any{"path": f, "content": "base " + f})
	}
	if _, err := fork.Fork(context.Background(), main.WS, child.WS, fork.Options{}); err != nil {
		t.Fatal(err)
	}
	return main, child, rec, root
}

func mainFile(t *testing.T, root, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, mergeMain.Dir(), rel))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return string(b)
}

// TestMergeRefusedByDefault: with agent_merge off (the default) every call
// is refused with a message that says so, and nothing is merged.
func TestMergeRefusedByDefault(t *testing.T) {
	pol, _ := policy.Preset("standard")
	main, child, _, root := forkedBoxes(t, pol)
	mustCall(t, child, Write, map[string]any{"path": "src/a.txt", "content": "child's a"})
	for _, in := range []map[string]any{{}, {"preview": "0123"}} {
		_, err := call(t, child, Merge, in)
		if pe := wantCode(t, err, policy.PermissionDenied); !strings.Contains(pe.Message, "agent_merge is off") {
			t.Errorf("refusal %q does not say why", pe.Message)
		}
	}
	if got := mainFile(t, root, "src/a.txt"); got != "base src/a.txt" {
		t.Fatalf("main's src/a.txt %q: a refused merge changed it", got)
	}
	for _, d := range Definitions(main.WS.Policy()) {
		if d.Name == Merge && !strings.Contains(d.Description, "every call is refused") {
			t.Errorf("the description does not say merges are refused: %s", d.Description)
		}
	}
}

// TestMerge: with agent_merge on, a dry run names its plan; a merge with
// a stale plan applies nothing; one with the current plan merges, audited
// on both scopes; a scope that is no fork has nothing to merge.
func TestMerge(t *testing.T) {
	pol, _ := policy.Preset("standard")
	pol.AgentMerge = true
	main, child, rec, root := forkedBoxes(t, pol)
	mustCall(t, child, Write, map[string]any{"path": "src/a.txt", "content": "child's a"})

	dry := mustCall(t, child, Merge, map[string]any{})
	preview, _ := dry["preview"].(string)
	if preview == "" || dry["dry_run"] != true || len(dry["applied"].([]any)) != 1 {
		t.Fatalf("dry run %v: want a preview and src/a.txt to apply", dry)
	}
	if got := mainFile(t, root, "src/a.txt"); got != "base src/a.txt" {
		t.Fatalf("a dry run changed main's src/a.txt: %q", got)
	}
	// The fork changes again: the previewed plan is not what a merge
	// would do now.
	mustCall(t, child, Write, map[string]any{"path": "src/b.txt", "content": "child's b"})
	_, err := call(t, child, Merge, map[string]any{"preview": preview})
	if pe := wantCode(t, err, policy.Conflict); !strings.Contains(pe.Message, "preview again") {
		t.Errorf("stale preview: %q", pe.Message)
	}
	if got := mainFile(t, root, "src/a.txt"); got != "base src/a.txt" {
		t.Fatalf("a merge with a stale preview changed main: %q", got)
	}
	dry = mustCall(t, child, Merge, map[string]any{})
	got := mustCall(t, child, Merge, map[string]any{"preview": dry["preview"]})
	if got["merged"] != true || len(got["applied"].([]any)) != 2 {
		t.Fatalf("merge %v: want 2 changes merged", got)
	}
	for rel, want := range map[string]string{"src/a.txt": "child's a", "src/b.txt": "child's b"} {
		if c := mainFile(t, root, rel); c != want {
			t.Errorf("main's %s: %q, want %q", rel, c, want)
		}
	}
	if s := rec.scopes(Merge, "ok"); !s[mergeMain.Hash()] || !s[mergeChild.Hash()] {
		t.Errorf("the merge is audited on %v, want both scopes", s)
	}
	_, err = call(t, main, Merge, map[string]any{})
	if pe := wantCode(t, err, policy.NotFound); !strings.Contains(pe.Message, "not a fork") {
		t.Errorf("merge of main: %q", pe.Message)
	}
}

// TestMergeHeldBack: a conflict holds the merge back with the reason in
// message, and the hashes of a write-only file are withheld, in the merge's
// answer and in workspace_fork_status, while a readable file's are shown.
func TestMergeHeldBack(t *testing.T) {
	pol := policy.Default()
	if err := pol.SetRules([]policy.Rule{{Prefix: "output", Mode: policy.ModeWO}}); err != nil {
		t.Fatal(err)
	}
	pol.AgentMerge = true
	main, child, _, root := forkedBoxes(t, pol)
	for _, ws := range []*Toolbox{main, child} {
		side := "main"
		if ws == child {
			side = "child"
		}
		mustCall(t, ws, Write, map[string]any{"path": "output/r.txt", "content": side + "'s result"})
		mustCall(t, ws, Write, map[string]any{"path": "src/a.txt", "content": side + "'s a"})
	}
	mustCall(t, child, Write, map[string]any{"path": "src/b.txt", "content": "child's b"})
	dry := mustCall(t, child, Merge, map[string]any{})
	got := mustCall(t, child, Merge, map[string]any{"preview": dry["preview"]})
	if got["merged"] != false || !strings.Contains(got["message"].(string), "both_modified") {
		t.Fatalf("merge %v: want it held back by the conflicts", got)
	}
	if c := mainFile(t, root, "src/b.txt"); c != "base src/b.txt" {
		t.Errorf("a held-back merge changed main's src/b.txt: %q", c)
	}
	status := mustCall(t, child, ForkStatus, map[string]any{})
	for what, res := range map[string]map[string]any{"merge": got, "fork status": status} {
		conflicts := res["conflicts"].([]any)
		if len(conflicts) != 2 {
			t.Fatalf("%s conflicts %v, want output/r.txt and src/a.txt", what, conflicts)
		}
		for _, c := range conflicts {
			c := c.(map[string]any)
			hidden := c["path"] == "output/r.txt"
			for _, side := range []string{"base", "target", "fork"} {
				if (c[side] == withheld) != hidden {
					t.Errorf("%s: %s's %s hash %v (withheld wanted: %v)", what, c["path"], side, c[side], hidden)
				}
			}
		}
	}
	// partial merges what conflicts with nothing.
	dry = mustCall(t, child, Merge, map[string]any{"partial": true})
	got = mustCall(t, child, Merge, map[string]any{"partial": true, "preview": dry["preview"]})
	if got["merged"] != true || mainFile(t, root, "src/b.txt") != "child's b" || mainFile(t, root, "src/a.txt") != "main's a" {
		t.Fatalf("partial merge %v: want src/b.txt merged and src/a.txt left", got)
	}
}
