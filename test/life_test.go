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
