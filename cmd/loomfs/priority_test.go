package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPriorityAndHooksCommands: policy show prints the priority settings
// and the hooks, as text and JSON; runs create records --priority; and a
// command hook of the policy file denies a loomfs tool call, with its
// reason, while a call it does not cover goes through.
func TestPriorityAndHooksCommands(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "p.yaml")
	os.WriteFile(file, []byte(`priority: low
limits_by_priority:
  high:
    scope_bytes: 20 GiB
volume_reserve_low: 10%
volume_reserve_normal: 2 GiB
hooks:
  before:
    - tools: [workspace_write]
      command: [sh, -c, 'grep -q "\"secrets/" && { echo "no writes under secrets/" >&2; exit 2; }; exit 0']
      timeout: 3s
`), 0o600)
	out, errOut, code := runLoomfs(t, "policy", "show", file)
	if code != exitOK {
		t.Fatalf("policy show: exit %d\n%s%s", code, out, errOut)
	}
	for _, want := range []string{"priority: low\n", "volume_reserve_low: 10%\n", "volume_reserve_normal: 2 GiB\n",
		"limits of high priority: scope_bytes 20 GiB\n", `hook before workspace_write: ["sh" "-c"`} {
		if !strings.Contains(out, want) {
			t.Errorf("policy show lacks %q:\n%s", want, out)
		}
	}
	out, _, _ = runLoomfs(t, "--json", "policy", "show", file)
	var shown struct {
		Priority         string                    `json:"priority"`
		ReserveLow       string                    `json:"volume_reserve_low"`
		LimitsByPriority map[string]map[string]any `json:"limits_by_priority"`
		Hooks            map[string][]struct {
			Tools   []string `json:"tools"`
			Timeout string   `json:"timeout"`
		} `json:"hooks"`
	}
	if err := json.Unmarshal([]byte(out), &shown); err != nil {
		t.Fatal(err)
	}
	if shown.Priority != "low" || shown.ReserveLow != "10%" || shown.LimitsByPriority["high"]["scope_bytes"] != float64(20<<30) ||
		len(shown.Hooks["before"]) != 1 || shown.Hooks["before"][0].Timeout != "3s" || len(shown.Hooks["after"]) != 0 {
		t.Errorf("policy show --json: %+v", shown)
	}

	root := filepath.Join(dir, "root")
	out, errOut, code = runLoomfs(t, "--root", root, "runs", "create", "--scope", "acme/coder/s1", "--run", "r1", "--user", "u", "--priority", "high")
	if code != exitOK || !strings.Contains(out, `"priority": "high"`) {
		t.Fatalf("runs create --priority high: exit %d\n%s%s", code, out, errOut)
	}
	if _, errOut, code = runLoomfs(t, "--root", root, "runs", "create", "--scope", "acme/coder/s1", "--run", "r2", "--user", "u", "--priority", "urgent"); code != exitUsage || !strings.Contains(errOut, "low, normal or high") {
		t.Errorf("runs create --priority urgent: exit %d, %s", code, errOut)
	}

	tool := func(input string) (string, string, int) {
		return runLoomfs(t, "--root", root, "--policy", file, "tool", "workspace_write", "--scope", "acme/coder/s1", "--input", input)
	}
	out, errOut, code = tool(`{"path":"secrets/key","content":"x"}`)
	if code != exitRefused || !strings.Contains(out+errOut, "denied_by_hook") || !strings.Contains(out+errOut, "no writes under secrets/") {
		t.Errorf("a write the hook denies: exit %d\n%s%s", code, out, errOut)
	}
	if _, err := os.Stat(filepath.Join(root, "spaces/acme/agents/coder/sessions/s1/main/secrets/key")); err == nil {
		t.Error("the denied write was made")
	}
	if out, errOut, code = tool(`{"path":"notes.txt","content":"x"}`); code != exitOK {
		t.Errorf("a write the hook allows: exit %d\n%s%s", code, out, errOut)
	}
}
