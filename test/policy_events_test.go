package test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPolicyEventsFromContainer: a command that meets the quota, a hard
// link and a read-only path is told, in its result's policy_events, what
// the policy refused, with the codes and the messages the tools give, and
// the list is capped and counted.
func TestPolicyEventsFromContainer(t *testing.T) {
	c := newCLI(t)
	const scope = "sp/ag/events"
	if m, code := c.tool(scope, "workspace_mkdir", `{"path":"data"}`); code != 0 {
		t.Fatalf("mkdir data: %v", m)
	}
	pol := filepath.Join(t.TempDir(), "policy.yaml")
	yaml := "preset: open\nrules:\n  - path: data\n    mode: ro\nlimits:\n  scope_bytes: 1MiB\n"
	if err := os.WriteFile(pol, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	script := `head -c 2000000 /dev/zero > big; echo x > data/new; echo y > f; ln f hard
for i in $(seq 60); do ln f h$i 2>/dev/null; done; exit 0`
	r := c.run("", "--json", "--policy", pol, "run", "--scope", scope, "--", script)
	if r.code != 0 {
		t.Fatalf("run: exit %d, stdout %s, stderr %s", r.code, r.stdout, r.stderr)
	}
	var res struct {
		PolicyEvents struct {
			Events []struct {
				Op, Path, Errno, Code, Message string
				Count                          int
			}
			Total, Dropped int
		} `json:"policy_events"`
	}
	if err := json.Unmarshal(r.stdout, &res); err != nil {
		t.Fatalf("run --json: %v: %s", err, r.stdout)
	}
	ev := res.PolicyEvents
	for _, w := range []struct{ op, path, errno, code, message string }{
		{"write", "big", "EDQUOT", "quota_exceeded", "quota exceeded: workspace total 1 MiB (used "},
		{"create", "data/new", "EROFS", "read_only", `data/new is read-only (path rule "data/ ro")`},
		{"link", "hard", "EXDEV", "link_unsupported", "hard links are not made in the workspace; copy the file instead"},
	} {
		found := false
		for _, e := range ev.Events {
			if e.Op == w.op && e.Path == w.path {
				found = true
				if e.Errno != w.errno || e.Code != w.code || !strings.Contains(e.Message, w.message) {
					t.Errorf("%s %s: %+v, want %s %s and a message with %q", w.op, w.path, e, w.errno, w.code, w.message)
				}
			}
		}
		if !found {
			t.Errorf("%s %s not in policy_events: %s", w.op, w.path, r.stdout)
		}
	}
	listed := 0
	for _, e := range ev.Events {
		listed += e.Count
	}
	if len(ev.Events) != 50 || ev.Dropped == 0 || listed+ev.Dropped != ev.Total {
		t.Errorf("policy_events lists %d events of %d refusals, %d of them, dropped %d: want 50 listed and every refusal counted", len(ev.Events), ev.Total, listed, ev.Dropped)
	}
	if strings.Contains(string(r.stdout), c.root) {
		t.Errorf("the result carries a host path: %s", r.stdout)
	}
}
