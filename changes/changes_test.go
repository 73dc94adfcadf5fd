package changes_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/agentloom/loomfs/changes"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

func open(t *testing.T, root string, pol *policy.Policy) *store.Workspace {
	t.Helper()
	return openScope(t, root, store.Scope{Space: "sp", Agent: "ag", Session: "se"}, pol)
}

func openScope(t *testing.T, root string, sc store.Scope, pol *policy.Policy) *store.Workspace {
	t.Helper()
	vol, err := store.OpenVolume(context.Background(), store.Config{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vol.Close() })
	ws, err := vol.Open(context.Background(), sc, pol)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	return ws
}

var tool = store.WithChange(context.Background(), store.Change{Source: store.SourceTool, Call: "c-1"})

// must(f())(t) is f's value, or the test's end.
func must[T any](v T, err error) func(*testing.T) T {
	return func(t *testing.T) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

type ev struct{ op, path, to string }

func events(p changes.Page) []ev {
	var out []ev
	for _, e := range p.Changes {
		out = append(out, ev{e.Op, e.Path, e.To})
	}
	return out
}

func same(t *testing.T, what string, got, want []ev) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %v, want %v", what, got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("%s: %v, want %v", what, got, want)
		}
	}
}

// TestFeed: the tool door's changes in order with who made them; a
// rename once, with both paths; nothing under a hidden rule; a prefix.
func TestFeed(t *testing.T) {
	pol, _ := policy.Preset("standard")
	ws := open(t, t.TempDir(), pol)
	start := must(changes.Read(context.Background(), ws, changes.Query{}))(t)
	if len(start.Changes) != 0 || start.Cursor == "" || start.Reset {
		t.Fatalf("a read without since: %+v", start)
	}
	must(ws.Mkdir(tool, "app", false))(t)
	must(ws.WriteFile(tool, "app/a.go", []byte("x"), nil))(t)
	must(ws.WriteFile(tool, "app/a.go", []byte("y"), nil))(t)
	// .meta exists already: the standard layout makes it at open.
	must(ws.Unfiltered().WriteFile(tool, ".meta/secret", []byte("z"), nil))(t)
	// As the projection notes a directory rename (fusefs).
	ws.NoteChangeBy("app", true, store.Change{Op: store.OpRename, To: "lib", Source: store.SourceProjection, Call: "cmd-1"})
	ws.NoteChangeBy("lib", true, store.Change{Op: store.OpRename, From: "app", Source: store.SourceProjection, Call: "cmd-1"})
	// Into and out of a hidden subtree: a delete and a create here.
	ws.NoteChangeBy("lib/a.go", false, store.Change{Op: store.OpRename, To: ".meta/a.go"})
	ws.NoteChangeBy(".meta/a.go", false, store.Change{Op: store.OpRename, From: "lib/a.go"})
	ws.NoteChangeBy(".meta/b", false, store.Change{Op: store.OpRename, To: "lib/b"})
	ws.NoteChangeBy("lib/b", false, store.Change{Op: store.OpRename, From: ".meta/b"})
	ws.NoteChangeBy("lib/b", false, store.Change{Op: store.OpDelete})

	p := must(changes.Read(context.Background(), ws, changes.Query{Since: start.Cursor}))(t)
	same(t, "feed", events(p), []ev{
		{"mkdir", "app", ""}, {"create", "app/a.go", ""}, {"write", "app/a.go", ""},
		{"rename", "app", "lib"}, {"delete", "lib/a.go", ""}, {"create", "lib/b", ""}, {"delete", "lib/b", ""},
	})
	if e := p.Changes[1]; e.Source != "tool" || e.CallID != "c-1" || e.Node == "" || e.Time == "" {
		t.Errorf("who and when: %+v", e)
	}
	if e := p.Changes[3]; e.Source != "projection" || e.CallID != "cmd-1" || !e.Subtree {
		t.Errorf("the rename: %+v", e)
	}
	// Read again from the new cursor: nothing.
	if again := must(changes.Read(context.Background(), ws, changes.Query{Since: p.Cursor}))(t); len(again.Changes) != 0 {
		t.Errorf("read past the cursor: %v", events(again))
	}
	// A prefix.
	pp := must(changes.Read(context.Background(), ws, changes.Query{Since: start.Cursor, Prefix: "app"}))(t)
	same(t, "under app", events(pp), []ev{{"mkdir", "app", ""}, {"create", "app/a.go", ""}, {"write", "app/a.go", ""}, {"rename", "app", "lib"}})
}

