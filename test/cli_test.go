// Package test holds the end-to-end tests that cross packages and
// processes: the loomfs binary run as a subprocess, several processes on one
// root.
package test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentloom/loomfs/store"
	"github.com/agentloom/loomfs/tools"
)

var loomfsBin string

func TestMain(m *testing.M) {
	if os.Getenv("LOOMFS_TEST_HOLD_LOCK") != "" {
		holdLock()
		return
	}
	dir, err := os.MkdirTemp("", "loomfs-e2e-")
	if err != nil {
		panic(err)
	}
	loomfsBin = filepath.Join(dir, "loomfs")
	build := exec.Command("go", "build", "-o", loomfsBin, "../cmd/loomfs")
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build loomfs:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// cli runs loomfs with a fresh environment pointing at root.
type cli struct {
	t    *testing.T
	root string
}

func newCLI(t *testing.T) *cli {
	return &cli{t: t, root: t.TempDir()}
}

type result struct {
	code   int
	stdout []byte
	stderr string
}

func (c *cli) run(stdin string, args ...string) result {
	c.t.Helper()
	cmd := exec.Command(loomfsBin, append([]string{"--root", c.root}, args...)...)
	cmd.Env = cliEnv()
	cmd.Stdin = strings.NewReader(stdin)
	return runCmd(c.t, cmd)
}

// runCmd runs a prepared loomfs command and collects what it did.
func runCmd(t testing.TB, cmd *exec.Cmd) result {
	t.Helper()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run loomfs: %v", err)
	}
	return result{code, out.Bytes(), errb.String()}
}

// tool runs one tool and decodes its JSON output (result or error).
func (c *cli) tool(scope, name, input string, extra ...string) (map[string]any, int) {
	c.t.Helper()
	r := c.run("", append([]string{"tool", name, "--scope", scope, "--input", input}, extra...)...)
	var m map[string]any
	if err := json.Unmarshal(r.stdout, &m); err != nil {
		c.t.Fatalf("loomfs tool %s: exit %d, stdout %q is not JSON (stderr %s)", name, r.code, r.stdout, r.stderr)
	}
	return m, r.code
}

func errCode(m map[string]any) string {
	e, _ := m["error"].(map[string]any)
	s, _ := e["code"].(string)
	return s
}

func TestExitCodes(t *testing.T) {
	c := newCLI(t)
	cases := []struct {
		name string
		args []string
		want int
	}{
		{"success", []string{"tool", "workspace_list", "--scope", "a/b/c"}, 0},
		{"refusal", []string{"tool", "workspace_read", "--scope", "a/b/c", "--input", `{"path":"../x"}`}, 1},
		{"unknown tool", []string{"tool", "nope", "--scope", "a/b/c"}, 2},
		{"missing scope", []string{"tool", "workspace_list"}, 2},
		{"bad scope", []string{"tool", "workspace_list", "--scope", "a/../c"}, 2},
		{"unknown flag", []string{"tool", "workspace_list", "--bogus"}, 2},
		{"unknown command", []string{"frobnicate"}, 2},
		{"tools", []string{"tools"}, 0},
		{"help", []string{"tool", "--help"}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if r := c.run("", tc.args...); r.code != tc.want {
				t.Fatalf("exit %d, want %d (stdout %s, stderr %s)", r.code, tc.want, r.stdout, r.stderr)
			}
		})
	}
	r := c.run("", "tool", "workspace_read", "--scope", "a/b/c", "--input", `{"path":"/etc/passwd"}`)
	var m map[string]any
	if json.Unmarshal(r.stdout, &m) != nil || errCode(m) != "invalid_path" {
		t.Fatalf("refusal output %s", r.stdout)
	}
}

func TestToolsListsDefinitions(t *testing.T) {
	c := newCLI(t)
	r := c.run("", "tools")
	var defs []struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		InputSchema json.RawMessage `json:"input_schema"`
	}
	if err := json.Unmarshal(r.stdout, &defs); err != nil || len(defs) != len(tools.Names) {
		t.Fatalf("loomfs tools: %v, %d definitions, want %d", err, len(defs), len(tools.Names))
	}
	for i, d := range defs {
		if d.Name != tools.Names[i] || d.Description == "" || len(d.InputSchema) == 0 {
			t.Errorf("definition %d: %s, want %s with a description and a schema", i, d.Name, tools.Names[i])
		}
	}
}

