package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPolicyFileAtStart: an invalid --policy is refused before anything
// runs, naming the file, the line and the reason; a valid one drives the
// tool definitions and the README.
func TestPolicyFileAtStart(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("preset: standard\nlimits:\n  scope_bytes: 5 GB\n  text_byts: 2 MiB\n"), 0o600)
	good := filepath.Join(dir, "good.yaml")
	os.WriteFile(good, []byte("preset: standard\nrules:\n  - path: reports/\n    mode: ro\n"), 0o600)
	root := filepath.Join(dir, "root")

	tests := []struct {
		name   string
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{"check refuses with the line", []string{"policy", "check", bad}, exitRefused, "", bad + `:4: limits: unknown key "text_byts"`},
		{"check accepts", []string{"policy", "check", good}, exitOK, "ok (7 path rules, 2 subtree rules)", ""},
		{"tools refuse a bad --policy", []string{"--policy", bad, "tools"}, exitUsage, "", `:4: limits: unknown key "text_byts"`},
		{"tool refuses a bad --policy", []string{"--root", root, "--policy", bad, "tool", "workspace_list", "--scope", "a/b/c"}, exitUsage, "", `unknown key "text_byts"`},
		{"tools follow the file", []string{"--policy", good, "tools"}, exitOK, "reports/ read-only", ""},
		{"show prints rules and README", []string{"policy", "show", good}, exitOK, "--- README.md ---", ""},
		{"readme of a preset", []string{"policy", "readme", "--preset", "standard"}, exitOK, "- output/ write-only", ""},
		{"unknown preset", []string{"policy", "show", "--preset", "strict"}, exitUsage, "", "known presets are open, standard"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := runLoomfs(t, tc.args...)
			if code != tc.code || !strings.Contains(out, tc.stdout) || !strings.Contains(errOut, tc.stderr) {
				t.Fatalf("exit %d (want %d)\nstdout: %s\nstderr: %s\nwant stdout ⊇ %q, stderr ⊇ %q", code, tc.code, out, errOut, tc.stdout, tc.stderr)
			}
		})
	}
	if _, err := os.Stat(root); err == nil {
		t.Error("a refused policy still created the volume root")
	}
}

// TestSnapshotCommands runs create, list, diff, restore, pin and gc
// through the command line.
func TestSnapshotCommands(t *testing.T) {
	root := filepath.Join(t.TempDir(), "root")
	run := func(want int, args ...string) string {
		t.Helper()
		out, errOut, code := runLoomfs(t, append([]string{"--root", root}, args...)...)
		if code != want {
			t.Fatalf("%v: exit %d, want %d\n%s%s", args, code, want, out, errOut)
		}
		return out
	}
	run(0, "tool", "workspace_write", "--scope", "a/b/c", "--input", `{"path":"x.txt","content":"one"}`)
	var m struct {
		ID    string `json:"id"`
		Files int    `json:"files"`
	}
	json.Unmarshal([]byte(run(0, "--json", "snapshot", "create", "--scope", "a/b/c", "--label", "l1")), &m)
	if m.ID == "" || m.Files != 1 {
		t.Fatalf("snapshot create: %+v", m)
	}
	run(0, "tool", "workspace_write", "--scope", "a/b/c", "--input", `{"path":"x.txt","content":"two"}`)
	if out := run(0, "snapshot", "diff", "--scope", "a/b/c", m.ID); out != "M x.txt\n" {
		t.Fatalf("diff: %q", out)
	}
	if out := run(0, "snapshot", "list", "--scope", "a/b/c"); !strings.Contains(out, m.ID) || !strings.Contains(out, "l1") {
		t.Fatalf("list: %s", out)
	}
	run(0, "snapshot", "restore", "--scope", "a/b/c", m.ID)
	if b, _ := os.ReadFile(filepath.Join(root, "spaces/a/agents/b/sessions/c/main/x.txt")); string(b) != "one" {
		t.Fatalf("restored x.txt = %q", b)
	}
	run(1, "snapshot", "restore", "--scope", "a/b/c", "20990101T000000.000Z-000000")
	run(2, "snapshot", "restore", "--scope", "a/b/c")
	run(0, "pin", "--scope", "a/b/c", "--snapshot", m.ID)
	if out := run(0, "pin", "--list"); !strings.Contains(out, m.ID) {
		t.Fatalf("pin --list: %s", out)
	}
	if out := run(0, "gc", "--dry-run", "--days", "1"); !strings.Contains(out, "0 would remove") {
		t.Fatalf("gc --dry-run: %s", out)
	}
	run(0, "unpin", "--scope", "a/b/c", "--snapshot", m.ID)
	run(1, "unpin", "--scope", "a/b/c", "--snapshot", m.ID)
}
