package stage_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/changes"
	"github.com/agentloom/loomfs/mcpserver"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/stage"
	"github.com/agentloom/loomfs/store"
	"github.com/agentloom/loomfs/tools"
)

// memSink keeps audit records.
type memSink struct {
	mu     sync.Mutex
	events []audit.Event
}

func (s *memSink) Record(_ context.Context, e audit.Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, e)
	return nil
}

// env is one standard-preset scope, the agent's tools over it and the
// platform's door.
type env struct {
	ws    *store.Workspace
	dir   string // the scope on the backing store
	box   *tools.Toolbox
	door  *stage.Platform
	audit *memSink
}

func newEnv(t testing.TB, adjust func(*policy.Policy)) *env {
	t.Helper()
	ctx := context.Background()
	root := t.TempDir()
	vol, err := store.OpenVolume(ctx, store.Config{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vol.Close() })
	pol, _ := policy.Preset("standard")
	if adjust != nil {
		adjust(pol)
	}
	sc := store.Scope{Space: "sp", Agent: "ag", Session: "se"}
	ws, err := vol.Open(ctx, sc, pol)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	sink := &memSink{}
	return &env{
		ws:    ws,
		dir:   filepath.Join(root, sc.Dir()),
		box:   &tools.Toolbox{WS: ws},
		door:  &stage.Platform{WS: ws, Audit: sink, Actor: audit.Actor{Space: "sp", Agent: "ag", Session: "se", Operator: "ci-bot"}},
		audit: sink,
	}
}

func (e *env) tool(t *testing.T, name string, in any) (map[string]any, error) {
	t.Helper()
	b, _ := json.Marshal(in)
	res, err := e.box.Call(context.Background(), name, "", b)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	json.Unmarshal(res, &m)
	return m, nil
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func paths[T any](list []T, path func(T) string) []string {
	var out []string
	for _, x := range list {
		out = append(out, path(x))
	}
	return out
}

// TestStageRefusesWhatTheRulesRefuse: staging a tree with a symlink, a
// FIFO, a hard-linked file and an oversize file into data/ stages the
// rest and lists the refused ones with their codes.
func TestStageRefusesWhatTheRulesRefuse(t *testing.T) {
	e := newEnv(t, func(p *policy.Policy) { p.Limits.FileBytes = 1 << 20 })
	src := t.TempDir()
	write(t, filepath.Join(src, "in.csv"), "a,b\n1,2\n")
	write(t, filepath.Join(src, "sub/more.txt"), "more")
	write(t, filepath.Join(src, "run.sh"), "#!/bin/sh\n")
	os.Chmod(filepath.Join(src, "run.sh"), 0o755)
	os.Symlink("/etc/passwd", filepath.Join(src, "link"))
	unix.Mkfifo(filepath.Join(src, "fifo"), 0o600)
	write(t, filepath.Join(src, "big.bin"), strings.Repeat("x", 2<<20))
	write(t, filepath.Join(src, "shared"), "s")
	os.Link(filepath.Join(src, "shared"), filepath.Join(src, "shared2"))

	res, err := e.door.Stage(context.Background(), "data", stage.Path(src))
	if err != nil {
		t.Fatal(err)
	}
	staged := paths(res.Staged, func(s stage.Staged) string { return s.Path })
	if want := []string{"data/in.csv", "data/run.sh", "data/sub", "data/sub/more.txt"}; !slices.Equal(staged, want) {
		t.Errorf("staged %q, want %q", staged, want)
	}
	codes := map[string]policy.Code{}
	for _, r := range res.Refused {
		codes[r.Path] = r.Code
	}
	want := map[string]policy.Code{
		"data/link":    policy.SymlinkRefused,
		"data/fifo":    policy.SpecialFileRefused,
		"data/big.bin": policy.TooLarge,
		"data/shared":  policy.HardlinkRefused,
		"data/shared2": policy.HardlinkRefused,
	}
	if len(codes) != len(want) {
		t.Errorf("refused %v, want %v", codes, want)
	}
	for p, c := range want {
		if codes[p] != c {
			t.Errorf("%s: refused with %q, want %q", p, codes[p], c)
		}
	}
	for _, r := range res.Refused {
		if r.Code == policy.TooLarge && !strings.Contains(r.Message, "2 MiB") || r.Message == "" {
			t.Errorf("refusal without its figures: %+v", r)
		}
	}
	for _, p := range []string{"link", "fifo", "big.bin", "shared"} {
		if _, err := os.Lstat(filepath.Join(e.dir, "data", p)); err == nil {
			t.Errorf("refused %s is in the scope", p)
		}
	}
	st, err := os.Stat(filepath.Join(e.dir, "data/run.sh"))
	if err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("run.sh: %v %v (owner bits kept, 0700)", st, err)
	}
	// Audited as the platform's, with the operator.
	var objects int
	for _, ev := range e.audit.events {
		if ev.Source != audit.SourcePlatform || ev.Actor.Operator != "ci-bot" {
			t.Errorf("record %+v: want source platform and operator ci-bot", ev)
		}
		if ev.Op == "stage_object" {
			objects++
		}
	}
	if objects != len(res.Staged)+len(res.Refused) {
		t.Errorf("%d object records for %d objects", objects, len(res.Staged)+len(res.Refused))
	}
}

