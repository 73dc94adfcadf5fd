package tools

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentloom/loomfs/callrec"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// newBox opens a fresh main scope on a temporary local root.
func newBox(t testing.TB, pol *policy.Policy) (*Toolbox, string) {
	t.Helper()
	root := t.TempDir()
	vol, err := store.OpenVolume(context.Background(), store.Config{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vol.Close() })
	sc := store.Scope{Space: "sp", Agent: "ag", Session: "se"}
	ws, err := vol.Open(context.Background(), sc, pol)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	return &Toolbox{WS: ws}, filepath.Join(root, sc.Dir())
}

// call runs a tool with input given as a Go value.
func call(t *testing.T, tb *Toolbox, name string, in any) (map[string]any, error) {
	t.Helper()
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	res, err := tb.Call(context.Background(), name, "", b)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(res, &m); err != nil {
		t.Fatalf("%s result is not a JSON object: %s", name, res)
	}
	return m, nil
}

func mustCall(t *testing.T, tb *Toolbox, name string, in any) map[string]any {
	t.Helper()
	m, err := call(t, tb, name, in)
	if err != nil {
		t.Fatalf("%s %v: %v", name, in, err)
	}
	return m
}

func wantCode(t *testing.T, err error, code policy.Code) *policy.Error {
	t.Helper()
	if err == nil {
		t.Fatalf("want %s, got success", code)
	}
	pe := policy.AsError(err)
	if pe.Code != code {
		t.Fatalf("want code %s, got %s: %s", code, pe.Code, pe.Message)
	}
	if pe.Message == "" {
		t.Fatalf("%s refusal has no message", code)
	}
	return pe
}

func TestDefinitionsAreValidSchemas(t *testing.T) {
	defs := Definitions(policy.Default())
	if len(defs) != len(Names) {
		t.Fatalf("%d definitions for %d names", len(defs), len(Names))
	}
	for i, d := range defs {
		if d.Name != Names[i] {
			t.Errorf("definition %d is %s, want %s", i, d.Name, Names[i])
		}
		var s struct {
			Type       string                    `json:"type"`
			Properties map[string]map[string]any `json:"properties"`
			Required   []string                  `json:"required"`
		}
		if err := json.Unmarshal(d.InputSchema, &s); err != nil || s.Type != "object" {
			t.Errorf("%s: schema is not an object schema: %s", d.Name, d.InputSchema)
		}
		for _, r := range s.Required {
			if _, ok := s.Properties[r]; !ok {
				t.Errorf("%s: required %q is not a property", d.Name, r)
			}
		}
		if len(d.Description) < 40 {
			t.Errorf("%s: description too short", d.Name)
		}
	}
}

func TestDescriptionsNameLimitsAndRules(t *testing.T) {
	pol := policy.Default()
	if err := pol.SetRules([]policy.Rule{{Prefix: "data", Mode: policy.ModeRO}, {Prefix: "output", Mode: policy.ModeWO}}); err != nil {
		t.Fatal(err)
	}
	for _, d := range Definitions(pol) {
		if d.Name == Command || !takesPaths(d.Name) {
			continue
		}
		for _, want := range []string{"data/ read-only", "output/ write-only"} {
			if !strings.Contains(d.Description, want) {
				t.Errorf("%s description lacks %q", d.Name, want)
			}
		}
	}
	for _, d := range Definitions(pol) {
		if d.Name == Read && !strings.Contains(d.Description, "2 MiB") {
			t.Errorf("read description lacks the 2 MiB text limit: %s", d.Description)
		}
	}
}

