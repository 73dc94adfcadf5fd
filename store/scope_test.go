package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/agentloom/loomfs/callrec"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

func TestParseScope(t *testing.T) {
	long := strings.Repeat("a", store.MaxIDBytes)
	tests := []struct {
		name string
		in   string
		want store.Scope // zero means refused
	}{
		{name: "main scope", in: "sp/ag/se", want: store.Scope{Space: "sp", Agent: "ag", Session: "se"}},
		{name: "child instance", in: "sp/ag/se/run-1/sub-1", want: store.Scope{Space: "sp", Agent: "ag", Session: "se", Run: "run-1", Instance: "sub-1"}},
		{name: "ids with dots, dashes and underscores", in: "Space_1/agent.v2/sess-01", want: store.Scope{Space: "Space_1", Agent: "agent.v2", Session: "sess-01"}},
		{name: "id of 128 bytes", in: long + "/ag/se", want: store.Scope{Space: long, Agent: "ag", Session: "se"}},
		{name: "id of 129 bytes", in: long + "a/ag/se"},
		{name: "two parts", in: "sp/ag"},
		{name: "four parts", in: "sp/ag/se/run-1"},
		{name: "six parts", in: "sp/ag/se/r/i/x"},
		{name: "empty", in: ""},
		{name: "empty id", in: "sp//se"},
		{name: "trailing slash", in: "sp/ag/se/"},
		{name: "leading slash", in: "/sp/ag/se"},
		{name: "dot-dot id", in: "sp/../se"},
		{name: "dot id", in: "sp/./se"},
		{name: "id starting with a dot", in: "sp/.ag/se"},
		{name: "id starting with a dash", in: "sp/-ag/se"},
		{name: "id with a space", in: "sp/a g/se"},
		{name: "id with a backslash", in: `sp/a\g/se`},
		{name: "id with NUL", in: "sp/a\x00g/se"},
		{name: "id with a newline", in: "sp/ag\n/se"},
		{name: "id with unicode", in: "sp/агент/se"},
		{name: "id with invalid UTF-8", in: "sp/\xff/se"},
		{name: "run without instance", in: "sp/ag/se/run-1/"},
		{name: "instance dot-dot", in: "sp/ag/se/run-1/.."},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := store.ParseScope(tc.in)
			if tc.want == (store.Scope{}) {
				if err == nil {
					t.Fatalf("ParseScope(%q) = %+v, accepted", tc.in, got)
				}
				if policy.CodeOf(err) != policy.InvalidInput {
					t.Errorf("ParseScope(%q) code %q, want invalid_input", tc.in, policy.CodeOf(err))
				}
				for _, r := range err.Error() {
					if r < 0x20 || r == 0x7f {
						t.Errorf("ParseScope(%q): message echoes a control character: %q", tc.in, err)
						break
					}
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParseScope(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
			}
			if got.String() != tc.in {
				t.Errorf("String() = %q, want %q", got.String(), tc.in)
			}
		})
	}
}

func TestValidateID(t *testing.T) {
	ok := []string{"a", "A", "0", "_", "a.b", "a-b", "a_b", "a..b", "a.", "x-", strings.Repeat("z", 128)}
	bad := []string{"", ".", "..", ".a", "-a", "a/b", `a\b`, "a b", "a\x00", "a:b", "a*", "é", "a\n", strings.Repeat("z", 129)}
	for _, id := range ok {
		if err := store.ValidateID("session", id); err != nil {
			t.Errorf("ValidateID(%q): %v", id, err)
		}
	}
	for _, id := range bad {
		if err := store.ValidateID("session", id); err == nil {
			t.Errorf("ValidateID(%q) accepted", id)
		}
	}
	// Validate checks run and instance only for a child scope.
	if err := (store.Scope{Space: "s", Agent: "a", Session: "x", Run: "r"}).Validate(); err == nil {
		t.Errorf("a scope with a run and no instance was accepted")
	}
	if err := (store.Scope{Space: "s", Agent: "a", Session: "x", Instance: "i"}).Validate(); err == nil {
		t.Errorf("a scope with an instance and no run was accepted")
	}
}

