package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/agentloom/loomfs/audit"
)

// runLoomfs runs the command line in-process through run, as main does,
// and returns its output and exit code.
func runLoomfs(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(args, &out, &errb)
	return out.String(), errb.String(), code
}

// auditRoot writes a small log: a tool write, a refused FUSE rename of a
// nasty name, and a sandbox event, spread over several files.
func auditRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	l, err := audit.Open(root, audit.Options{Node: "n1", MaxFileBytes: 700})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	main := audit.Actor{Space: "acme", Agent: "coder", Session: "s1", Run: "r1"}
	child := audit.Actor{Space: "acme", Agent: "coder", Session: "s1", Run: "r1", Instance: "sub-1"}
	for _, e := range []audit.Event{
		{Actor: main, Scope: "h-main", Source: audit.SourceTool, Op: "workspace_write", Path: "src/a.go", Bytes: 12, Result: "ok", Duration: time.Millisecond},
		{Actor: child, Scope: "h-child", Source: audit.SourceFUSE, Op: "rename", Path: "x\nFAKE ROW\t\"", NewPath: "output/y", Result: "refused", Code: "permission_denied"},
		{Actor: child, Scope: "h-child", Source: audit.SourceSandbox, Op: "container_exit", Result: "ok", Detail: map[string]any{"exit_code": 0}},
		{Source: audit.SourceAdmin, Op: "quarantine_clear", Result: "ok"},
	} {
		if err := l.Record(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return root
}

func TestAuditVerifyCommand(t *testing.T) {
	root := auditRoot(t)
	out, _, code := runLoomfs(t, "--root", root, "audit", "verify")
	if code != 0 || !strings.Contains(out, "records, chain intact") {
		t.Fatalf("verify of an intact log: exit %d, %q", code, out)
	}

	out, _, code = runLoomfs(t, "--root", root, "--json", "audit", "verify")
	var rep struct {
		OK     bool `json:"ok"`
		Events int  `json:"events"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || code != 0 || !rep.OK || rep.Events != 4 {
		t.Fatalf("verify --json: exit %d, %q (%v)", code, out, err)
	}

	files, _ := filepath.Glob(filepath.Join(audit.Dir(root), "*.jsonl"))
	sort.Strings(files)
	b, _ := os.ReadFile(files[0])
	os.WriteFile(files[0], bytes.Replace(b, []byte("src/a.go"), []byte("src/b.go"), 1), 0o600)
	out, _, code = runLoomfs(t, "--root", root, "audit", "verify")
	if code != 1 || !strings.Contains(out, "BROKEN") || !strings.Contains(out, "src/b.go") {
		t.Fatalf("verify of an edited log: exit %d, %q", code, out)
	}
}

func TestAuditQueryCommand(t *testing.T) {
	root := auditRoot(t)
	for _, tc := range []struct {
		name string
		args []string
		ops  []string
	}{
		{"everything", nil, []string{"workspace_write", "rename", "container_exit", "quarantine_clear"}},
		{"main scope", []string{"--scope", "acme/coder/s1"}, []string{"workspace_write"}},
		{"child scope", []string{"--scope", "acme/coder/s1/r1/sub-1"}, []string{"rename", "container_exit"}},
		{"scope hash", []string{"--scope", "h-main"}, []string{"workspace_write"}},
		{"source", []string{"--source", "sandbox"}, []string{"container_exit"}},
		{"result", []string{"--result", "refused"}, []string{"rename"}},
		{"path prefix", []string{"--path", "output/"}, []string{"rename"}},
		{"op", []string{"--op", "quarantine_clear"}, []string{"quarantine_clear"}},
		{"since an age", []string{"--since", "1h"}, []string{"workspace_write", "rename", "container_exit", "quarantine_clear"}},
		{"until long ago", []string{"--until", "2000-01-01"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--root", root, "--json", "audit", "query"}, tc.args...)
			out, errs, code := runLoomfs(t, args...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errs)
			}
			var ops []string
			for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
				if line == "" {
					continue
				}
				var r audit.Record
				if err := json.Unmarshal([]byte(line), &r); err != nil {
					t.Fatalf("line %q: %v", line, err)
				}
				ops = append(ops, r.Op)
			}
			if strings.Join(ops, ",") != strings.Join(tc.ops, ",") {
				t.Errorf("ops %v, want %v", ops, tc.ops)
			}
		})
	}
}

// One table row per record, however the path is spelt.
func TestAuditQueryTable(t *testing.T) {
	root := auditRoot(t)
	out, _, code := runLoomfs(t, "--root", root, "audit", "query", "--result", "refused")
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if code != 0 || len(lines) != 2 || !strings.HasPrefix(lines[0], "TIME") {
		t.Fatalf("exit %d, want a header and one row:\n%s", code, out)
	}
	if !strings.Contains(lines[1], `"x\nFAKE ROW\t\""`) || !strings.Contains(lines[1], "refused:permission_denied") {
		t.Errorf("row %q", lines[1])
	}
	out, _, _ = runLoomfs(t, "--root", root, "audit", "query", "--op", "nothing")
	if strings.TrimSpace(out) != "no matching records" {
		t.Errorf("empty query printed %q", out)
	}
}

func TestAuditTailCommand(t *testing.T) {
	root := auditRoot(t)
	out, _, code := runLoomfs(t, "--root", root, "audit", "tail", "-n", "2")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 2 || !strings.Contains(lines[0], "container_exit") || !strings.Contains(lines[1], "quarantine_clear") {
		t.Errorf("tail -n 2: exit %d\n%s", code, out)
	}
}

func TestAuditUsage(t *testing.T) {
	root := t.TempDir()
	for _, args := range [][]string{
		{"audit", "query", "--since", "yesterday"},
		{"audit", "query", "--until", "-1h"},
		{"audit", "query", "--scope", "acme/coder"},
		{"audit", "query", "--scope", "acme//s1"},
		{"audit", "query", "--source", "network"},
		{"audit", "tail", "-n", "-1"},
		{"audit", "verify", "extra"},
		{"audit", "verify", "--keys", filepath.Join(root, "no-keys")},
		{"audit", "verify", "--anchor", filepath.Join(root, "no-anchors")},
		{"audit", "keygen"},
		{"audit", "bogus"},
	} {
		if _, errs, code := runLoomfs(t, append([]string{"--root", root}, args...)...); code != exitUsage {
			t.Errorf("%v: exit %d, want %d (%s)", args, code, exitUsage, errs)
		}
	}
	if _, errs, code := runLoomfs(t, "--root", root, "audit", "verify"); code != 1 || !strings.Contains(errs, "audit") {
		t.Errorf("verify without a log: exit %d, %q", code, errs)
	}
	for _, sub := range []string{"query", "tail", "verify", "anchor", "keygen"} {
		out, _, code := runLoomfs(t, "audit", sub, "--help")
		if code != 0 || !strings.Contains(out, "Usage:") || len(out) < 300 {
			t.Errorf("%s --help: exit %d, %q", sub, code, out)
		}
	}
}

func TestAuditDir(t *testing.T) {
	for _, tc := range []struct {
		g    globals
		want string
	}{
		{globals{root: "/srv/loom", data: "./data"}, "/srv/loom/.agentloom-audit"},
		{globals{data: "/var/lib/agentloom"}, "/var/lib/agentloom/workspaces/.agentloom-audit"},
	} {
		if got := auditDir(&tc.g); got != tc.want {
			t.Errorf("auditDir(%+v) = %q, want %q", tc.g, got, tc.want)
		}
	}
}

// The operator's routine through the command line: keygen, a signed log,
// verify with and without the trusted keys, an anchor, and the directory
// later replaced by an older copy.
func TestAuditKeysAndAnchors(t *testing.T) {
	keys := t.TempDir()
	out, errs, code := runLoomfs(t, "audit", "keygen", "--dir", filepath.Join(keys, "node"), "--node", "n1")
	if code != 0 || !strings.Contains(out, "n1.key") || !strings.Contains(out, "n1.pub") {
		t.Fatalf("keygen: exit %d %q %q", code, out, errs)
	}
	if _, errs, code := runLoomfs(t, "audit", "keygen", "--dir", filepath.Join(keys, "node"), "--node", "n1"); code != 1 || !strings.Contains(errs, "already exists") {
		t.Errorf("keygen over a key: exit %d %q", code, errs)
	}
	trust := filepath.Join(keys, "trust")
	os.Mkdir(trust, 0o700)
	pub, _ := os.ReadFile(filepath.Join(keys, "node", "n1.pub"))
	os.WriteFile(filepath.Join(trust, "n1.pub"), pub, 0o644)

	root := t.TempDir()
	write := func(n int) {
		l, err := audit.Open(root, audit.Options{Node: "n1", KeyFile: filepath.Join(keys, "node", "n1.key")})
		if err != nil {
			t.Fatal(err)
		}
		for range n {
			l.Record(context.Background(), audit.Event{Source: audit.SourceTool, Op: "workspace_write", Result: "ok"})
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
	write(3)
	out, _, code = runLoomfs(t, "--root", root, "audit", "verify")
	if code != 0 || !strings.Contains(out, "only chained, not signed") {
		t.Errorf("verify without keys: exit %d %q", code, out)
	}
	out, _, code = runLoomfs(t, "--root", root, "audit", "verify", "--keys", trust)
	if code != 0 || !strings.Contains(out, "signed: every node's seals verify") {
		t.Errorf("verify --keys: exit %d %q", code, out)
	}

	older := filepath.Join(t.TempDir(), "older")
	if err := exec.Command("cp", "-a", audit.Dir(root), older).Run(); err != nil {
		t.Fatal(err)
	}
	write(2)
	anchors := filepath.Join(keys, "anchors.jsonl")
	out, errs, code = runLoomfs(t, "--root", root, "audit", "anchor", "--to", anchors)
	if code != 0 || !strings.Contains(out, `"heads":[{"node":"n1"`) {
		t.Fatalf("anchor: exit %d %q %q", code, out, errs)
	}
	if b, _ := os.ReadFile(anchors); string(b) != out {
		t.Errorf("anchor file %q, printed %q", b, out)
	}
	write(1)
	out, _, code = runLoomfs(t, "--root", root, "audit", "verify", "--keys", trust, "--anchor", anchors)
	if code != 0 || !strings.Contains(out, "anchored: the log extends all 1 anchored heads") {
		t.Errorf("verify --anchor: exit %d %q", code, out)
	}
	os.RemoveAll(audit.Dir(root))
	os.Rename(older, audit.Dir(root))
	if out, _, code := runLoomfs(t, "--root", root, "audit", "verify", "--keys", trust); code != 0 {
		t.Errorf("the older copy on its own verifies: exit %d %q", code, out)
	}
	out, _, code = runLoomfs(t, "--root", root, "audit", "verify", "--keys", trust, "--anchor", anchors)
	if code != 1 || !strings.Contains(out, "anchored head no longer extended") {
		t.Errorf("older copy against the anchor: exit %d %q", code, out)
	}
}