func TestWriteReadStat(t *testing.T) {
	tb, dir := newBox(t, nil)
	w := mustCall(t, tb, Write, map[string]any{"path": "a.txt", "content": "one\ntwo\nthree\n"})
	if w["created"] != true || w["bytes"].(float64) != 14 {
		t.Fatalf("write: %v", w)
	}
	r := mustCall(t, tb, Read, map[string]any{"path": "a.txt", "offset": 2, "limit": 1})
	if r["content"] != "two\n" || r["total_lines"].(float64) != 3 || r["truncated"] != true || r["sha256"] != w["sha256"] {
		t.Fatalf("read: %v", r)
	}
	s := mustCall(t, tb, Stat, map[string]any{"path": "a.txt"})
	if s["sha256"] != w["sha256"] || s["type"] != "file" || s["mode"] != "0600" {
		t.Fatalf("stat: %v", s)
	}
	st, err := os.Stat(filepath.Join(dir, "a.txt"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("on disk: %v %v", st.Mode(), err)
	}
	w2 := mustCall(t, tb, Write, map[string]any{"path": "a.txt", "content": "x"})
	if w2["created"] != false {
		t.Fatalf("overwrite says created: %v", w2)
	}
}

func TestCAS(t *testing.T) {
	tb, _ := newBox(t, nil)
	_, err := call(t, tb, Write, map[string]any{"path": "c", "content": "1", "expected_sha256": "0000000000000000000000000000000000000000000000000000000000000000"})
	wantCode(t, err, policy.Conflict)
	w := mustCall(t, tb, Write, map[string]any{"path": "c", "content": "1", "expected_sha256": ""})
	_, err = call(t, tb, Write, map[string]any{"path": "c", "content": "2", "expected_sha256": ""})
	pe := wantCode(t, err, policy.Conflict)
	if pe.SHA256 != w["sha256"] {
		t.Fatalf("conflict carries %q, want current %v", pe.SHA256, w["sha256"])
	}
	mustCall(t, tb, Write, map[string]any{"path": "c", "content": "2", "expected_sha256": w["sha256"]})
	_, err = call(t, tb, Write, map[string]any{"path": "c", "content": "3", "expected_sha256": w["sha256"]})
	wantCode(t, err, policy.Conflict)
	_, err = call(t, tb, Delete, map[string]any{"path": "c", "expected_sha256": w["sha256"]})
	wantCode(t, err, policy.Conflict)
}

func TestEdit(t *testing.T) {
	tb, _ := newBox(t, nil)
	mustCall(t, tb, Write, map[string]any{"path": "e.txt", "content": "a b a\n"})
	cases := []struct {
		name string
		in   map[string]any
		code policy.Code
	}{
		{"ambiguous edit refused", map[string]any{"path": "e.txt", "old_text": "a", "new_text": "z"}, policy.AmbiguousEdit},
		{"no match", map[string]any{"path": "e.txt", "old_text": "q", "new_text": "z"}, policy.NoMatch},
		{"no-op edit refused", map[string]any{"path": "e.txt", "old_text": "a", "new_text": "a"}, policy.NoChange},
		{"empty old_text", map[string]any{"path": "e.txt", "old_text": "", "new_text": "a"}, policy.InvalidInput},
		{"stale expected hash", map[string]any{"path": "e.txt", "old_text": "b", "new_text": "c", "expected_sha256": strings.Repeat("0", 64)}, policy.Conflict},
		{"missing file", map[string]any{"path": "none.txt", "old_text": "b", "new_text": "c"}, policy.NotFound},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := call(t, tb, Edit, c.in)
			pe := wantCode(t, err, c.code)
			if c.code == policy.AmbiguousEdit && pe.Count != 2 {
				t.Fatalf("ambiguous edit count %d, want 2", pe.Count)
			}
		})
	}
	r := mustCall(t, tb, Edit, map[string]any{"path": "e.txt", "old_text": "b", "new_text": "B"})
	if r["replacements"].(float64) != 1 {
		t.Fatal(r)
	}
	r = mustCall(t, tb, Edit, map[string]any{"path": "e.txt", "old_text": "a", "new_text": "x", "replace_all": true})
	if r["replacements"].(float64) != 2 {
		t.Fatal(r)
	}
	got := mustCall(t, tb, Read, map[string]any{"path": "e.txt"})
	if got["content"] != "x B x\n" {
		t.Fatalf("content %q", got["content"])
	}
}