// TestAgentReadsStagedInputsButCantChangeThem: what the platform stages
// into data/ the agent reads through the tools, and can't write, replace
// or delete; .meta/ staged by the platform is invisible to it.
func TestAgentReadsStagedInputsButCantChangeThem(t *testing.T) {
	e := newEnv(t, nil)
	src := t.TempDir()
	write(t, filepath.Join(src, "in.csv"), "a,b\n")
	meta := t.TempDir()
	write(t, filepath.Join(meta, "task.json"), `{"task":1}`)
	ctx := context.Background()
	if res, err := e.door.Stage(ctx, "data", stage.Path(filepath.Join(src, "in.csv"))); err != nil || len(res.Refused) > 0 {
		t.Fatalf("stage: %v %+v", err, res)
	}
	if res, err := e.door.Stage(ctx, ".meta", stage.Path(meta)); err != nil || len(res.Refused) > 0 {
		t.Fatalf("stage .meta: %v %+v", err, res)
	}
	m, err := e.tool(t, tools.Read, map[string]any{"path": "data/in.csv"})
	if err != nil || m["content"] != "a,b\n" {
		t.Fatalf("agent read: %v %v", m, err)
	}
	for _, c := range []struct {
		tool string
		in   map[string]any
		code policy.Code
	}{
		{tools.Write, map[string]any{"path": "data/in.csv", "content": "x"}, policy.ReadOnly},
		{tools.Edit, map[string]any{"path": "data/in.csv", "old_text": "a", "new_text": "b"}, policy.ReadOnly},
		{tools.Delete, map[string]any{"path": "data/in.csv"}, policy.ReadOnly},
		{tools.Read, map[string]any{"path": ".meta/task.json"}, policy.NotFound},
		{tools.List, map[string]any{"path": ".meta"}, policy.NotFound},
		{tools.Stat, map[string]any{"path": ".meta/task.json"}, policy.NotFound},
		{tools.Write, map[string]any{"path": ".meta/task.json", "content": "x"}, policy.NotFound},
	} {
		if _, err := e.tool(t, c.tool, c.in); policy.CodeOf(err) != c.code {
			t.Errorf("%s %v: %v, want %s", c.tool, c.in, err, c.code)
		}
	}
	m, _ = e.tool(t, tools.Glob, map[string]any{"pattern": "**"})
	if matches, _ := m["matches"].([]any); len(matches) == 0 || strings.Contains(strings.Join(paths(matches, func(p any) string { return p.(string) }), " "), ".meta") {
		t.Errorf("glob shows .meta: %v", m)
	}
	if b, _ := os.ReadFile(filepath.Join(e.dir, ".meta/task.json")); string(b) != `{"task":1}` {
		t.Errorf(".meta/task.json on the store: %q", b)
	}
}