// TestFeedLimit: a limit cuts the page and the cursor goes on exactly
// where it stopped.
func TestFeedLimit(t *testing.T) {
	ws := open(t, t.TempDir(), nil)
	start := must(changes.Read(context.Background(), ws, changes.Query{}))(t)
	for _, f := range []string{"a", "b", "c", "d", "e"} {
		must(ws.WriteFile(tool, f, []byte(f), nil))(t)
	}
	var got []ev
	cur := start.Cursor
	for i := 0; i < 10; i++ {
		p := must(changes.Read(context.Background(), ws, changes.Query{Since: cur, Limit: 2}))(t)
		got = append(got, events(p)...)
		cur = p.Cursor
		if !p.Truncated {
			break
		}
	}
	same(t, "paged", got, []ev{{"create", "a", ""}, {"create", "b", ""}, {"create", "c", ""}, {"create", "d", ""}, {"create", "e", ""}})
}

// TestFeedStaleCursor: a cursor older than the journals kept answers
// reset, never a silent gap: whether the file it read is gone, or a file
// it never saw was written and removed after it.
func TestFeedStaleCursor(t *testing.T) {
	root := t.TempDir()
	ws := open(t, root, nil)
	start := must(changes.Read(context.Background(), ws, changes.Query{}))(t)
	must(ws.WriteFile(tool, "a", []byte("a"), nil))(t)
	mid := must(changes.Read(context.Background(), ws, changes.Query{Since: start.Cursor}))(t)

	// Another process writes, ends, and its journal is trimmed (as a
	// snapshot does) before this reader looks again.
	other := open(t, root, nil)
	must(other.WriteFile(tool, "b", []byte("b"), nil))(t)
	other.Close()
	files := must(ws.JournalFiles())(t)
	for _, f := range files {
		if !f.Live {
			if err := ws.RemoveJournal(f.Name); err != nil {
				t.Fatal(err)
			}
		}
	}
	p := must(changes.Read(context.Background(), ws, changes.Query{Since: mid.Cursor}))(t)
	if !p.Reset || len(p.Changes) != 0 {
		t.Fatalf("after the journal it never read was removed: %+v", p)
	}
	// The reset cursor goes on.
	must(ws.WriteFile(tool, "c", []byte("c"), nil))(t)
	q := must(changes.Read(context.Background(), ws, changes.Query{Since: p.Cursor}))(t)
	if q.Reset {
		t.Fatal("the cursor a reset gave answers reset again")
	}
	same(t, "after reset", events(q), []ev{{"create", "c", ""}})

	// This process's own file, named by the cursor, removed.
	ws.Close()
	ws2 := open(t, root, nil)
	for _, f := range must(ws2.JournalFiles())(t) {
		if !f.Live {
			ws2.RemoveJournal(f.Name)
		}
	}
	if r := must(changes.Read(context.Background(), ws2, changes.Query{Since: q.Cursor}))(t); !r.Reset {
		t.Errorf("cursor naming a removed file: %+v", r)
	}
	if _, err := changes.Read(context.Background(), ws2, changes.Query{Since: "not-a-cursor"}); policy.CodeOf(err) != policy.InvalidCursor {
		t.Errorf("a bad cursor: %v", err)
	}
}