func TestScopeHashAndDir(t *testing.T) {
	scopes := []store.Scope{
		{Space: "sp", Agent: "ag", Session: "se"},
		{Space: "sp", Agent: "ag", Session: "se", Run: "run-1", Instance: "sub-1"},
		{Space: "sp", Agent: "ag", Session: "se", Run: "run-2", Instance: "sub-1"},
		{Space: "sp", Agent: "ag", Session: "se", Run: "run-1", Instance: "sub-2"},
		{Space: "sp", Agent: "ag", Session: "se2"},
		{Space: "sp", Agent: "ag2", Session: "se"},
		{Space: "sp2", Agent: "ag", Session: "se"},
		// Same bytes, other boundaries.
		{Space: "spa", Agent: "g", Session: "se"},
		{Space: "sp", Agent: "a", Session: "gse"},
	}
	hashes := map[string]store.Scope{}
	dirs := map[string]store.Scope{}
	for _, sc := range scopes {
		h := sc.Hash()
		if h != sc.Hash() {
			t.Errorf("Hash of %s is not stable", sc)
		}
		if len(h) != 32 || strings.Trim(h, "0123456789abcdef") != "" {
			t.Errorf("Hash of %s = %q, want 32 hex digits", sc, h)
		}
		if prev, dup := hashes[h]; dup {
			t.Errorf("%s and %s share the hash %s", prev, sc, h)
		}
		hashes[h] = sc
		if prev, dup := dirs[sc.Dir()]; dup {
			t.Errorf("%s and %s share the directory %s", prev, sc, sc.Dir())
		}
		dirs[sc.Dir()] = sc
	}
	// The hash is part of the on-disk layout and of the lock protocol
	// between nodes (SPEC §7.2): it must not change within layout v1.
	if got, want := scopes[0].Hash(), pinnedMainHash; got != want {
		t.Errorf("Hash(sp/ag/se) = %s; layout v1 pins %s", got, want)
	}
	if got, want := scopes[0].Dir(), "spaces/sp/agents/ag/sessions/se/main"; got != want {
		t.Errorf("Dir(main) = %q, want %q", got, want)
	}
	if got, want := scopes[1].Dir(), "spaces/sp/agents/ag/sessions/se/runs/run-1/children/sub-1"; got != want {
		t.Errorf("Dir(child) = %q, want %q (a child's directory includes its run id)", got, want)
	}
	if !scopes[0].Main() || scopes[1].Main() {
		t.Errorf("Main() is wrong")
	}
}

// pinnedMainHash is the layout-v1 hash of sp/ag/se.
const pinnedMainHash = "1315dac549782198a1ad9f92d4bb6c5d"