func TestMkdirDelete(t *testing.T) {
	tb, dir := newBox(t, nil)
	old := umask(0)
	t.Cleanup(func() { umask(old) })
	mustCall(t, tb, Mkdir, map[string]any{"path": "a/b/c", "parents": true})
	st, err := os.Stat(filepath.Join(dir, "a/b"))
	if err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("a/b mode %v %v", st.Mode(), err)
	}
	_, err = call(t, tb, Mkdir, map[string]any{"path": "a/b/c"})
	wantCode(t, err, policy.Exists)
	_, err = call(t, tb, Mkdir, map[string]any{"path": "x/y"})
	wantCode(t, err, policy.NotFound)
	_, err = call(t, tb, Delete, map[string]any{"path": "a/b"})
	wantCode(t, err, policy.NotEmpty)
	mustCall(t, tb, Delete, map[string]any{"path": "a/b/c"})
	_, err = call(t, tb, Delete, map[string]any{"path": "."})
	wantCode(t, err, policy.PermissionDenied)
	_, err = call(t, tb, Mkdir, map[string]any{"path": "subagents"})
	wantCode(t, err, policy.InvalidPath)
}

func TestLimits(t *testing.T) {
	pol := policy.Default()
	pol.Limits.ListEntries = 3
	pol.Limits.GlobResults = 2
	pol.Limits.GrepMatches = 4
	tb, dir := newBox(t, pol)
	big := strings.Repeat("x", 2<<20+1)
	_, err := call(t, tb, Write, map[string]any{"path": "big", "content": big})
	pe := wantCode(t, err, policy.TooLarge)
	if !strings.Contains(pe.Message, "2 MiB") {
		t.Fatalf("message lacks the limit: %s", pe.Message)
	}
	os.WriteFile(filepath.Join(dir, "big"), []byte(big), 0o600)
	_, err = call(t, tb, Read, map[string]any{"path": "big"})
	wantCode(t, err, policy.TooLarge)
	os.WriteFile(filepath.Join(dir, "bin"), []byte("match\x00match\n"), 0o600)
	for i := range 5 {
		mustCall(t, tb, Write, map[string]any{"path": fmt.Sprintf("f%d.txt", i), "content": "match\nmatch\n"})
	}
	l := mustCall(t, tb, List, map[string]any{})
	if l["truncated"] != true || len(l["entries"].([]any)) != 3 {
		t.Fatalf("list not truncated: %v", l)
	}
	g := mustCall(t, tb, Glob, map[string]any{"pattern": "*.txt"})
	if g["truncated"] != true || len(g["matches"].([]any)) != 2 {
		t.Fatalf("glob not truncated: %v", g)
	}
	r := mustCall(t, tb, Grep, map[string]any{"pattern": "match"})
	if r["truncated"] != true || len(r["matches"].([]any)) != 4 || r["skipped_binary"].(float64) != 1 || r["skipped_large"].(float64) != 1 {
		t.Fatalf("grep: %v", r)
	}
}

func TestGrepBacktrackingTimeout(t *testing.T) {
	pol := policy.Default()
	pol.Limits.GrepBudget = 2 * time.Second
	tb, _ := newBox(t, pol)
	mustCall(t, tb, Write, map[string]any{"path": "long.txt", "content": strings.Repeat("a", 5000) + "c\n"})
	mustCall(t, tb, Write, map[string]any{"path": "long2.txt", "content": strings.Repeat("a", 5000) + "\n"})
	// RE2 runs (a+)+$ in linear time: an answer, not a timeout.
	r := mustCall(t, tb, Grep, map[string]any{"pattern": "(a+)+$"})
	if ms := r["matches"].([]any); len(ms) != 1 || ms[0].(map[string]any)["path"] != "long2.txt" {
		t.Fatalf("(a+)+$ under RE2: %v", r)
	}
	// Lookahead needs the backtracking engine, where (a+)+ explodes: the
	// per-match timeout turns it into a timeout refusal.
	_, err := call(t, tb, Grep, map[string]any{"pattern": "(a+)+(?=b)"})
	pe := wantCode(t, err, policy.Timeout)
	if strings.Contains(pe.Message, "aaaa") {
		t.Fatal("timeout message echoes searched text")
	}
	// Backreferences work.
	mustCall(t, tb, Write, map[string]any{"path": "dup.txt", "content": "hello hello\nhello world\n"})
	r = mustCall(t, tb, Grep, map[string]any{"pattern": `(\w+) \1`, "glob": "dup.txt"})
	if ms := r["matches"].([]any); len(ms) != 1 || ms[0].(map[string]any)["line"].(float64) != 1 {
		t.Fatalf("backreference: %v", r)
	}
}

