package callrec

import (
	"context"
	"encoding/json"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/nodeid"
)

// dirOf opens dir for a Log, as the store opens a scope's Dir.
func dirOf(dir string) OpenDir {
	return func() (int, error) {
		return unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	}
}

// TestLateLinesIgnored: each line names the node that wrote it, and a
// reader asks Late about the lines of other nodes only: a late "done"
// line leaves the call started, a late "started" line leaves it unseen,
// and lines Late clears, or this node's own, count.
func TestLateLinesIgnored(t *testing.T) {
	dir := dirOf(t.TempDir())
	ctx := context.Background()
	in := []byte("{}")
	t.Setenv(nodeid.Env, "node-x")
	var x Log
	defer x.Close()
	for _, id := range []string{"c-1", "c-2"} {
		if rec, err := x.Begin(ctx, dir, id, "workspace_write", in); err != nil || rec != nil {
			t.Fatalf("Begin %s: %+v %v", id, rec, err)
		}
	}
	if err := x.Finish(dir, "c-1", "workspace_write", in, json.RawMessage(`{}`), nil); err != nil {
		t.Fatal(err)
	}
	fenceAt := x.f // every line so far is before the "fence"
	fi, err := fenceAt.Stat()
	if err != nil {
		t.Fatal(err)
	}
	mark := fi.Size()
	if err := x.Finish(dir, "c-2", "workspace_write", in, json.RawMessage(`{}`), nil); err != nil {
		t.Fatal(err)
	}
	if rec, err := x.Begin(ctx, dir, "c-3", "workspace_write", in); err != nil || rec != nil {
		t.Fatalf("Begin c-3: %+v %v", rec, err)
	}

	t.Setenv(nodeid.Env, "node-y")
	var asked []string
	y := Log{Late: func(node, name string, off, end int64) (bool, error) {
		asked = append(asked, node)
		return node == "node-x" && end > mark, nil
	}}
	defer y.Close()
	for _, tc := range []struct {
		id    string
		state string // "" for unseen
	}{
		{"c-1", Done},
		{"c-2", Started},
		{"c-3", ""},
	} {
		rec, err := y.Begin(ctx, dir, tc.id, "workspace_write", in)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case tc.state == "" && rec != nil:
			t.Errorf("%s: %+v; want it unseen", tc.id, rec)
		case tc.state != "" && (rec == nil || rec.State != tc.state || rec.Node != "node-x"):
			t.Errorf("%s: %+v; want %s by node-x", tc.id, rec, tc.state)
		}
	}
	if len(asked) == 0 {
		t.Fatal("Late was never asked")
	}
	for _, n := range asked {
		if n != "node-x" {
			t.Errorf("Late was asked about a line of %s", n)
		}
	}
	// y began c-3 itself: its own line counts, for it and for another
	// reader of node-y's, which is not asked about it.
	asked = nil
	z := Log{Late: y.Late}
	defer z.Close()
	if rec, err := z.Begin(ctx, dir, "c-3", "workspace_write", in); err != nil || rec == nil || rec.Node != "node-y" {
		t.Errorf("c-3 as node-y began it: %+v %v", rec, err)
	}
	for _, n := range asked {
		if n == "node-y" {
			t.Error("Late was asked about this node's own line")
		}
	}
}