func TestInputFromStdin(t *testing.T) {
	c := newCLI(t)
	r := c.run(`{"path":"s.txt","content":"from stdin"}`, "tool", "workspace_write", "--scope", "a/b/c", "--input", "-")
	if r.code != 0 {
		t.Fatalf("exit %d: %s %s", r.code, r.stdout, r.stderr)
	}
	m, _ := c.tool("a/b/c", "workspace_read", `{"path":"s.txt"}`)
	if m["content"] != "from stdin" {
		t.Fatal(m)
	}
}

func TestScopeIsolation(t *testing.T) {
	c := newCLI(t)
	c.tool("sp/ag/s1", "workspace_write", `{"path":"f","content":"s1"}`)
	if m, code := c.tool("sp/ag/s2", "workspace_read", `{"path":"f"}`); code != 1 || errCode(m) != "not_found" {
		t.Fatalf("session s2 sees s1's file: %v", m)
	}
	if m, code := c.tool("sp/other/s1", "workspace_read", `{"path":"f"}`); code != 1 || errCode(m) != "not_found" {
		t.Fatalf("another agent sees the file: %v", m)
	}
	if m, code := c.tool("sp/ag/s1/run1/sub-1", "workspace_read", `{"path":"f"}`); code != 1 || errCode(m) != "not_found" {
		t.Fatalf("a child instance sees the main scope: %v", m)
	}
	c.tool("sp/ag/s1/run1/sub-1", "workspace_write", `{"path":"g","content":"run1"}`)
	if m, code := c.tool("sp/ag/s1/run2/sub-1", "workspace_read", `{"path":"g"}`); code != 1 || errCode(m) != "not_found" {
		t.Fatalf("next run's sub-1 inherits this run's files: %v", m)
	}
	sc := store.Scope{Space: "sp", Agent: "ag", Session: "s1", Run: "run1", Instance: "sub-1"}
	if _, err := os.Stat(filepath.Join(c.root, sc.Dir(), "g")); err != nil || !strings.Contains(sc.Dir(), "run1") {
		t.Fatalf("child dir %s: %v", sc.Dir(), err)
	}
}