func TestGrepContextGlobAndCase(t *testing.T) {
	tb, _ := newBox(t, nil)
	mustCall(t, tb, Mkdir, map[string]any{"path": "src/pkg", "parents": true})
	mustCall(t, tb, Write, map[string]any{"path": "src/pkg/a.go", "content": "l1\nl2\nNeedle\nl4\nl5\n"})
	mustCall(t, tb, Write, map[string]any{"path": "src/b.py", "content": "needle\n"})
	r := mustCall(t, tb, Grep, map[string]any{"pattern": "needle", "ignore_case": true, "glob": "**/*.go", "context": 1})
	ms := r["matches"].([]any)
	if len(ms) != 1 {
		t.Fatalf("grep: %v", r)
	}
	m := ms[0].(map[string]any)
	if m["path"] != "src/pkg/a.go" || m["line"].(float64) != 3 || fmt.Sprint(m["before"]) != "[l2]" || fmt.Sprint(m["after"]) != "[l4]" {
		t.Fatalf("match: %v", m)
	}
	g := mustCall(t, tb, Glob, map[string]any{"pattern": "**/*.py"})
	if fmt.Sprint(g["matches"]) != "[src/b.py]" {
		t.Fatalf("glob: %v", g)
	}
	g = mustCall(t, tb, Glob, map[string]any{"pattern": "*", "path": "src"})
	if fmt.Sprint(g["matches"]) != "[src/b.py src/pkg]" {
		t.Fatalf("glob in src: %v", g)
	}
}

func TestInputErrors(t *testing.T) {
	tb, _ := newBox(t, nil)
	cases := []struct {
		name, tool, input string
		code              policy.Code
	}{
		{"unknown field", Read, `{"path":"a","bogus":1}`, policy.InvalidInput},
		{"wrong type", Read, `{"path":1}`, policy.InvalidInput},
		{"not an object", Read, `[1]`, policy.InvalidInput},
		{"trailing data", Read, `{"path":"a"} x`, policy.InvalidInput},
		{"missing content", Write, `{"path":"a"}`, policy.InvalidInput},
		{"missing new_text", Edit, `{"path":"a","old_text":"x"}`, policy.InvalidInput},
		{"missing path", Edit, `{"old_text":"x","new_text":"y"}`, policy.InvalidInput},
		{"missing pattern", Grep, `{}`, policy.InvalidInput},
		{"absolute path", Read, `{"path":"/etc/passwd"}`, policy.InvalidPath},
		{"dotdot", Write, `{"path":"a/../../x","content":""}`, policy.InvalidPath},
		{"reserved", Write, `{"path":".agentloom-locks/x","content":""}`, policy.InvalidPath},
		{"glob escape", Glob, `{"pattern":"../*"}`, policy.InvalidInput},
		{"bad regex", Grep, `{"pattern":"("}`, policy.InvalidInput},
		{"unknown tool", "nope", `{}`, policy.InvalidInput},
		{"command without sandbox", Command, `{"command":"true"}`, policy.SandboxUnavailable},
		{"command timeout out of range", Command, `{"command":"true","timeout_s":500}`, policy.InvalidInput},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := tb.Call(context.Background(), c.tool, "", json.RawMessage(c.input))
			wantCode(t, err, c.code)
		})
	}
}

