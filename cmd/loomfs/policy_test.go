package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
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
		// A fault while reading it (out of descriptors) is not the
		// operator's usage: the fault matrix's quota_grant openat EMFILE.
		{"a missing --policy is a usage error", []string{"--root", root, "--policy", filepath.Join(dir, "none.yaml"), "tool", "workspace_list", "--scope", "a/b/c"}, exitUsage, "", "can't read it: no such file"},
		{"a directory as --policy is a usage error", []string{"--root", root, "--policy", dir, "tool", "workspace_list", "--scope", "a/b/c"}, exitUsage, "", "can't read it: read " + dir + ": is a directory"},
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

// TestPolicyShowNamesEveryLimit: policy show prints every limit a policy
// file sets, as text and as JSON, the session sandbox's and the image
// tool's among them.
func TestPolicyShowNamesEveryLimit(t *testing.T) {
	file := filepath.Join(t.TempDir(), "p.yaml")
	os.WriteFile(file, []byte("preset: standard\nlimits:\n  session_idle: 3m\n  session_lifetime: 45m\n  process_output_bytes: 256 KiB\n  image_bytes: 1 MiB\n  image_source_bytes: 8 MiB\n"), 0o600)
	want := []struct {
		key  string
		text string
		json any
	}{
		{"session_idle", "3m0s", "3m0s"},
		{"session_lifetime", "45m0s", "45m0s"},
		{"process_output_bytes", "256 KiB", float64(256 << 10)},
		{"image_bytes", "1 MiB", float64(1 << 20)},
		{"image_source_bytes", "8 MiB", float64(8 << 20)},
		{"text_bytes", "2 MiB", float64(2 << 20)},
		{"scope_bytes", "5 GiB", float64(5 << 30)},
		{"io_ops_per_s", "unlimited", float64(0)},
	}
	out, errOut, code := runLoomfs(t, "policy", "show", file)
	if code != exitOK {
		t.Fatalf("policy show: exit %d\n%s%s", code, out, errOut)
	}
	limits := out[:strings.Index(out, "--- README.md ---")]
	for _, w := range want {
		if !regexp.MustCompile(`(?m)^` + w.key + ` +` + regexp.QuoteMeta(w.text) + `$`).MatchString(limits) {
			t.Errorf("policy show does not print %s %s:\n%s", w.key, w.text, limits)
		}
	}
	out, errOut, code = runLoomfs(t, "--json", "policy", "show", file)
	var shown struct {
		Limits map[string]any `json:"limits"`
	}
	if code != exitOK || json.Unmarshal([]byte(out), &shown) != nil {
		t.Fatalf("policy show --json: exit %d\n%s%s", code, out, errOut)
	}
	for _, w := range want {
		if got, ok := shown.Limits[w.key]; !ok || got != w.json {
			t.Errorf("policy show --json: %s is %v (%v), want %v", w.key, got, ok, w.json)
		}
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
