package test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRunFinish: the end of a run clears tmp/ and takes a snapshot that
// names the run.
func TestRunFinish(t *testing.T) {
	c := newCLI(t)
	pol := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(pol, []byte("preset: standard\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const scope = "sp/ag/life"
	if r := c.run("", "runs", "create", "--scope", scope, "--run", "r1", "--user", "alice"); r.code != 0 {
		t.Fatalf("runs create: %s %s", r.stdout, r.stderr)
	}
	for _, in := range []string{`{"path":"tmp","parents":true}`, `{"path":"src","parents":true}`} {
		c.tool(scope, "workspace_mkdir", in, "--policy", pol)
	}
	c.tool(scope, "workspace_write", `{"path":"tmp/scratch","content":"t"}`, "--policy", pol)
	c.tool(scope, "workspace_write", `{"path":"src/main.py","content":"print(1)\n"}`, "--policy", pol)
	r := c.run("", "--policy", pol, "runs", "finish", "--run", "r1")
	var snaps []struct {
		Run   string `json:"run"`
		Files int    `json:"files"`
	}
	if r.code != 0 || json.Unmarshal(r.stdout, &snaps) != nil || len(snaps) != 1 || snaps[0].Run != "r1" || snaps[0].Files != 1 {
		t.Fatalf("runs finish: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	if m, _ := c.tool(scope, "workspace_list", `{"path":"tmp"}`, "--policy", pol); len(m["entries"].([]any)) != 0 {
		t.Fatalf("tmp/ not cleared at run end: %v", m)
	}
	l := c.run("", "--policy", pol, "snapshot", "list", "--scope", scope)
	if l.code != 0 || !strings.Contains(string(l.stdout), "r1") {
		t.Fatalf("snapshot list: %s %s", l.stdout, l.stderr)
	}
}

// TestScopeByRun: --scope run:RUN[/INSTANCE] resumes through the run's
// binding; a run from before bindings uses data/runs/RUN.
func TestScopeByRun(t *testing.T) {
	c := newCLI(t)
	if r := c.run("", "runs", "create", "--scope", "sp/ag/se", "--run", "r1", "--user", "alice"); r.code != 0 {
		t.Fatalf("runs create: %s %s", r.stdout, r.stderr)
	}
	c.tool("run:r1", "workspace_write", `{"path":"main.txt","content":"m"}`)
	c.tool("run:r1/sub-1", "workspace_write", `{"path":"child.txt","content":"c"}`)
	if m, _ := c.tool("sp/ag/se", "workspace_read", `{"path":"main.txt"}`); m["content"] != "m" {
		t.Fatalf("run:r1 is not the session's main scope: %v", m)
	}
	if m, _ := c.tool("sp/ag/se/r1/sub-1", "workspace_read", `{"path":"child.txt"}`); m["content"] != "c" {
		t.Fatalf("run:r1/sub-1 is not the run's child instance: %v", m)
	}
	// A legacy run: its directory under data/runs, no binding.
	data := t.TempDir()
	legacy := filepath.Join(data, "runs", "old-run")
	if err := os.MkdirAll(legacy, 0o700); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(legacy, "notes.txt"), []byte("from before bindings"), 0o600)
	r := c.run("", "--root", data, "--data", data, "tool", "workspace_read", "--scope", "run:old-run", "--input", `{"path":"notes.txt"}`)
	if r.code != 0 || !strings.Contains(string(r.stdout), "from before bindings") {
		t.Fatalf("legacy run: %d %s %s", r.code, r.stdout, r.stderr)
	}
	if m, code := c.tool("run:nope", "workspace_read", `{"path":"x"}`); code != 1 || errCode(m) != "not_found" {
		t.Fatalf("unknown run: %v", m)
	}
	if r := c.run("", "tool", "workspace_list", "--scope", "run:../x"); r.code != 2 {
		t.Fatalf("bad run id: exit %d", r.code)
	}
}