func TestReplay(t *testing.T) {
	tb, _ := newBox(t, nil)
	ctx := context.Background()
	in := json.RawMessage(`{"path":"r.txt","content":"v1"}`)
	first, err := tb.Call(ctx, Write, "call-1", in)
	if err != nil {
		t.Fatal(err)
	}
	// Someone else changes the file; the replay must not write again.
	mustCall(t, tb, Write, map[string]any{"path": "r.txt", "content": "v2"})
	again, err := tb.Call(ctx, Write, "call-1", in)
	if err != nil || string(again) != string(first) {
		t.Fatalf("replay: %s %v, want %s", again, err, first)
	}
	if r := mustCall(t, tb, Read, map[string]any{"path": "r.txt"}); r["content"] != "v2" {
		t.Fatalf("replay re-executed the write: %v", r["content"])
	}
	// Same id, different input.
	_, err = tb.Call(ctx, Write, "call-1", json.RawMessage(`{"path":"r.txt","content":"v3"}`))
	wantCode(t, err, policy.Conflict)
	// A write that started and never finished is not re-run.
	if _, err := tb.WS.BeginCall(context.Background(), "call-2", Write, json.RawMessage(`{"path":"u.txt","content":"x"}`)); err != nil {
		t.Fatal(err)
	}
	_, err = tb.Call(ctx, Write, "call-2", json.RawMessage(`{"path":"u.txt","content":"x"}`))
	wantCode(t, err, policy.UnknownOutcome)
	if _, err := call(t, tb, Read, map[string]any{"path": "u.txt"}); policy.CodeOf(err) != policy.NotFound {
		t.Fatalf("unknown-outcome write was executed: %v", err)
	}
	// A refusal of a change is recorded and replayed too.
	_, err = tb.Call(ctx, Delete, "call-3", json.RawMessage(`{"path":"missing"}`))
	wantCode(t, err, policy.NotFound)
	mustCall(t, tb, Write, map[string]any{"path": "missing", "content": "now"})
	_, err = tb.Call(ctx, Delete, "call-3", json.RawMessage(`{"path":"missing"}`))
	wantCode(t, err, policy.NotFound)
	if r := mustCall(t, tb, Read, map[string]any{"path": "missing"}); r["content"] != "now" {
		t.Fatalf("replay re-executed the delete: %v", r["content"])
	}
	// A read is not recorded: replaying it reads again.
	_, err = tb.Call(ctx, Read, "call-4", json.RawMessage(`{"path":"later"}`))
	wantCode(t, err, policy.NotFound)
	mustCall(t, tb, Write, map[string]any{"path": "later", "content": "here"})
	out, err := tb.Call(ctx, Read, "call-4", json.RawMessage(`{"path":"later"}`))
	if err != nil || !strings.Contains(string(out), `"here"`) {
		t.Fatalf("replayed read = %s, %v; want the file read again", out, err)
	}
}

