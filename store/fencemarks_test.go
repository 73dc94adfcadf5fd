package store_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentloom/loomfs/callrec"
	"github.com/agentloom/loomfs/fence"
	"github.com/agentloom/loomfs/nodeid"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// TestFencedNodeLateRecords: node A writes journal lines, call records
// and a marker, is fenced (its records measured, the marks kept), and
// writes again as a frozen node that wakes up would; node B then reads
// the scopes. What A wrote before the fence counts; what it wrote after
// is ignored: its late call lines (a call A only started stays started),
// its late journal lines (left out, and the file no longer trusted), its
// late marker and quarantine (set aside, not a quarantine). A marker A
// had at the fence still quarantines, and B's own lines in a log it took
// over from A count.
func TestFencedNodeLateRecords(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	t.Setenv(nodeid.Env, "node-a")
	scopeY := childScope
	scopeZ := store.Scope{Space: "sp", Agent: "ag", Session: "se2"}
	a := e.openAnew(t, mainScope)
	aY := e.openAnew(t, scopeY)
	aZ := e.openAnew(t, scopeZ)
	aGone := e.openAnew(t, mainScope) // closed before the fence: its log is taken over
	in := []byte(`{}`)
	begin := func(ws *store.Workspace, id string) *callrec.Record {
		t.Helper()
		rec, err := ws.BeginCall(ctx, id, "workspace_write", in)
		if err != nil {
			t.Fatalf("BeginCall %s: %v", id, err)
		}
		return rec
	}
	finish := func(ws *store.Workspace, id string) {
		t.Helper()
		if err := ws.FinishCall(id, "workspace_write", in, json.RawMessage(`{"ok":1}`), nil); err != nil {
			t.Fatalf("FinishCall %s: %v", id, err)
		}
	}
	write := func(ws *store.Workspace, rel string) {
		t.Helper()
		if _, err := ws.WriteFile(ctx, rel, []byte("x"), nil); err != nil {
			t.Fatalf("write %s: %v", rel, err)
		}
		if _, err := ws.JournalFiles(); err != nil { // flushes the journal
			t.Fatal(err)
		}
	}
	begin(a, "c-1")
	finish(a, "c-1")
	begin(a, "c-2")
	begin(aGone, "c-0")
	aGone.Close()
	write(a, "before.txt")
	if err := a.SetMarker(store.Marker{Container: "cx", Node: "node-a", Time: time.Now()}); err != nil {
		t.Fatal(err)
	}

	// The fence: A's records measured once it holds.
	l, err := e.vol.FenceLengths("node-a")
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Journals) == 0 || len(l.Calls) != 2 || !slices.Equal(l.Markers, []string{mainScope.Hash()}) {
		t.Fatalf("FenceLengths = %+v; want A's journal files, both call logs, a marker in %s", l, mainScope.Hash())
	}
	for key := range l.Journals {
		if !strings.HasPrefix(key[strings.IndexByte(key, '/')+1:], "node-a.") {
			t.Errorf("FenceLengths marked %s, not a journal file of node-a", key)
		}
	}
	if _, err := fence.AddMarks(e.root, "node-a", time.Now(), l); err != nil {
		t.Fatal(err)
	}

	// A wakes up and writes on.
	finish(a, "c-2")
	begin(a, "c-3")
	write(a, "late.txt")
	if err := aY.SetMarker(store.Marker{Container: "cy", Node: "node-a", Time: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := aZ.Quarantine(store.Marker{Container: "cz", Node: "node-a", Time: time.Now()}, "late"); err != nil {
		t.Fatal(err)
	}

	t.Setenv(nodeid.Env, "node-b")
	b := e.openAnew(t, mainScope)
	if rec := begin(b, "c-1"); rec == nil || rec.State != callrec.Done {
		t.Errorf("c-1, done before the fence: %+v; want its done record", rec)
	}
	if rec := begin(b, "c-2"); rec == nil || rec.State != callrec.Started {
		t.Errorf("c-2, done only after the fence: %+v; want the started record (outcome unknown)", rec)
	}
	if rec := begin(b, "c-3"); rec != nil {
		t.Errorf("c-3, begun only after the fence: %+v; want it unseen", rec)
	}
	// B's lines, in A's log it took over (the only one nobody holds),
	// count: another handle of B's reads them.
	finish(b, "c-3")
	if rec := begin(e.openAnew(t, mainScope), "c-3"); rec == nil || rec.State != callrec.Done {
		t.Errorf("c-3 as B recorded it: %+v; want done", rec)
	}

	files, err := b.ReadJournal(nil)
	if err != nil {
		t.Fatal(err)
	}
	var sawA bool
	for _, f := range files {
		if node, _ := store.JournalWriter(f.Name); node != "node-a" {
			continue
		}
		var paths []string
		for _, c := range f.Changes {
			paths = append(paths, c.Path)
		}
		if slices.Contains(paths, "before.txt") {
			sawA = true
			if !f.Late || f.Trusted() || slices.Contains(paths, "late.txt") {
				t.Errorf("A's journal %s: late %v trusted %v changes %v; want late.txt left out and the file not trusted", f.Name, f.Late, f.Trusted(), paths)
			}
		}
	}
	if !sawA {
		t.Errorf("A's journal lines from before the fence are missing: %+v", files)
	}
	// A's writer ends its journal after the fence: its end line is late
	// too, so the file stays untrusted however far a reader had read.
	from := map[string]int64{}
	for _, f := range files {
		from[f.Name] = f.Size
	}
	a.Close()
	for range 2 {
		files, err = b.ReadJournal(from)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if node, _ := store.JournalWriter(f.Name); node == "node-a" && f.Trusted() {
				t.Errorf("A's journal %s, ended after the fence, is trusted: %+v", f.Name, f)
			}
			from[f.Name] = f.Size
		}
	}

	// Markers: A's late quarantine refuses nothing and is not listed,
	// even before a lock sets it aside; A's late marker is set aside by
	// the next lock, and the one it had at the fence quarantines.
	if err := e.openAnew(t, scopeZ).CheckQuarantine(); err != nil {
		t.Errorf("A's late quarantine of %s refuses: %v", scopeZ, err)
	}
	if qs, err := e.vol.Quarantines(); err != nil || len(qs) != 0 {
		t.Errorf("quarantines listed before any lock: %+v, %v; want none (A's late one is not in force)", qs, err)
	}
	for _, c := range []struct {
		sc          store.Scope
		name        string
		quarantined bool
	}{
		{scopeY, store.ExecMarker, false},
		{scopeZ, store.QuarantineFile, false},
		{mainScope, store.ExecMarker, true},
	} {
		ws := e.openAnew(t, c.sc)
		unlock, err := ws.Lock(ctx)
		if err != nil {
			t.Fatalf("Lock %s: %v", c.sc, err)
		}
		unlock()
		err = ws.CheckQuarantine()
		if got := policy.CodeOf(err) == policy.Quarantined; got != c.quarantined {
			t.Errorf("%s after B's lock: %v; want quarantined %v", c.sc, err, c.quarantined)
		}
		aside := filepath.Join(e.root, store.LocksDir, c.sc.Hash(), c.name+store.LateSuffix)
		if _, err := os.Stat(aside); (err == nil) == c.quarantined {
			t.Errorf("%s: %s set aside: %v; want set aside %v", c.sc, c.name, err == nil, !c.quarantined)
		}
	}
	if qs, err := e.vol.Quarantines(); err != nil || len(qs) != 1 || qs[0].ScopeHash != mainScope.Hash() {
		t.Errorf("quarantines listed: %+v, %v; want the one of %s alone", qs, err, mainScope)
	}
}
