package test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentloom/loomfs/changes"
	"github.com/agentloom/loomfs/store"
)

// The agent's other tools end to end: a patch cut by kill -9 midway, the
// change feed of writes made in a container, and loomfs watch.

// TestPatchKilledMidway: a patch whose process is killed (SIGKILL)
// between two file writes is finished by the next call that takes the
// scope lock: no one sees it half applied, and the killed call's id
// answers unknown_outcome.
func TestPatchKilledMidway(t *testing.T) {
	c := newCLI(t)
	const scope = "sp/ag/patchkill"
	for _, f := range []string{"a.txt", "b.txt", "c.txt"} {
		if m, code := c.tool(scope, "workspace_write", `{"path":"`+f+`","content":"old `+f+`\n"}`); code != 0 {
			t.Fatalf("seed %s: %v", f, m)
		}
	}
	patch := "*** Begin Patch\n*** Update File: a.txt\n@@\n-old a.txt\n+new a\n*** Update File: b.txt\n@@\n-old b.txt\n+new b\n*** Delete File: c.txt\n*** Add File: d.txt\n+new d\n*** End Patch"
	in, _ := json.Marshal(map[string]any{"patch": patch})
	cmd := exec.Command(loomfsBin, "--root", c.root, "tool", "workspace_apply_patch", "--scope", scope, "--call-id", "patch-1", "--input", string(in))
	cmd.Env = append(cliEnv(), "LOOMFS_TEST_CRASH_AFTER_FILES=1")
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ProcessState.String() != "signal: killed" {
		t.Fatalf("the patch was not killed midway: %v\n%s", err, out)
	}
	// On disk now: the first file written, the rest not.
	scopeDir := filepath.Join(c.root, "spaces/sp/agents/ag/sessions/patchkill/main")
	if b, _ := os.ReadFile(filepath.Join(scopeDir, "b.txt")); string(b) != "old b.txt\n" {
		t.Fatalf("the kill did not cut the patch between files: b.txt is %q", b)
	}
	// The next call, even a read, finds the patch whole: it takes the
	// lock, which finishes the patch first.
	if m, _ := c.tool(scope, "workspace_read", `{"path":"b.txt"}`); m["content"] != "new b\n" {
		t.Fatalf("a read after the kill: %v", m)
	}
	for f, want := range map[string]string{"a.txt": "new a\n", "b.txt": "new b\n", "d.txt": "new d\n"} {
		if m, _ := c.tool(scope, "workspace_read", `{"path":"`+f+`"}`); m["content"] != want {
			t.Errorf("%s after recovery: %v, want %q", f, m, want)
		}
	}
	if m, _ := c.tool(scope, "workspace_stat", `{"path":"c.txt"}`); errCode(m) != "not_found" {
		t.Errorf("c.txt after recovery: %v", m)
	}
	if left, _ := filepath.Glob(filepath.Join(scopeDir, ".agentloom-*")); len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
	if m, _ := c.tool(scope, "workspace_apply_patch", string(in), "--call-id", "patch-1"); errCode(m) != "unknown_outcome" {
		t.Errorf("replay of the killed call: %v", m)
	}
}