// callFiles lists the files under the scope's call records.
func callFiles(t *testing.T, tb *Toolbox) []string {
	t.Helper()
	dir := filepath.Join(tb.WS.Volume().Path(), store.LocksDir, tb.WS.Scope().Hash(), callrec.Dir)
	ents, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// callBytes sums the sizes of the files of call records.
func callBytes(t *testing.T, tb *Toolbox) int64 {
	t.Helper()
	dir := filepath.Join(tb.WS.Volume().Path(), store.LocksDir, tb.WS.Scope().Hash(), callrec.Dir)
	var n int64
	for _, name := range callFiles(t, tb) {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		n += fi.Size()
	}
	return n
}

// TestReadsRecordNothing: no read-only tool leaves a call record.
func TestReadsRecordNothing(t *testing.T) {
	tb, root := newBox(t, nil)
	ctx := context.Background()
	mustCall(t, tb, Mkdir, map[string]any{"path": "d"})
	if _, err := tb.Call(ctx, Write, "w-1", json.RawMessage(`{"path":"d/a.txt","content":"x"}`)); err != nil {
		t.Fatal(err)
	}
	before := callBytes(t, tb)
	reads := []struct {
		name string
		in   string
	}{
		{List, `{"path":"d"}`},
		{Stat, `{"path":"d/a.txt"}`},
		{Glob, `{"pattern":"**/*.txt"}`},
		{Grep, `{"pattern":"x"}`},
		{Read, `{"path":"d/a.txt"}`},
		{ReadImage, `{"path":"d/a.png"}`},
		{Changes, `{"since":""}`},
		{ForkStatus, `{}`},
		// No process service here: refused, and still nothing recorded.
		{ProcessRead, `{"process_id":"p-1"}`},
		{ProcessList, `{}`},
	}
	writePNG(t, filepath.Join(root, "d/a.png"), 4, 4)
	for i, r := range reads {
		if Mutating(r.name) {
			t.Fatalf("%s is listed as mutating", r.name)
		}
		if _, err := tb.Call(ctx, r.name, fmt.Sprintf("read-%d", i), json.RawMessage(r.in)); err != nil && policy.CodeOf(err) != policy.ProcessServiceUnavailable {
			t.Fatalf("%s: %v", r.name, err)
		}
	}
	for _, name := range Names {
		if !Mutating(name) && !strings.Contains(fmt.Sprint(reads), name) {
			t.Errorf("read-only tool %s is not covered", name)
		}
	}
	if after := callBytes(t, tb); after != before {
		t.Errorf("reads changed the call records: %d bytes -> %d", before, after)
	}
	// A read never begins a call record: the id is still free.
	if rec, err := tb.WS.BeginCall(context.Background(), "read-0", List, []byte(`{"path":"d"}`)); err != nil || rec != nil {
		t.Errorf("a read left a call record: %+v, %v", rec, err)
	}
}

// TestCallRecordsBounded: a long session adds lines to a log, not a file
// per call.
func TestCallRecordsBounded(t *testing.T) {
	tb, _ := newBox(t, nil)
	ctx := context.Background()
	const n = 10000
	for i := range n {
		name, in := Read, `{"path":"f.txt"}`
		if i%2 == 0 {
			name, in = Write, fmt.Sprintf(`{"path":"f.txt","content":"%d"}`, i)
		}
		if _, err := tb.Call(ctx, name, fmt.Sprintf("c-%d", i), json.RawMessage(in)); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if files := callFiles(t, tb); len(files) > 2 {
		t.Errorf("%d calls left %d files of call records, want at most 2: %v", n, len(files), files[:min(len(files), 5)])
	}
	// Every write is still replayed from its record.
	out, err := tb.Call(ctx, Write, "c-0", json.RawMessage(`{"path":"f.txt","content":"0"}`))
	if err != nil || !strings.Contains(string(out), `"bytes":1`) {
		t.Errorf("replay of the first write = %s, %v", out, err)
	}
}

func TestPathModes(t *testing.T) {
	pol := policy.Default()
	if err := pol.SetRules([]policy.Rule{{Prefix: "data", Mode: policy.ModeRO}, {Prefix: "output", Mode: policy.ModeWO}, {Prefix: ".meta", Mode: policy.ModeHidden}}); err != nil {
		t.Fatal(err)
	}
	tb, dir := newBox(t, pol)
	for _, d := range []string{"data", "output", ".meta"} {
		os.Mkdir(filepath.Join(dir, d), 0o700)
	}
	os.WriteFile(filepath.Join(dir, "data/in.txt"), []byte("input\n"), 0o600)
	os.WriteFile(filepath.Join(dir, ".meta/secret"), []byte("s\n"), 0o600)

	_, err := call(t, tb, Write, map[string]any{"path": "data/x", "content": "x"})
	wantCode(t, err, policy.ReadOnly)
	_, err = call(t, tb, Delete, map[string]any{"path": "data/in.txt"})
	wantCode(t, err, policy.ReadOnly)
	mustCall(t, tb, Read, map[string]any{"path": "data/in.txt"})

	mustCall(t, tb, Write, map[string]any{"path": "output/r.txt", "content": "result"})
	_, err = call(t, tb, Read, map[string]any{"path": "output/r.txt"})
	wantCode(t, err, policy.PermissionDenied)
	if s := mustCall(t, tb, Stat, map[string]any{"path": "output/r.txt"}); s["sha256"] != nil {
		t.Fatalf("stat of a write-only file leaks its hash: %v", s)
	}

	_, err = call(t, tb, Read, map[string]any{"path": ".meta/secret"})
	wantCode(t, err, policy.NotFound)
	l := mustCall(t, tb, List, map[string]any{})
	for _, e := range l["entries"].([]any) {
		if e.(map[string]any)["name"] == ".meta" {
			t.Fatal("hidden .meta listed")
		}
	}
	g := mustCall(t, tb, Grep, map[string]any{"pattern": "."})
	for _, m := range g["matches"].([]any) {
		if p := m.(map[string]any)["path"].(string); strings.HasPrefix(p, ".meta") || strings.HasPrefix(p, "output") {
			t.Fatalf("grep read %s", p)
		}
	}
}

func TestRefusesPlantedObjects(t *testing.T) {
	tb, dir := newBox(t, nil)
	outside := filepath.Join(t.TempDir(), "canary")
	os.WriteFile(outside, []byte("CANARY\n"), 0o600)
	os.Symlink(outside, filepath.Join(dir, "link"))
	os.Link(outside, filepath.Join(dir, "hard"))
	cases := []struct {
		name, path string
		code       policy.Code
	}{{"symlink leaving the scope", "link", policy.SymlinkRefused}, {"hardlink to a file outside", "hard", policy.HardlinkRefused}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, op := range []struct {
				tool string
				in   map[string]any
			}{
				{Read, map[string]any{"path": c.path}},
				{Write, map[string]any{"path": c.path, "content": "x"}},
				{Edit, map[string]any{"path": c.path, "old_text": "CANARY", "new_text": "x"}},
				{Delete, map[string]any{"path": c.path}},
			} {
				_, err := call(t, tb, op.tool, op.in)
				wantCode(t, err, c.code)
			}
			s := mustCall(t, tb, Stat, map[string]any{"path": c.path})
			if s["sha256"] != nil || s["refused"] != string(c.code) {
				t.Fatalf("stat: %v", s)
			}
		})
	}
	g := mustCall(t, tb, Grep, map[string]any{"pattern": "CANARY"})
	if len(g["matches"].([]any)) != 0 {
		t.Fatalf("grep followed a planted object: %v", g)
	}
	if b, _ := os.ReadFile(outside); string(b) != "CANARY\n" {
		t.Fatal("canary changed")
	}
}

// stuckRunner ignores its context, as a system call blocked on a hung
// server would.
type stuckRunner struct{ release chan struct{} }

func (s stuckRunner) RunCommand(ctx context.Context, ws *store.Workspace, req CommandRequest) (CommandResult, error) {
	<-s.release
	return CommandResult{}, nil
}

// TestBudgetBoundsABlockedHandler: a handler that can't be interrupted
// still answers the caller within its budget, as unknown_outcome for a
// change.
func TestBudgetBoundsABlockedHandler(t *testing.T) {
	tb, _ := newBox(t, nil)
	stuck := stuckRunner{release: make(chan struct{})}
	t.Cleanup(func() { close(stuck.release); tb.Wait() })
	tb.Commands = stuck
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := tb.Call(ctx, Command, "", json.RawMessage(`{"command":"sleep 1000"}`))
	wantCode(t, err, policy.UnknownOutcome)
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the caller waited %v for a blocked handler", d)
	}
}
