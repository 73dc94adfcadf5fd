package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentloom/loomfs/sandbox"
	"github.com/agentloom/loomfs/store"
)

// tree lists every path under dir (for "nothing was created or left").
func tree(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			b.WriteString(p + " error\n")
			return nil
		}
		b.WriteString(p + " " + info.Mode().String() + "\n")
		return nil
	})
	return b.String()
}

// TestCheckCommand: loomfs check as SPEC §7.1 has it: exit 0 ok, 1
// failed, 2 misuse; JSON naming single_node and advisory_lock_local; never
// creating a missing root or marker; the probe leaving nothing behind.
func TestCheckCommand(t *testing.T) {
	const id = "team-v1"
	tests := []struct {
		name  string
		setup func(t *testing.T, root string)
		args  []string
		code  int
		lock  bool
	}{
		{"good shared root", marker(id), []string{"--backend", "shared_posix", "--volume-id", id}, 0, false},
		{"good shared root, probe", marker(id), []string{"--backend", "shared_posix", "--volume-id", id, "--probe"}, 0, true},
		{"missing root", nil, []string{"--backend", "shared_posix", "--volume-id", id, "--probe"}, 1, false},
		{"wrong marker", marker("team-v0"), []string{"--backend", "shared_posix", "--volume-id", id, "--probe"}, 1, false},
		{"marker missing", func(t *testing.T, root string) { os.MkdirAll(root, 0o700) }, []string{"--backend", "shared_posix", "--volume-id", id}, 1, false},
		{"local root", func(t *testing.T, root string) { os.MkdirAll(root, 0o700) }, []string{"--backend", "local", "--probe"}, 0, true},
		{"local root missing", nil, []string{"--backend", "local"}, 1, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			parent := t.TempDir()
			root := filepath.Join(parent, "root")
			if tc.setup != nil {
				tc.setup(t, root)
			}
			before := tree(t, parent)
			args := append([]string{"--json", "--root", root, "check"}, tc.args...)
			stdout, stderr, code := runLoomfs(t, args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d\n%s%s", code, tc.code, stdout, stderr)
			}
			var r store.CheckReport
			if err := json.Unmarshal([]byte(stdout), &r); err != nil {
				t.Fatalf("output is not a report: %v\n%s", err, stdout)
			}
			if r.OK != (tc.code == 0) || !r.SingleNode || r.AdvisoryLockLocal != tc.lock {
				t.Errorf("ok %v single_node %v advisory_lock_local %v; want %v true %v", r.OK, r.SingleNode, r.AdvisoryLockLocal, tc.code == 0, tc.lock)
			}
			if r.Backend == "local" && r.Shared {
				t.Errorf("a local root was claimed shared")
			}
			for _, k := range []string{`"single_node": true`, `"advisory_lock_local"`} {
				if !strings.Contains(stdout, k) {
					t.Errorf("JSON output lacks %s", k)
				}
			}
			if got := tree(t, parent); got != before {
				t.Errorf("check changed the tree:\nbefore\n%s\nafter\n%s", before, got)
			}
		})
	}
}

func marker(id string) func(t *testing.T, root string) {
	return func(t *testing.T, root string) {
		if err := os.MkdirAll(root, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, store.VolumeMarker), []byte(id+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCheckReadsOnlyFlagsAndEnvironment: no default root and no .env: a
// .env naming a root in the working directory is ignored, the environment
// is read.
func TestCheckReadsOnlyFlagsAndEnvironment(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	marker("team-v1")(t, root)
	env := "AGENT_LOOM_WORKSPACE_BACKEND=shared_posix\nAGENT_LOOM_WORKSPACE_ROOT=" + root + "\nAGENT_LOOM_WORKSPACE_VOLUME_ID=team-v1\n"
	if err := os.WriteFile(filepath.Join(dir, ".env"), []byte(env), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	for _, k := range []string{"AGENT_LOOM_WORKSPACE_BACKEND", "AGENT_LOOM_WORKSPACE_ROOT", "AGENT_LOOM_WORKSPACE_VOLUME_ID", "AGENT_LOOM_DATA"} {
		t.Setenv(k, "")
	}
	before := tree(t, dir)
	if _, stderr, code := runLoomfs(t, "check"); code != exitUsage || !strings.Contains(stderr, "never picks a default root") {
		t.Errorf("check without a root: exit %d, %s; want 2 (the .env must not be read)", code, stderr)
	}
	if got := tree(t, dir); got != before {
		t.Errorf("check without a root created something:\n%s", got)
	}
	t.Setenv("AGENT_LOOM_WORKSPACE_BACKEND", "shared_posix")
	t.Setenv("AGENT_LOOM_WORKSPACE_ROOT", root)
	t.Setenv("AGENT_LOOM_WORKSPACE_VOLUME_ID", "team-v1")
	if stdout, stderr, code := runLoomfs(t, "check"); code != 0 || !strings.Contains(stdout, "result: ok") {
		t.Errorf("check from the environment: exit %d\n%s%s", code, stdout, stderr)
	}
}

// TestCheckSandboxRuntime: check names the configured runtime and whether
// the engine knows it; with --probe, whether a container starts under it,
// with the runtime's message (host paths masked) when it doesn't.
// loomfs-failstart is the always-failing runtime scripts/setup registers.
func TestCheckSandboxRuntime(t *testing.T) {
	for _, tc := range []struct {
		runtime string
		probe   bool
		code    int
		known   bool
		message string
	}{
		{"", false, 0, true, ""},
		{"", true, 0, true, ""},
		{"runsc", true, 0, true, ""},
		{"nosuch", false, 1, false, `the engine has no runtime "nosuch"`},
		{"loomfs-failstart", false, 0, true, ""},
		{"loomfs-failstart", true, 1, true, "did not terminate successfully"},
	} {
		t.Run(fmt.Sprintf("%s probe=%v", tc.runtime, tc.probe), func(t *testing.T) {
			t.Setenv("AGENT_LOOM_SANDBOX_RUNTIME", tc.runtime)
			root := t.TempDir()
			args := []string{"--json", "--root", root, "check", "--backend", "local"}
			if tc.probe {
				args = append(args, "--probe")
			}
			stdout, stderr, code := runLoomfs(t, args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d\n%s%s", code, tc.code, stdout, stderr)
			}
			var out struct {
				OK      bool                  `json:"ok"`
				Runtime sandbox.RuntimeReport `json:"sandbox_runtime"`
			}
			if err := json.Unmarshal([]byte(stdout), &out); err != nil {
				t.Fatalf("%v\n%s", err, stdout)
			}
			rt := out.Runtime
			if out.OK != (tc.code == 0) || rt.OK != (tc.code == 0) || rt.Runtime != tc.runtime || rt.Known != tc.known ||
				rt.Probed != tc.probe || rt.ProbeOK != (tc.probe && tc.code == 0) || !strings.Contains(rt.Message, tc.message) {
				t.Errorf("report %+v", out)
			}
			if strings.Contains(rt.Message, "/var/") || strings.Contains(rt.Message, "/usr/") {
				t.Errorf("message names a host path: %q", rt.Message)
			}
		})
	}
	// The text form names the runtime on its own line.
	t.Setenv("AGENT_LOOM_SANDBOX_RUNTIME", "nosuch")
	stdout, _, _ := runLoomfs(t, "--root", t.TempDir(), "check", "--backend", "local")
	if !strings.Contains(stdout, "FAIL  sandbox_runtime       nosuch: not known to the engine") {
		t.Errorf("text output:\n%s", stdout)
	}
}
