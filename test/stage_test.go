package test

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// stageResult is what loomfs stage --json prints.
type stageResult struct {
	Into   string `json:"into"`
	Staged []struct {
		Path, Type string
		Bytes      int64
	} `json:"staged"`
	Refused []struct {
		Source, Path, Code, Message string
	} `json:"refused"`
}

func tarOf(t *testing.T, files map[string]string) string {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, body := range files {
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o600, Size: int64(len(body))})
		tw.Write([]byte(body))
	}
	tw.Close()
	return buf.String()
}

// TestPlatformLifecycle is the task lifecycle of the README in the
// standard layout: create the run, stage inputs into data/ and the task
// into .meta/, let the agent work (tools and a real container), collect
// output/, finish the run. The agent reads data/ and can't change it,
// never sees .meta/, and can't read output/ back; the platform can.
func TestPlatformLifecycle(t *testing.T) {
	c := newCLI(t)
	pol := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(pol, []byte("preset: standard\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const scope = "sp/ag/platform"
	if r := c.run("", "runs", "create", "--scope", scope, "--run", "r1", "--user", "alice"); r.code != 0 {
		t.Fatalf("runs create: %s %s", r.stdout, r.stderr)
	}

	// Stage inputs: a tree with a symlink and a FIFO; the rest is staged,
	// the refused are listed, exit 1.
	in := t.TempDir()
	os.WriteFile(filepath.Join(in, "a.csv"), []byte("x,y\n1,2\n"), 0o600)
	os.Symlink("/etc/shadow", filepath.Join(in, "link"))
	syscall.Mkfifo(filepath.Join(in, "fifo"), 0o600)
	r := c.run("", "--json", "--policy", pol, "stage", "--scope", "run:r1", "--into", "data", "--actor", "scheduler", in)
	var res stageResult
	if err := json.Unmarshal(r.stdout, &res); err != nil || r.code != 1 {
		t.Fatalf("stage: exit %d, %s %s", r.code, r.stdout, r.stderr)
	}
	if len(res.Staged) != 1 || res.Staged[0].Path != "data/a.csv" || len(res.Refused) != 2 {
		t.Fatalf("stage result %+v", res)
	}
	// The task's configuration into .meta/, as a tar stream on stdin.
	r = c.run(tarOf(t, map[string]string{"task.json": `{"goal":"sum"}`}), "--json", "--policy", pol, "stage", "--scope", "run:r1", "--into", ".meta", "--actor", "scheduler", "-")
	if r.code != 0 {
		t.Fatalf("stage .meta: exit %d %s %s", r.code, r.stdout, r.stderr)
	}

	// The agent: its layout is there, data/ reads but doesn't change,
	// .meta/ is not there at all.
	m, _ := c.tool(scope, "workspace_list", `{"path":"."}`, "--policy", pol)
	var names []string
	for _, e := range m["entries"].([]any) {
		names = append(names, e.(map[string]any)["name"].(string))
	}
	if got := strings.Join(names, " "); got != "data logs output src tmp" {
		t.Errorf("the agent's listing %q", got)
	}
	if m, _ := c.tool(scope, "workspace_read", `{"path":"data/a.csv"}`, "--policy", pol); m["content"] != "x,y\n1,2\n" {
		t.Errorf("agent read of data/a.csv: %v", m)
	}
	if m, _ := c.tool(scope, "workspace_write", `{"path":"data/a.csv","content":"forged"}`, "--policy", pol); errCode(m) != "read_only" {
		t.Errorf("agent write into data/: %v", m)
	}
	if m, _ := c.tool(scope, "workspace_read", `{"path":".meta/task.json"}`, "--policy", pol); errCode(m) != "not_found" {
		t.Errorf("agent read of .meta/: %v", m)
	}

	// The agent inside a real container.
	script := `cat data/a.csv; ls -a; ls -a data
cat .meta/task.json 2>/dev/null && echo META-READ
ls .meta 2>/dev/null && echo META-LISTED
echo forged > data/a.csv 2>/dev/null && echo DATA-WRITTEN
rm data/a.csv 2>/dev/null && echo DATA-REMOVED
echo new > data/new 2>/dev/null && echo DATA-CREATED
echo 3 > output/sum.txt && echo wrote-output
cat output/sum.txt 2>/dev/null && echo OUTPUT-READ
exit 0`
	r = c.run("", "--policy", pol, "run", "--scope", "run:r1", "--", "sh", "-c", script)
	out := string(r.stdout)
	if r.code != 0 || !strings.Contains(out, "x,y\n1,2\n") || !strings.Contains(out, "wrote-output") {
		t.Fatalf("container: exit %d, stdout %q, stderr %q", r.code, out, r.stderr)
	}
	for _, bad := range []string{"META-READ", "META-LISTED", "DATA-WRITTEN", "DATA-REMOVED", "DATA-CREATED", "OUTPUT-READ", ".meta", "task.json"} {
		if strings.Contains(out, bad) {
			t.Errorf("the container got %s: %q", bad, out)
		}
	}
	if left := loomfsContainers(t, scope); len(left) != 0 {
		t.Errorf("containers left behind: %v", left)
	}

	// The platform collects output/.
	dest := filepath.Join(t.TempDir(), "results")
	r = c.run("", "--json", "--policy", pol, "collect", "--scope", "run:r1", "--from", "output", "--actor", "scheduler", dest)
	if r.code != 0 {
		t.Fatalf("collect: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	if b, err := os.ReadFile(filepath.Join(dest, "sum.txt")); err != nil || string(b) != "3\n" {
		t.Errorf("collected output/sum.txt: %q %v", b, err)
	}
	r = c.run("", "--policy", pol, "collect", "--scope", "run:r1", "--from", ".meta", "--actor", "scheduler", "-")
	tr := tar.NewReader(bytes.NewReader(r.stdout))
	if h, err := tr.Next(); r.code != 0 || err != nil || h.Name != "task.json" {
		t.Errorf("collect .meta as tar: exit %d, %v %v (%s)", r.code, h, err, r.stderr)
	}

	// Finish the run: the snapshot sees what was staged.
	if r := c.run("", "--policy", pol, "runs", "finish", "--run", "r1"); r.code != 0 {
		t.Fatalf("runs finish: %s %s", r.stdout, r.stderr)
	}

	// Every platform record names its operator.
	recs := c.auditRecords(scope)
	var platform, layout int
	for _, rec := range recs {
		if rec.Source != "platform" {
			continue
		}
		platform++
		if rec.Op == "layout_mkdir" {
			layout++
			continue
		}
		if rec.Actor.Operator != "scheduler" {
			t.Errorf("platform record without its operator: %+v", rec)
		}
	}
	if layout != 6 || platform < 10 {
		t.Errorf("%d platform records, %d of the layout (want 6)", platform, layout)
	}
}

// TestStagePastQuotaCLI: staging past the scope quota is refused with
// the figures, exit 1, and leaves no partial file; a bad --into is a usage
// error.
func TestStagePastQuotaCLI(t *testing.T) {
	c := newCLI(t)
	pol := filepath.Join(t.TempDir(), "policy.yaml")
	os.WriteFile(pol, []byte("preset: standard\nlimits:\n  scope_bytes: 1 MiB\n"), 0o600)
	const scope = "sp/ag/quota"
	big := filepath.Join(t.TempDir(), "big.bin")
	os.WriteFile(big, bytes.Repeat([]byte("z"), 2<<20), 0o600)
	r := c.run("", "--json", "--policy", pol, "stage", "--scope", scope, "--into", "data", big)
	var res stageResult
	if err := json.Unmarshal(r.stdout, &res); err != nil || r.code != 1 || len(res.Refused) != 1 {
		t.Fatalf("stage: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	if got := res.Refused[0]; got.Code != "quota_exceeded" || !strings.Contains(got.Message, "workspace total 1 MiB (used ") || !strings.Contains(got.Message, "write of 2 MiB refused") {
		t.Errorf("refusal %+v", got)
	}
	sc := filepath.Join(c.root, "spaces/sp/agents/ag/sessions/quota/main/data")
	if ents, _ := os.ReadDir(sc); len(ents) != 0 {
		t.Errorf("data/ holds %v after a refused stage", ents)
	}
	for _, args := range [][]string{
		{"stage", "--scope", scope, "--into", "../x", big},
		{"stage", "--scope", scope},
		{"stage", big},
		{"collect", "--scope", scope},
	} {
		if r := c.run("", args...); r.code != 2 {
			t.Errorf("%v: exit %d, want 2 (usage): %s", args, r.code, r.stderr)
		}
	}
}

// TestNodesStage: what the platform stages through node A the agent reads
// through node B, and what the agent writes on B the platform collects on
// A: the door works on any node that mounts the volume.
func TestNodesStage(t *testing.T) {
	_, a, b := sharedVolume(t)
	pol := filepath.Join(t.TempDir(), "policy.yaml")
	os.WriteFile(pol, []byte("preset: standard\n"), 0o600)
	const scope = "acme/coder/staged"
	in := filepath.Join(t.TempDir(), "in.txt")
	os.WriteFile(in, []byte("input\n"), 0o600)
	if r := a.run("--policy", pol, "stage", "--scope", scope, "--into", "data", "--actor", "scheduler", in); r.code != 0 {
		t.Fatalf("stage on node A: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	read := b.run("--policy", pol, "tool", "workspace_read", "--scope", scope, "--input", `{"path":"data/in.txt"}`)
	if !strings.Contains(string(read.stdout), `"content":"input\n"`) {
		t.Fatalf("read on node B: %s %s", read.stdout, read.stderr)
	}
	if r := b.run("--policy", pol, "tool", "workspace_write", "--scope", scope, "--input", `{"path":"output/out.txt","content":"done\n"}`); r.code != 0 {
		t.Fatalf("write on node B: %s %s", r.stdout, r.stderr)
	}
	dest := filepath.Join(t.TempDir(), "results")
	if r := a.run("--policy", pol, "collect", "--scope", scope, "--from", "output", "--actor", "scheduler", dest); r.code != 0 {
		t.Fatalf("collect on node A: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	if got, err := os.ReadFile(filepath.Join(dest, "out.txt")); err != nil || string(got) != "done\n" {
		t.Errorf("collected %q %v", got, err)
	}
}
