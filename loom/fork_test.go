package loom_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/fork"
	"github.com/agentloom/loomfs/loom"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// TestStartChild: a run's child instance starts from a fork of the run's
// main scope, audited on both scopes as the platform's; starting it again
// (a platform's retry) answers the fork made, and a child holding files of
// its own is never overwritten.
func TestStartChild(t *testing.T) {
	root := t.TempDir()
	cfg := store.Config{Root: root}
	node := loom.New(loom.Config{Store: cfg})
	t.Cleanup(func() { node.Close() })
	ctx := context.Background()
	main := store.Scope{Space: "acme", Agent: "coder", Session: "s1"}
	if _, err := store.CreateRun(ctx, cfg, store.RunSpec{Space: main.Space, Agent: main.Agent, Session: main.Session, Run: "r1", User: "u"}); err != nil {
		t.Fatal(err)
	}
	ws, done, err := node.OpenWorkspace(ctx, main.String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ws.Platform().WriteFile(ctx, "a.txt", []byte("main's a\n"), nil); err != nil {
		t.Fatal(err)
	}
	done()

	res, err := node.StartChild(ctx, "r1", "sub-1", fork.Options{})
	if err != nil {
		t.Fatal(err)
	}
	child := store.Scope{Space: "acme", Agent: "coder", Session: "s1", Run: "r1", Instance: "sub-1"}
	if res.Existing || res.Files != 1 || res.To != child.String() {
		t.Fatalf("result %+v: want one file forked into %s", res, child)
	}
	if b, err := os.ReadFile(filepath.Join(root, child.Dir(), "a.txt")); err != nil || string(b) != "main's a\n" {
		t.Fatalf("the child's a.txt: %q, %v", b, err)
	}
	for _, c := range []struct {
		scope store.Scope
		op    string
	}{{child, "fork"}, {main, "fork_source"}} {
		n := 0
		err := audit.Query(audit.Dir(root), audit.Filter{Scope: c.scope.String(), Op: c.op, Source: audit.SourcePlatform}, func(audit.Record) error { n++; return nil })
		if err != nil || n != 1 {
			t.Errorf("%s records of %s: %d, %v; want 1", c.op, c.scope, n, err)
		}
	}

	again, err := node.StartChild(ctx, "r1", "sub-1", fork.Options{})
	if err != nil || !again.Existing || again.Snapshot != res.Snapshot || again.Files != 1 {
		t.Fatalf("a retry: %+v, %v; want the fork made, existing", again, err)
	}

	other, done, err := node.OpenWorkspace(ctx, "run:r1/sub-2")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Platform().WriteFile(ctx, "mine.txt", []byte("mine"), nil); err != nil {
		t.Fatal(err)
	}
	done()
	if _, err := node.StartChild(ctx, "r1", "sub-2", fork.Options{}); policy.CodeOf(err) != policy.Exists {
		t.Fatalf("a child holding files: %v, want exists", err)
	}
	if _, err := node.StartChild(ctx, "r1", "../x", fork.Options{}); policy.CodeOf(err) == "" {
		t.Fatal("an invalid instance id was taken")
	}
}