// TestFeedCursorOfAnotherScope: a cursor is good only in the scope whose
// feed gave it. Another scope's answers invalid_cursor and replays
// nothing of this one; a cursor that names no scope (as cursors did
// before they named one) answers reset.
func TestFeedCursorOfAnotherScope(t *testing.T) {
	root := t.TempDir()
	ws := open(t, root, nil)
	must(ws.WriteFile(tool, "recent", []byte("x"), nil))(t)
	legacy := base64.RawURLEncoding.EncodeToString(fmt.Appendf(nil, `{"t":%d,"r":0}`, time.Now().UnixMilli()))
	for _, tc := range []struct {
		name  string
		scope store.Scope
	}{
		{"another session", store.Scope{Space: "sp", Agent: "ag", Session: "other"}},
		{"another agent", store.Scope{Space: "sp", Agent: "other", Session: "se"}},
		{"a child instance of the session", store.Scope{Space: "sp", Agent: "ag", Session: "se", Run: "r1", Instance: "sub-1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			other := openScope(t, root, tc.scope, nil)
			// The other scope's feed, read both fresh and after a change.
			start := must(changes.Read(context.Background(), other, changes.Query{}))(t)
			must(other.WriteFile(tool, "theirs", []byte("y"), nil))(t)
			after := must(changes.Read(context.Background(), other, changes.Query{Since: start.Cursor}))(t)
			for _, cur := range []string{start.Cursor, after.Cursor} {
				p, err := changes.Read(context.Background(), ws, changes.Query{Since: cur})
				if policy.CodeOf(err) != policy.InvalidCursor {
					t.Fatalf("another scope's cursor: %v, %v; want invalid_cursor", events(p), err)
				}
				if msg := policy.AsError(err).Message; !strings.Contains(msg, "leave it out") || strings.Contains(msg, root) {
					t.Errorf("message %q: want the step that fixes the call and no host path", msg)
				}
			}
		})
	}
	p := must(changes.Read(context.Background(), ws, changes.Query{Since: legacy}))(t)
	if !p.Reset || len(p.Changes) != 0 {
		t.Errorf("a cursor that names no scope: %+v, want reset", p)
	}
	if q := must(changes.Read(context.Background(), ws, changes.Query{Since: p.Cursor}))(t); q.Reset || len(q.Changes) != 0 {
		t.Errorf("the reset's cursor: %+v", q)
	}
}

// TestFeedWait: a waiting read returns as soon as a change lands, not
// when its wait runs out.
func TestFeedWait(t *testing.T) {
	ws := open(t, t.TempDir(), nil)
	start := must(changes.Read(context.Background(), ws, changes.Query{}))(t)
	done := make(chan changes.Page, 1)
	go func() {
		p, _ := changes.Read(context.Background(), ws, changes.Query{Since: start.Cursor, Wait: time.Minute})
		done <- p
	}()
	select {
	case p := <-done:
		t.Fatalf("returned with nothing changed: %+v", p)
	case <-time.After(200 * time.Millisecond):
	}
	wrote := time.Now()
	must(ws.WriteFile(tool, "f", []byte("x"), nil))(t)
	select {
	case p := <-done:
		same(t, "waited", events(p), []ev{{"create", "f", ""}})
		t.Logf("returned %v after the write", time.Since(wrote))
	case <-time.After(30 * time.Second):
		t.Fatal("a minute's wait did not return within 30 s of a change")
	}
	// Nothing changes: the wait runs out with an empty page and a cursor.
	p := must(changes.Read(context.Background(), ws, changes.Query{Since: start.Cursor, Wait: 50 * time.Millisecond, Prefix: "elsewhere"}))(t)
	if len(p.Changes) != 0 || p.Cursor == "" {
		t.Errorf("a wait that ran out: %+v", p)
	}
}

// TestFeedCursorStaysSmall: a cursor does not name every journal file
// ever written (one per process that changed the scope): a file read
// whole drops out of it once its margin has passed, and is not read
// again.
func TestFeedCursorStaysSmall(t *testing.T) {
	old := changes.Margin
	changes.Margin = 50 * time.Millisecond
	t.Cleanup(func() { changes.Margin = old })
	root := t.TempDir()
	ws := open(t, root, nil)
	start := must(changes.Read(context.Background(), ws, changes.Query{}))(t)
	const writers = 40
	for i := range writers {
		w := open(t, root, nil)
		must(w.WriteFile(tool, fmt.Sprintf("f%02d", i), []byte("x"), nil))(t)
		w.Close()
	}
	p := must(changes.Read(context.Background(), ws, changes.Query{Since: start.Cursor}))(t)
	if len(p.Changes) != writers {
		t.Fatalf("%d changes, want %d", len(p.Changes), writers)
	}
	time.Sleep(2 * changes.Margin)
	q := must(changes.Read(context.Background(), ws, changes.Query{Since: p.Cursor}))(t)
	if len(q.Changes) != 0 {
		t.Fatalf("read again: %v", events(q))
	}
	if len(q.Cursor) >= len(p.Cursor) || len(q.Cursor) > 200 {
		t.Errorf("cursor of %d bytes after %d finished writers (was %d)", len(q.Cursor), writers, len(p.Cursor))
	}
	must(ws.WriteFile(tool, "last", []byte("x"), nil))(t)
	r := must(changes.Read(context.Background(), ws, changes.Query{Since: q.Cursor}))(t)
	same(t, "after", events(r), []ev{{"create", "last", ""}})
}