// TestCollectOutput: the agent's output/ files (write-only for it) are
// collected by the platform, to a directory and as a tar stream, with the
// artifacts' object checks and cap.
func TestCollectOutput(t *testing.T) {
	e := newEnv(t, nil)
	if _, err := e.tool(t, tools.Write, map[string]any{"path": "output/run1/result.json", "content": `{"ok":true}`}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.tool(t, tools.Read, map[string]any{"path": "output/run1/result.json"}); policy.CodeOf(err) != policy.PermissionDenied {
		t.Fatalf("agent read back of output/: %v", err)
	}
	os.Symlink("/etc/passwd", filepath.Join(e.dir, "output/planted"))
	write(t, filepath.Join(e.dir, "output/huge.bin"), strings.Repeat("x", store.MaxArtifactBytes+1))

	dest := filepath.Join(t.TempDir(), "out")
	sink, err := stage.ToDir(dest)
	if err != nil {
		t.Fatal(err)
	}
	c, err := e.door.Collect(context.Background(), "output", sink)
	sink.Close()
	if err != nil {
		t.Fatal(err)
	}
	if got := paths(c.Collected, func(c stage.Collected) string { return c.Path }); !slices.Equal(got, []string{"run1/result.json"}) {
		t.Errorf("collected %q", got)
	}
	refused := map[string]policy.Code{}
	for _, r := range c.Refused {
		refused[r.Path] = r.Code
	}
	if refused["planted"] != policy.SymlinkRefused || refused["huge.bin"] != policy.TooLarge {
		t.Errorf("refused %v", refused)
	}
	if b, _ := os.ReadFile(filepath.Join(dest, "run1/result.json")); string(b) != `{"ok":true}` {
		t.Errorf("collected content %q", b)
	}
	// Again into the same directory: nothing is replaced.
	sink, _ = stage.ToDir(dest)
	c, err = e.door.Collect(context.Background(), "output", sink)
	sink.Close()
	if err != nil || len(c.Collected) != 0 || !slices.ContainsFunc(c.Refused, func(r stage.Refused) bool { return r.Code == policy.Exists }) {
		t.Errorf("second collect into the same directory: %v %+v", err, c)
	}

	// As a tar stream.
	var buf bytes.Buffer
	ts := stage.ToTar(&buf)
	if _, err := e.door.Collect(context.Background(), "output", ts); err != nil {
		t.Fatal(err)
	}
	ts.Close()
	tr := tar.NewReader(&buf)
	var names []string
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		names = append(names, h.Name)
	}
	if !slices.Equal(names, []string{"run1/", "run1/result.json"}) {
		t.Errorf("tar entries %q", names)
	}
}

// TestStagePastQuota: staging past the scope quota is refused with the
// figures and leaves no partial file.
func TestStagePastQuota(t *testing.T) {
	e := newEnv(t, func(p *policy.Policy) { p.Limits.ScopeBytes = 1 << 20 })
	src := t.TempDir()
	write(t, filepath.Join(src, "a.bin"), strings.Repeat("a", 600<<10))
	write(t, filepath.Join(src, "b.bin"), strings.Repeat("b", 600<<10))
	res, err := e.door.Stage(context.Background(), "data", stage.Path(src))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Staged) != 1 || len(res.Refused) != 1 {
		t.Fatalf("staged %+v refused %+v", res.Staged, res.Refused)
	}
	r := res.Refused[0]
	if r.Code != policy.QuotaExceeded || !strings.Contains(r.Message, "workspace total 1 MiB") || !strings.Contains(r.Message, "write of 600 KiB refused") {
		t.Errorf("refusal %+v: want the quota's figures", r)
	}
	names, _ := os.ReadDir(filepath.Join(e.dir, "data"))
	if len(names) != 1 || names[0].Name() != "a.bin" {
		t.Errorf("data/ holds %v: want a.bin alone, no partial or temporary file", names)
	}
}

// TestStageTar: a tar stream is staged entry by entry; its symlink becomes
// an emulated link (the policy emulates them), and a hard link, a device,
// an absolute name and ".." are refused.
func TestStageTar(t *testing.T) {
	e := newEnv(t, nil)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(h *tar.Header, body string) {
		h.Size = int64(len(body))
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		tw.WriteHeader(h)
		tw.Write([]byte(body))
	}
	add(&tar.Header{Typeflag: tar.TypeReg, Name: "./cfg/task.json"}, `{}`)
	add(&tar.Header{Typeflag: tar.TypeSymlink, Name: "cfg/current", Linkname: "task.json"}, "")
	add(&tar.Header{Typeflag: tar.TypeLink, Name: "cfg/hard", Linkname: "cfg/task.json"}, "")
	add(&tar.Header{Typeflag: tar.TypeChar, Name: "cfg/null"}, "")
	add(&tar.Header{Typeflag: tar.TypeReg, Name: "../escape"}, "x")
	add(&tar.Header{Typeflag: tar.TypeReg, Name: "/abs"}, "x")
	add(&tar.Header{Typeflag: tar.TypeReg, Name: "suid", Mode: 0o4755}, "x")
	tw.Close()
	res, err := e.door.Stage(context.Background(), ".meta", stage.Tar("-", &buf))
	if err != nil {
		t.Fatal(err)
	}
	if got := paths(res.Staged, func(s stage.Staged) string { return s.Type + " " + s.Path }); !slices.Equal(got, []string{"file .meta/cfg/task.json", "symlink .meta/cfg/current"}) {
		t.Errorf("staged %q", got)
	}
	if len(res.Refused) != 5 {
		t.Errorf("refused %+v, want 5", res.Refused)
	}
	if fi, err := os.Lstat(filepath.Join(e.dir, ".meta/cfg/current")); err != nil || fi.Mode()&os.ModeSymlink != 0 || fi.Mode()&os.ModeSticky == 0 {
		t.Errorf("the link on the store: %v %v (want an inert marked file, never a symlink)", fi, err)
	}
	// A broken stream stops with an error and keeps what was staged.
	if _, err := e.door.Stage(context.Background(), "data", stage.Tar("-", strings.NewReader("not a tar stream, just bytes that go on"+strings.Repeat(".", 600)))); policy.CodeOf(err) != policy.InvalidInput {
		t.Errorf("corrupt tar: %v", err)
	}
}

