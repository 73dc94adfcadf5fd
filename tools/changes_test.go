package tools

import (
	"context"
	"strings"
	"testing"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// TestChangesCursorOfAnotherScope: workspace_changes given a cursor that
// another scope's feed gave answers invalid_cursor, with the step that
// fixes the call, instead of replaying this scope's recent changes.
func TestChangesCursorOfAnotherScope(t *testing.T) {
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
	mine := box(store.Scope{Space: "sp", Agent: "ag", Session: "se"})
	theirs := box(store.Scope{Space: "sp", Agent: "ag", Session: "se", Run: "r1", Instance: "sub-1"})

	mustCall(t, mine, Write, map[string]any{"path": "mine.txt", "content": "x"})
	cursor, _ := mustCall(t, theirs, Changes, map[string]any{})["cursor"].(string)
	if cursor == "" {
		t.Fatal("no cursor from the other scope's feed")
	}
	res, err := call(t, mine, Changes, map[string]any{"since": cursor})
	pe := wantCode(t, err, policy.InvalidCursor)
	if !strings.Contains(pe.Message, "leave it out") || strings.Contains(pe.Message, root) {
		t.Errorf("message %q: want the step that fixes the call and no host path", pe.Message)
	}
	if res != nil {
		t.Errorf("changes given with the refusal: %v", res)
	}
	// Its own cursor still works.
	own, _ := mustCall(t, mine, Changes, map[string]any{})["cursor"].(string)
	mustCall(t, mine, Write, map[string]any{"path": "next.txt", "content": "y"})
	got := mustCall(t, mine, Changes, map[string]any{"since": own})
	if list, _ := got["changes"].([]any); len(list) != 1 || list[0].(map[string]any)["path"] != "next.txt" {
		t.Errorf("own cursor: %v", got)
	}
}