// TestConcurrentCASProcesses: 50 processes each do read → increment →
// CAS write through the CLI, retrying on conflict; no update is lost.
func TestConcurrentCASProcesses(t *testing.T) {
	c := newCLI(t)
	const procs, each = 50, 2
	c.tool("sp/ag/s", "workspace_write", `{"path":"counter","content":"0"}`)
	var wg sync.WaitGroup
	errs := make(chan error, procs)
	for p := 0; p < procs; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; {
				r := c.run("", "tool", "workspace_read", "--scope", "sp/ag/s", "--input", `{"path":"counter"}`)
				var m map[string]any
				if json.Unmarshal(r.stdout, &m) != nil || r.code != 0 {
					errs <- fmt.Errorf("read: %s", r.stdout)
					return
				}
				n, _ := strconv.Atoi(m["content"].(string))
				in, _ := json.Marshal(map[string]any{"path": "counter", "content": strconv.Itoa(n + 1), "expected_sha256": m["sha256"]})
				w := c.run("", "tool", "workspace_write", "--scope", "sp/ag/s", "--input", string(in))
				var wm map[string]any
				json.Unmarshal(w.stdout, &wm)
				switch {
				case w.code == 0:
					i++
				case errCode(wm) == "conflict":
					// Back off like a real client, so 50 contenders don't livelock.
					time.Sleep(time.Duration(rand.IntN(30)) * time.Millisecond)
				default:
					errs <- fmt.Errorf("write: %s %s", w.stdout, w.stderr)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	m, _ := c.tool("sp/ag/s", "workspace_read", `{"path":"counter"}`)
	if m["content"] != strconv.Itoa(procs*each) {
		t.Fatalf("counter %v, want %d: updates were lost", m["content"], procs*each)
	}
}

// holdLock runs in a child process: take the scope lock, say so, hold it,
// leave a file saying it is about to release, release.
func holdLock() {
	root, scope := os.Getenv("LOOMFS_TEST_ROOT"), os.Getenv("LOOMFS_TEST_HOLD_LOCK")
	ctx := context.Background()
	vol, err := store.OpenVolume(ctx, store.Config{Root: root})
	if err != nil {
		panic(err)
	}
	sc, _ := store.ParseScope(scope)
	ws, err := vol.Open(ctx, sc, nil)
	if err != nil {
		panic(err)
	}
	unlock, err := ws.Lock(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("locked")
	time.Sleep(1500 * time.Millisecond)
	os.WriteFile(filepath.Join(root, "released"), nil, 0o600)
	unlock()
}

// TestWriteWaitsForScopeLock: a process holding the scope lock (as a
// running command does) holds off a write from another process.
func TestWriteWaitsForScopeLock(t *testing.T) {
	c := newCLI(t)
	holder := exec.Command(os.Args[0])
	holder.Env = append(os.Environ(), "LOOMFS_TEST_HOLD_LOCK=sp/ag/s", "LOOMFS_TEST_ROOT="+c.root)
	out, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Process.Kill(); holder.Wait() })
	buf := make([]byte, 7)
	if _, err := out.Read(buf); err != nil || string(buf) != "locked\n" {
		t.Fatalf("holder: %q %v", buf, err)
	}
	m, code := c.tool("sp/ag/s", "workspace_write", `{"path":"w","content":"x"}`)
	if code != 0 {
		t.Fatalf("write: %v", m)
	}
	if _, err := os.Stat(filepath.Join(c.root, "released")); err != nil {
		t.Fatal("the write finished while another process held the scope lock")
	}
	lockFile := filepath.Join(c.root, store.LocksDir, store.Scope{Space: "sp", Agent: "ag", Session: "s"}.Hash(), store.LockFile)
	if _, err := os.Stat(lockFile); err != nil {
		t.Fatalf("lock file: %v", err)
	}
}

func TestReplayThroughCLI(t *testing.T) {
	c := newCLI(t)
	in := `{"path":"r","content":"once"}`
	first := c.run("", "tool", "workspace_write", "--scope", "sp/ag/s", "--input", in, "--call-id", "c-1")
	c.tool("sp/ag/s", "workspace_write", `{"path":"r","content":"changed"}`)
	again := c.run("", "tool", "workspace_write", "--scope", "sp/ag/s", "--input", in, "--call-id", "c-1")
	if first.code != 0 || !bytes.Equal(first.stdout, again.stdout) {
		t.Fatalf("replay differs: %s vs %s", first.stdout, again.stdout)
	}
	if m, _ := c.tool("sp/ag/s", "workspace_read", `{"path":"r"}`); m["content"] != "changed" {
		t.Fatalf("replay wrote again: %v", m)
	}
	// A write recorded as started by a worker that died: unknown_outcome.
	vol, err := store.OpenVolume(context.Background(), store.Config{Root: c.root})
	if err != nil {
		t.Fatal(err)
	}
	defer vol.Close()
	ws, err := vol.Open(context.Background(), store.Scope{Space: "sp", Agent: "ag", Session: "s"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	in2 := `{"path":"u","content":"x"}`
	if _, err := ws.BeginCall(context.Background(), "c-2", "workspace_write", []byte(in2)); err != nil {
		t.Fatal(err)
	}
	if m, code := c.tool("sp/ag/s", "workspace_write", in2, "--call-id", "c-2"); code != 1 || errCode(m) != "unknown_outcome" {
		t.Fatalf("unfinished call: %v", m)
	}
	if m, _ := c.tool("sp/ag/s", "workspace_stat", `{"path":"u"}`); errCode(m) != "not_found" {
		t.Fatalf("unknown-outcome write ran: %v", m)
	}
}