// TestStagedChangesAreThePlatforms: every change staging makes, the
// directories and links as well as the files, from a host tree and from
// a tar stream, is in the change feed with source platform.
func TestStagedChangesAreThePlatforms(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	start, err := changes.Read(ctx, e.ws, changes.Query{})
	if err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	write(t, filepath.Join(src, "a/b/in.csv"), "a,b\n")
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "cfg/", Mode: 0o755})
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "deep/er/task.json", Mode: 0o644, Size: 2})
	tw.Write([]byte("{}"))
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "cfg/current", Linkname: "../deep/er/task.json"})
	tw.Close()
	for _, c := range []struct {
		into string
		src  stage.Source
	}{
		{"data/inputs", stage.Path(src)},
		{"src/tarred", stage.Tar("-", &buf)},
	} {
		if res, err := e.door.Stage(ctx, c.into, c.src); err != nil || len(res.Refused) > 0 {
			t.Fatalf("stage into %s: %v %+v", c.into, err, res)
		}
	}
	p, err := changes.Read(ctx, e.ws, changes.Query{Since: start.Cursor})
	if err != nil {
		t.Fatal(err)
	}
	ops := map[string]string{}
	for _, ev := range p.Changes {
		ops[ev.Path] = ev.Op
		if ev.Source != store.SourcePlatform {
			t.Errorf("%s %s: source %q, want %q", ev.Op, ev.Path, ev.Source, store.SourcePlatform)
		}
	}
	want := map[string]string{
		"data/inputs": "mkdir", "data/inputs/a": "mkdir", "data/inputs/a/b": "mkdir", "data/inputs/a/b/in.csv": "create",
		"src/tarred": "mkdir", "src/tarred/cfg": "mkdir", "src/tarred/deep": "mkdir", "src/tarred/deep/er": "mkdir",
		"src/tarred/deep/er/task.json": "create", "src/tarred/cfg/current": "symlink",
	}
	if len(ops) != len(want) {
		t.Errorf("feed %v, want %v", ops, want)
	}
	for path, op := range want {
		if ops[path] != op {
			t.Errorf("%s: %q in the feed, want %q", path, ops[path], op)
		}
	}
}

// TestStageRefusesBadInto: into must be a path inside the scope.
func TestStageRefusesBadInto(t *testing.T) {
	e := newEnv(t, nil)
	for _, into := range []string{"../x", "/data", ".agentloom-locks", "subagents"} {
		if _, err := e.door.Stage(context.Background(), into); err == nil {
			t.Errorf("into %q accepted", into)
		}
	}
}

// TestNoDoorReachesStaging: no tool, MCP call or container can reach the
// staging door: the packages of those doors never import this one, and
// neither the tool definitions nor the MCP tool list name it.
func TestNoDoorReachesStaging(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/agentloom/loomfs/tools", "github.com/agentloom/loomfs/mcpserver", "github.com/agentloom/loomfs/fusefs", "github.com/agentloom/loomfs/sandbox").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		if dep == "github.com/agentloom/loomfs/stage" {
			t.Errorf("a door imports the staging package")
		}
	}
	e := newEnv(t, nil)
	exposed := func(name, desc string) bool {
		s := strings.ToLower(name + " " + desc)
		return strings.Contains(s, "stage") || strings.Contains(s, "staging") || strings.Contains(s, "collect")
	}
	for _, d := range tools.Definitions(e.ws.Policy()) {
		if exposed(d.Name, d.Description) {
			t.Errorf("tool %s mentions staging: %s", d.Name, d.Description)
		}
	}
	srv, err := mcpserver.New(e.box, mcpserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, ct := mcp.NewInMemoryTransports()
	go srv.Run(ctx, st)
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	list, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Tools) == 0 {
		t.Fatal("the MCP server lists no tools")
	}
	for _, tl := range list.Tools {
		if exposed(tl.Name, tl.Description) {
			t.Errorf("MCP tool %s mentions staging", tl.Name)
		}
	}
	// An unknown tool name is not a way in either.
	if _, err := e.box.Call(ctx, "stage", "", json.RawMessage(`{}`)); err == nil {
		t.Error("a tool call named stage ran")
	}
}