// TestChangesFromContainer: the change feed reports the writes a command
// makes in its container (a file, a directory renamed), with the
// command's call id, and never a hidden path; a waiting read returns as
// the change lands.
func TestChangesFromContainer(t *testing.T) {
	c := newCLI(t)
	const scope = "sp/ag/feed"
	pol := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(pol, []byte("preset: standard\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tool := func(name, input string, extra ...string) map[string]any {
		t.Helper()
		r := c.run("", append([]string{"--policy", pol, "tool", name, "--scope", scope, "--input", input}, extra...)...)
		var m map[string]any
		if err := json.Unmarshal(r.stdout, &m); err != nil || r.code != 0 {
			t.Fatalf("%s: exit %d %s %s", name, r.code, r.stdout, r.stderr)
		}
		return m
	}
	start := tool("workspace_changes", `{}`)["cursor"].(string)
	tool("workspace_mkdir", `{"path":"src/pkg","parents":true}`)
	tool("workspace_write", `{"path":"src/pkg/a.go","content":"package a\n"}`, "--call-id", "w-1")
	tool("workspace_command", `{"command":"echo hi > src/pkg/b.go; mv src/pkg src/lib; mkdir -p .meta && echo s > .meta/secret; echo t > tmp.txt 2>/dev/null; true","timeout_s":60}`, "--call-id", "cmd-1")

	page := tool("workspace_changes", `{"since":"`+start+`"}`)
	var got []string
	for _, e := range page["changes"].([]any) {
		m := e.(map[string]any)
		s := m["op"].(string) + " " + m["path"].(string)
		if to, _ := m["to"].(string); to != "" {
			s += " -> " + to
		}
		s += " by " + m["source"].(string)
		if id, _ := m["call_id"].(string); id != "" {
			s += " " + id
		}
		got = append(got, s)
		if strings.Contains(m["path"].(string), ".meta") || strings.Contains(m["path"].(string), "agentloom") {
			t.Errorf("hidden or internal path reported: %v", m)
		}
	}
	for _, want := range []string{
		"mkdir src/pkg by tool", // src/ is the layout's, made at open
		"create src/pkg/a.go by tool w-1",
		"create src/pkg/b.go by projection cmd-1",
		// The write's line is written when the kernel releases the file,
		// which it does after close(2) returns, so before or after the
		// rename: it names the file where it is then.
		"write src/pkg/b.go by projection cmd-1|write src/lib/b.go by projection cmd-1",
		"rename src/pkg -> src/lib by projection cmd-1",
		"create tmp.txt by projection cmd-1",
	} {
		found := false
		for _, g := range got {
			for _, w := range strings.Split(want, "|") {
				found = found || g == w
			}
		}
		if !found {
			t.Errorf("%q not in the feed:\n%s", want, strings.Join(got, "\n"))
		}
	}

	// loomfs watch streams the same; a command's write reaches it.
	w, out := c.start("--policy", pol, "watch", "--scope", scope, "--path", "src")
	waitFor(t, "watch's first cursor", func() bool { return strings.Contains(out.String(), `"cursor"`) })
	tool("workspace_command", `{"command":"echo x > src/lib/c.go","timeout_s":60}`, "--call-id", "cmd-2")
	waitFor(t, "watch to show the write", func() bool { return strings.Contains(out.String(), `"path":"src/lib/c.go"`) })
	w.Process.Signal(os.Interrupt)
	done := make(chan error, 1)
	go func() { done <- w.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("watch after SIGINT: %v\n%s", err, out)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("watch did not stop on SIGINT")
	}
	sc := bufio.NewScanner(strings.NewReader(out.String()))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Errorf("watch line is not JSON: %q", sc.Text())
		}
	}
}

