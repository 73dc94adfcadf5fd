package test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentloom/loomfs/tools"
)

// With "commands: session", loomfs tool workspace_command runs in the node
// service's session sandbox of the scope: one container for the session's
// commands and processes, nothing a command left running kept, the files
// seen by the tool door; the service's death quarantines the scope as for
// a one-shot command, and without a service the command is refused.
func TestSessionCommandsThroughTheService(t *testing.T) {
	pol := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(pol, []byte("commands: session\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := newServeEnv(t, "AGENT_LOOM_POLICY="+pol)
	scope := "acme/coder/session-cmds"
	var first, second tools.CommandResult
	if r := s.tool(tools.Command, scope, map[string]any{"command": "echo hi > a.txt; sleep 1000 & echo started"}, &first); r.code != 0 || first.Stdout != "started\n" {
		t.Fatalf("first command: %d %s %s", r.code, r.stdout, r.stderr)
	}
	t.Cleanup(func() { exec.Command("docker", "rm", "-f", first.Container).Run() })
	if r := s.tool(tools.Command, scope, map[string]any{"command": "cat a.txt; ps -o args | grep -c '^sleep 1000' || true"}, &second); r.code != 0 {
		t.Fatalf("second command: %d %s %s", r.code, r.stdout, r.stderr)
	}
	if second.Container != first.Container || second.Stdout != "hi\n0\n" {
		t.Fatalf("second command in %s answered %q; want the first's container %s, its file and no sleep left", second.Container, second.Stdout, first.Container)
	}
	if n := len(loomfsContainers(t, scope)); n != 1 {
		t.Fatalf("%d containers between commands, want the session sandbox alone", n)
	}
	var rd tools.ReadResult
	if r := s.tool(tools.Read, scope, map[string]any{"path": "a.txt"}, &rd); r.code != 0 || rd.Content != "hi\n" {
		t.Fatalf("tool door read: %d %s", r.code, r.stdout)
	}

	s.cmd.Process.Kill()
	s.cmd.Wait()
	detachUnder(s.mountDir)
	r := s.tool(tools.Command, scope, map[string]any{"command": "true"}, nil)
	if r.code != 1 || !strings.Contains(string(r.stdout), `"quarantined"`) {
		t.Fatalf("command after the service died: %d %s, want quarantined", r.code, r.stdout)
	}
	r = s.tool(tools.Command, "acme/coder/session-cmds-none", map[string]any{"command": "true"}, nil)
	if r.code != 1 || !strings.Contains(string(r.stdout), "process_service_unavailable") {
		t.Fatalf("command with no service: %d %s, want process_service_unavailable", r.code, r.stdout)
	}
}