// TestScopeIsolation: different sessions never share files; a session's
// main scope is the same across runs and volume openings; next run's
// sub-1 does not inherit this run's sub-1 (SPEC §2.1).
func TestScopeIsolation(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sessA := store.Scope{Space: "sp", Agent: "ag", Session: "a"}
	sessB := store.Scope{Space: "sp", Agent: "ag", Session: "b"}
	otherAgent := store.Scope{Space: "sp", Agent: "other", Session: "a"}
	otherSpace := store.Scope{Space: "sp2", Agent: "ag", Session: "a"}
	run1 := store.Scope{Space: "sp", Agent: "ag", Session: "a", Run: "run-1", Instance: "sub-1"}
	run2 := store.Scope{Space: "sp", Agent: "ag", Session: "a", Run: "run-2", Instance: "sub-1"}

	wsA := e.open(t, sessA, nil)
	wsR1 := e.open(t, run1, nil)
	if _, err := wsA.WriteFile(ctx, "a.txt", []byte("session a"), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := wsR1.WriteFile(ctx, "child.txt", []byte("run 1"), nil); err != nil {
		t.Fatal(err)
	}
	for _, sc := range []store.Scope{sessB, otherAgent, otherSpace, run2} {
		ws := e.open(t, sc, nil)
		for _, p := range []string{"a.txt", "child.txt"} {
			if _, _, err := ws.ReadFile(ctx, p); policy.CodeOf(err) != policy.NotFound {
				t.Errorf("%s sees %s of another scope: %v", sc, p, err)
			}
		}
		if ents, err := ws.ReadDir(ctx, "."); err != nil || len(ents) != 0 {
			t.Errorf("%s lists %v, %v; want an empty scope", sc, names(ents), err)
		}
	}
	// The child instance does not see the main scope's files, nor the
	// main scope the child's.
	if _, _, err := wsR1.ReadFile(ctx, "a.txt"); policy.CodeOf(err) != policy.NotFound {
		t.Errorf("a child sees the main scope's file: %v", err)
	}
	if _, _, err := wsA.ReadFile(ctx, "child.txt"); policy.CodeOf(err) != policy.NotFound {
		t.Errorf("the main scope sees a child's file: %v", err)
	}

	// The same session's main scope, opened again by another run (another
	// process, another volume handle), holds the same files.
	vol2, err := store.OpenVolume(ctx, store.Config{Root: e.root})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vol2.Close() })
	again, err := vol2.Open(ctx, sessA, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { again.Close() })
	if b, _, err := again.ReadFile(ctx, "a.txt"); err != nil || string(b) != "session a" {
		t.Errorf("the main scope reopened reads %q, %v", b, err)
	}
	if !strings.Contains(run1.Dir(), "run-1") || run1.Dir() == run2.Dir() {
		t.Errorf("child directories %q and %q do not separate runs", run1.Dir(), run2.Dir())
	}

	// Scope state (locks, markers, call records) lives outside every
	// scope, under the scope's hash.
	for _, sc := range []store.Scope{sessA, run1} {
		if _, err := os.Stat(filepath.Join(e.root, store.LocksDir, sc.Hash())); err != nil {
			t.Errorf("state directory of %s: %v", sc, err)
		}
	}
	codeIs(t, "Open of an invalid scope", func() error {
		_, err := e.vol.Open(ctx, store.Scope{Space: "..", Agent: "ag", Session: "x"}, nil)
		return err
	}(), policy.InvalidInput)
}