// TestChangesFromTwoNodes: a reader on node A sees the changes made
// through node B's mount of the volume, by its tools and by a command in
// a container there.
func TestChangesFromTwoNodes(t *testing.T) {
	_, a, b := sharedVolume(t)
	const scope = "acme/coder/feed"
	start := a.mustTool(scope, "workspace_changes", `{}`)["cursor"].(string)
	a.mustTool(scope, "workspace_write", `{"path":"from-a.txt","content":"a"}`)
	b.mustTool(scope, "workspace_write", `{"path":"from-b.txt","content":"b"}`)
	cmd := b.command("tool", "workspace_command", "--scope", scope, "--call-id", "cmd-b", "--input", `{"command":"echo c > from-b-shell.txt","timeout_s":60}`)
	cmd.Env = append(cmd.Env, "AGENT_LOOM_SANDBOX_RUNTIME="+os.Getenv("AGENT_LOOM_SANDBOX_RUNTIME"))
	if r := runCmd(t, cmd); r.code != 0 {
		t.Fatalf("command on node B: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	var got []string
	pids := map[string]float64{}
	for try := 0; try < 50 && len(got) < 3; try++ {
		page := a.mustTool(scope, "workspace_changes", `{"since":"`+start+`","wait_ms":1000}`)
		got = got[:0]
		for _, e := range page["changes"].([]any) {
			m := e.(map[string]any)
			if m["op"] == "create" {
				got = append(got, m["path"].(string)+" by "+m["source"].(string))
				pids[m["path"].(string)], _ = m["pid"].(float64)
			}
		}
	}
	want := []string{"from-a.txt by tool", "from-b.txt by tool", "from-b-shell.txt by projection"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("node A's feed: %v, want %v", got, want)
	}
	if pids["from-a.txt"] == pids["from-b.txt"] {
		t.Errorf("the two nodes' writes name one process: %v", pids)
	}
}

// TestChangesLatencyBench measures how long after a write in a container
// a long-polling workspace_changes returns it: the container stamps each
// write (the host's clock), a reader in this process waits on
// the feed and stamps each arrival. Set LOOMFS_CHANGES_BENCH=N writes
// (bench/changes.sh runs it for BENCHMARKS.md).
func TestChangesLatencyBench(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("LOOMFS_CHANGES_BENCH"))
	if n < 1 {
		t.Skip("set LOOMFS_CHANGES_BENCH=50 (bench/changes.sh) to time the change feed")
	}
	c := newCLI(t)
	const scope = "sp/ag/latency"
	c.tool(scope, "workspace_mkdir", `{"path":"lat"}`)
	sc, _ := store.ParseScope(scope)
	vol, err := store.OpenVolume(context.Background(), store.Config{Root: c.root})
	if err != nil {
		t.Fatal(err)
	}
	defer vol.Close()
	ws, err := vol.Open(context.Background(), sc, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	start, err := changes.Read(context.Background(), ws, changes.Query{})
	if err != nil {
		t.Fatal(err)
	}
	arrived := map[string]time.Time{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		cur := start.Cursor
		for ctx.Err() == nil && len(arrived) < n {
			p, err := changes.Read(ctx, ws, changes.Query{Since: cur, Prefix: "lat", Wait: 10 * time.Second})
			if err != nil {
				return
			}
			now := time.Now()
			for _, e := range p.Changes {
				if e.Op == "create" {
					arrived[e.Path] = now
				}
			}
			cur = p.Cursor
		}
	}()
	// Stamped just before each write starts (busybox date has no %N).
	script := fmt.Sprintf(`python3 -c '
import time
for i in range(1, %d+1):
    t = time.time_ns()
    open("lat/f%%d" %% i, "w").close()
    print(i, t, flush=True)
    time.sleep(0.2)
'`, n)
	m, code := c.tool(scope, "workspace_command", fmt.Sprintf(`{"command":%q,"timeout_s":120}`, script))
	if code != 0 {
		t.Fatalf("command: %v", m)
	}
	select {
	case <-readerDone:
	case <-time.After(15 * time.Second):
		cancel()
		<-readerDone
	}
	var lat []time.Duration
	for _, line := range strings.Split(strings.TrimSpace(m["stdout"].(string)), "\n") {
		var i int
		var ns int64
		fmt.Sscanf(line, "%d %d", &i, &ns)
		if at, ok := arrived[fmt.Sprintf("lat/f%d", i)]; ok {
			lat = append(lat, at.Sub(time.Unix(0, ns)))
		}
	}
	if len(lat) != n {
		t.Fatalf("%d of %d writes reached the feed", len(lat), n)
	}
	slices.Sort(lat)
	pct := func(p int) time.Duration { return lat[(len(lat)-1)*p/100] }
	fmt.Printf("| writes | p50 | p90 | p99 | max |\n| ---: | ---: | ---: | ---: | ---: |\n| %d | %.1f ms | %.1f ms | %.1f ms | %.1f ms |\n",
		n, ms(pct(50)), ms(pct(90)), ms(pct(99)), ms(lat[len(lat)-1]))
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