// TestReplay: BeginCall/FinishCall remember tool calls (SPEC §4).
func TestReplay(t *testing.T) {
	e := newEnv(t)
	ws := e.open(t, mainScope, nil)
	input := []byte(`{"path":"a.txt","content":"x"}`)

	rec, err := ws.BeginCall(context.Background(), "call-1", "workspace_write", input)
	if err != nil || rec != nil {
		t.Fatalf("first BeginCall = %+v, %v; want nothing recorded before", rec, err)
	}
	result := json.RawMessage(`{"bytes":1,"sha256":"abc","created":true}`)
	if err := ws.FinishCall("call-1", "workspace_write", input, result, nil); err != nil {
		t.Fatal(err)
	}

	t.Run("a recorded call id returns the recorded result", func(t *testing.T) {
		rec, err := ws.BeginCall(context.Background(), "call-1", "workspace_write", input)
		if err != nil || rec == nil {
			t.Fatalf("replay = %+v, %v", rec, err)
		}
		if rec.State != callrec.Done || string(rec.Result) != string(result) || rec.Error != nil {
			t.Errorf("replay = %+v; want the done record with its result", rec)
		}
		if rec.Started.IsZero() || rec.Finished.Before(rec.Started) {
			t.Errorf("replay times: started %v finished %v", rec.Started, rec.Finished)
		}
	})
	t.Run("a recorded refusal is replayed", func(t *testing.T) {
		in := []byte(`{"path":"../x"}`)
		if _, err := ws.BeginCall(context.Background(), "call-err", "workspace_read", in); err != nil {
			t.Fatal(err)
		}
		perr := policy.Errorf(policy.InvalidPath, "invalid path")
		if err := ws.FinishCall("call-err", "workspace_read", in, nil, perr); err != nil {
			t.Fatal(err)
		}
		rec, err := ws.BeginCall(context.Background(), "call-err", "workspace_read", in)
		if err != nil || rec == nil || rec.Error == nil || rec.Error.Code != policy.InvalidPath {
			t.Fatalf("replay of a refusal = %+v, %v", rec, err)
		}
	})
	t.Run("a call started but never finished returns the started record", func(t *testing.T) {
		in := []byte(`{"path":"b.txt","content":"y"}`)
		if rec, err := ws.BeginCall(context.Background(), "call-2", "workspace_write", in); err != nil || rec != nil {
			t.Fatalf("BeginCall = %+v, %v", rec, err)
		}
		// The process dies here. Another one, on another handle, replays.
		ws2 := e.openAnew(t, mainScope)
		rec, err := ws2.BeginCall(context.Background(), "call-2", "workspace_write", in)
		if err != nil || rec == nil || rec.State != callrec.Started || rec.Result != nil {
			t.Fatalf("replay of an unfinished call = %+v, %v; want the started record", rec, err)
		}
	})
	t.Run("the same id with a different input is a conflict", func(t *testing.T) {
		_, err := ws.BeginCall(context.Background(), "call-1", "workspace_write", []byte(`{"path":"a.txt","content":"other"}`))
		codeIs(t, "BeginCall with another input", err, policy.Conflict)
	})
	t.Run("the same id for another tool is a conflict", func(t *testing.T) {
		_, err := ws.BeginCall(context.Background(), "call-1", "workspace_delete", input)
		codeIs(t, "BeginCall for another tool", err, policy.Conflict)
	})
	t.Run("no call id records nothing", func(t *testing.T) {
		if rec, err := ws.BeginCall(context.Background(), "", "workspace_write", input); rec != nil || err != nil {
			t.Fatalf("BeginCall(\"\") = %+v, %v", rec, err)
		}
		if err := ws.FinishCall("", "workspace_write", input, result, nil); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("an over-long call id is refused", func(t *testing.T) {
		_, err := ws.BeginCall(context.Background(), strings.Repeat("x", 257), "workspace_write", input)
		codeIs(t, "BeginCall with a 257-byte id", err, policy.InvalidInput)
	})
	t.Run("call ids are scoped", func(t *testing.T) {
		other := e.open(t, childScope, nil)
		if rec, err := other.BeginCall(context.Background(), "call-1", "workspace_write", input); err != nil || rec != nil {
			t.Fatalf("another scope sees call-1: %+v, %v", rec, err)
		}
	})
	// Call records live outside the scope: nothing of them is visible.
	ents, err := ws.ReadDir(context.Background(), ".")
	if err != nil || len(ents) != 0 {
		t.Errorf("the scope lists %v, %v; call records must live outside it", names(ents), err)
	}
	var pe *policy.Error
	if _, err := ws.BeginCall(context.Background(), "call-1", "workspace_delete", input); !errors.As(err, &pe) || !strings.Contains(pe.Message, "new call id") {
		t.Errorf("conflict message %v does not tell the model what to do", err)
	}
}

// TestBeginCallRace: writers on separate handles (separate lock
// descriptions, as separate processes have) racing to begin the same call
// ids: each id is begun exactly once, and every other writer finds it.
func TestBeginCallRace(t *testing.T) {
	e := newEnv(t)
	const writers, ids = 6, 40
	wss := make([]*store.Workspace, writers)
	for i := range wss {
		wss[i] = e.openAnew(t, mainScope)
	}
	var begun [ids]atomic.Int32
	var wg sync.WaitGroup
	for _, ws := range wss {
		wg.Go(func() {
			for i := range ids {
				id := fmt.Sprintf("c-%d", i)
				rec, err := ws.BeginCall(context.Background(), id, "workspace_write", []byte("{}"))
				if err != nil {
					t.Error(err)
					return
				}
				if rec == nil {
					begun[i].Add(1)
					if err := ws.FinishCall(id, "workspace_write", []byte("{}"), json.RawMessage(`{}`), nil); err != nil {
						t.Error(err)
					}
				}
			}
		})
	}
	wg.Wait()
	for i := range begun {
		if n := begun[i].Load(); n != 1 {
			t.Errorf("call c-%d was begun %d times, want once", i, n)
		}
	}
}

// TestCallLogTornLine: a writer that died while appending leaves a line
// without its newline; readers ignore it, so a call whose "done" line was
// torn is still unfinished (unknown outcome), never half-read.
func TestCallLogTornLine(t *testing.T) {
	e := newEnv(t)
	ws := e.open(t, mainScope, nil)
	in := []byte("{}")
	if rec, err := ws.BeginCall(context.Background(), "c-1", "workspace_write", in); err != nil || rec != nil {
		t.Fatalf("BeginCall = %+v, %v", rec, err)
	}
	dir := filepath.Join(e.root, store.LocksDir, mainScope.Hash(), callrec.Dir)
	logs, err := filepath.Glob(filepath.Join(dir, "*.log"))
	if err != nil || len(logs) != 1 {
		t.Fatalf("call logs %v, %v; want one", logs, err)
	}
	f, err := os.OpenFile(logs[0], os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"call_id":"c-1","tool":"workspace_write","state":"done","res`)
	f.Close()
	ws2 := e.openAnew(t, mainScope)
	rec, err := ws2.BeginCall(context.Background(), "c-1", "workspace_write", in)
	if err != nil || rec == nil || rec.State != callrec.Started {
		t.Fatalf("after a torn line BeginCall = %+v, %v; want the started record", rec, err)
	}
	// The writer is gone: the next one takes its log over, and its lines
	// are whole after the torn one.
	ws.Close()
	if rec, err := ws2.BeginCall(context.Background(), "c-2", "workspace_write", in); err != nil || rec != nil {
		t.Fatalf("BeginCall c-2 = %+v, %v", rec, err)
	}
	if err := ws2.FinishCall("c-2", "workspace_write", in, json.RawMessage(`{"ok":1}`), nil); err != nil {
		t.Fatal(err)
	}
	if now, _ := filepath.Glob(filepath.Join(dir, "*.log")); len(now) != 1 {
		t.Errorf("call logs %v; want the ended writer's log taken over", now)
	}
	ws3 := e.open(t, mainScope, nil)
	if rec, err := ws3.BeginCall(context.Background(), "c-2", "workspace_write", in); err != nil || rec == nil || rec.State != callrec.Done || string(rec.Result) != `{"ok":1}` {
		t.Errorf("c-2 after the torn line = %+v, %v; want its done record", rec, err)
	}
	if rec, err := ws3.BeginCall(context.Background(), "c-1", "workspace_write", in); err != nil || rec == nil || rec.State != callrec.Started {
		t.Errorf("c-1 = %+v, %v; want still started", rec, err)
	}
}

// TestCallLogsBounded: writers that come and go (a process per call) take
// over the logs of ended ones; only writers alive at once need a log each.
func TestCallLogsBounded(t *testing.T) {
	e := newEnv(t)
	dir := filepath.Join(e.root, store.LocksDir, mainScope.Hash(), callrec.Dir)
	for i := range 50 {
		ws := e.open(t, mainScope, nil)
		id := fmt.Sprintf("c-%d", i)
		if rec, err := ws.BeginCall(context.Background(), id, "workspace_write", []byte("{}")); err != nil || rec != nil {
			t.Fatalf("BeginCall %s = %+v, %v", id, rec, err)
		}
		if err := ws.FinishCall(id, "workspace_write", []byte("{}"), json.RawMessage(`{}`), nil); err != nil {
			t.Fatal(err)
		}
		ws.Close()
	}
	a, b := e.open(t, mainScope, nil), e.open(t, mainScope, nil)
	for _, ws := range []*store.Workspace{a, b} {
		if rec, err := ws.BeginCall(context.Background(), "c-0", "workspace_write", []byte("{}")); err != nil || rec == nil || rec.State != callrec.Done {
			t.Fatalf("c-0 = %+v, %v; want done", rec, err)
		}
	}
	for i, ws := range []*store.Workspace{a, b} {
		if _, err := ws.BeginCall(context.Background(), fmt.Sprintf("live-%d", i), "workspace_write", []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	if len(logs) != 2 {
		t.Errorf("50 writers one after another and 2 at once left %d logs, want 2", len(logs))
	}
}
