package test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/tools"
)

// serveEnv is a node service over a fresh root, in directories of the
// test's own.
type serveEnv struct {
	*cli
	socket, mountDir string
	cmd              *exec.Cmd
	out              *syncBuffer
	extraEnv         []string // more environment for every loomfs of the test
}

// env is what every loomfs of these tests runs with: the test's socket and
// the image with python3.
func (s *serveEnv) env() []string {
	return append(append(cliEnv(), "AGENT_LOOM_SERVE_SOCKET="+s.socket, "AGENT_LOOM_SANDBOX_IMAGE=loomfs-sandbox-dev:latest"), s.extraEnv...)
}

func newServeEnv(t *testing.T, extraEnv ...string) *serveEnv {
	dir := t.TempDir()
	s := &serveEnv{cli: newCLI(t), socket: filepath.Join(dir, "sock", "serve.sock"), mountDir: filepath.Join(dir, "mnt"), extraEnv: extraEnv}
	t.Cleanup(func() { detachUnder(s.mountDir) })
	s.serve()
	return s
}

// serve starts loomfs serve as node-a and waits until it listens.
func (s *serveEnv) serve() {
	s.t.Helper()
	s.serveAs("node-a")
}

// serveAs starts loomfs serve as node, with more arguments, and waits
// until it listens.
func (s *serveEnv) serveAs(node string, args ...string) {
	s.t.Helper()
	cmd := exec.Command(loomfsBin, append([]string{"--root", s.root, "serve", "--socket", s.socket, "--mount-dir", s.mountDir, "--node", node}, args...)...)
	cmd.Env = s.env()
	s.out = &syncBuffer{}
	cmd.Stdout, cmd.Stderr = s.out, s.out
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.cmd = cmd
	s.t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	})
	out := s.out
	waitFor(s.t, "loomfs serve to listen", func() bool { return strings.Contains(out.String(), "serving processes") })
}

func (s *serveEnv) loomfs(stdin string, args ...string) result {
	s.t.Helper()
	cmd := exec.Command(loomfsBin, append([]string{"--root", s.root}, args...)...)
	cmd.Env = s.env()
	cmd.Stdin = strings.NewReader(stdin)
	return runCmd(s.t, cmd)
}

// tool runs one tool call as its own loomfs process.
func (s *serveEnv) tool(name, scope string, in map[string]any, out any) result {
	s.t.Helper()
	b, _ := json.Marshal(in)
	r := s.loomfs("", "tool", name, "--scope", scope, "--input", string(b))
	if r.code == 0 && out != nil {
		if err := json.Unmarshal(r.stdout, out); err != nil {
			s.t.Fatalf("%s: %s: %v", name, r.stdout, err)
		}
	}
	return r
}

// detachUnder detaches every mount below dir (a killed service leaves its
// projections behind).
func detachUnder(dir string) {
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	for _, l := range strings.Split(string(mi), "\n") {
		f := strings.Fields(l)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			unix.Unmount(f[4], unix.MNT_DETACH)
		}
	}
}

// A process started by one loomfs process is read and written by later
// ones, and one started by an MCP client is read by a second MCP client:
// the node service owns them.
func TestProcessesAcrossCallers(t *testing.T) {
	s := newServeEnv(t)
	scope := "acme/coder/procs"
	var out tools.ProcessOutput
	if r := s.tool(tools.ProcessStart, scope, map[string]any{"command": "python3 -i -q", "yield_ms": 200}, &out); r.code != 0 {
		t.Fatalf("start: %d %s %s", r.code, r.stdout, r.stderr)
	}
	var w tools.ProcessOutput
	if r := s.tool(tools.ProcessWrite, scope, map[string]any{"process_id": out.ProcessID, "input": "n = 41\nprint(n + 1)\n", "yield_ms": 5000}, &w); r.code != 0 || !strings.Contains(w.Stdout, "42") {
		t.Fatalf("write from another process: %d %s", r.code, r.stdout)
	}

	mcpClient := func() *mcp.ClientSession {
		cmd := exec.Command(loomfsBin, "--root", s.root, "mcp", "--scope", scope)
		cmd.Env = s.env()
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "loomfs-test", Version: "1"}, nil).Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cs.Close() })
		return cs
	}
	call := func(cs *mcp.ClientSession, name string, args map[string]any, out any) {
		t.Helper()
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
		if err != nil || res.IsError {
			t.Fatalf("%s over MCP: %v %+v", name, err, res)
		}
		b, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatal(err)
		}
	}
	first, second := mcpClient(), mcpClient()
	var started tools.ProcessOutput
	call(first, tools.ProcessStart, map[string]any{"command": "echo ready; read x; echo got:$x", "yield_ms": 1000}, &started)
	var r tools.ProcessOutput
	call(second, tools.ProcessWrite, map[string]any{"process_id": started.ProcessID, "input": "from-the-second\n", "yield_ms": 5000}, &r)
	var end tools.ProcessOutput // the exit may follow the answer by a moment
	call(second, tools.ProcessRead, map[string]any{"process_id": started.ProcessID, "since": r.Cursor, "yield_ms": 5000}, &end)
	r = tools.ProcessOutput{}
	call(second, tools.ProcessRead, map[string]any{"process_id": started.ProcessID}, &r)
	if r.Stdout != "ready\ngot:from-the-second\n" || r.Status != tools.StatusExited {
		t.Fatalf("second MCP client read %+v", r)
	}
	// The text a model reads strips terminal control sequences.
	call(first, tools.ProcessStart, map[string]any{"command": `printf '\033[1;31mred\033[0m\n'`, "tty": true, "yield_ms": 5000}, &r)
	res, err := first.CallTool(context.Background(), &mcp.CallToolParams{Name: tools.ProcessRead, Arguments: map[string]any{"process_id": r.ProcessID}})
	if err != nil {
		t.Fatal(err)
	}
	text := res.Content[0].(*mcp.TextContent).Text
	if !strings.HasPrefix(text, "red\n") || strings.Contains(text, "\x1b") || !strings.Contains(r.Output, "\x1b[1;31m") {
		t.Fatalf("text %q, raw %q: want the text stripped and the raw bytes kept", text, r.Output)
	}

	if r := s.loomfs("", "processes", "stop", "--scope", scope); r.code != 0 {
		t.Fatalf("processes stop: %d %s %s", r.code, r.stdout, r.stderr)
	}
	if n := len(loomfsContainers(t, scope)); n != 0 {
		t.Fatalf("%d containers left after processes stop", n)
	}
}

// kill -9 of the service holding a live session leaves the scope
// quarantined at the next write; the orphan is reported, and the
// quarantine can't be cleared while the container exists.
func TestServiceKilledWithLiveSession(t *testing.T) {
	s := newServeEnv(t)
	scope := "acme/coder/killed"
	var out tools.ProcessOutput
	if r := s.tool(tools.ProcessStart, scope, map[string]any{"command": "sleep 600", "yield_ms": 100}, &out); r.code != 0 {
		t.Fatalf("start: %d %s %s", r.code, r.stdout, r.stderr)
	}
	t.Cleanup(func() { exec.Command("docker", "rm", "-f", out.Container).Run() })
	s.cmd.Process.Kill()
	s.cmd.Wait()
	detachUnder(s.mountDir)

	// With no service, the records still say who ran what.
	r := s.loomfs("", "--json", "processes", "list", "--scope", scope)
	var listed []tools.ProcessInfo
	if err := json.Unmarshal(r.stdout, &listed); r.code != 0 || err != nil || len(listed) != 1 || listed[0].Node != "node-a" || listed[0].Container != out.Container || listed[0].Command != "sleep 600" {
		t.Fatalf("processes list without a service: %d %s %s", r.code, r.stdout, r.stderr)
	}
	if r := s.loomfs("", "processes", "show", "--scope", scope, out.ProcessID); r.code != 0 || !strings.Contains(string(r.stdout), `"exec_id"`) {
		t.Fatalf("processes show: %d %s %s", r.code, r.stdout, r.stderr)
	}
	if r := s.loomfs("", "processes", "stop", "--scope", scope); r.code != 1 || !strings.Contains(string(r.stdout), "process_service_unavailable") {
		t.Fatalf("processes stop without a service: %d %s %s", r.code, r.stdout, r.stderr)
	}
	r = s.tool(tools.Write, scope, map[string]any{"path": "a.txt", "content": "x"}, nil)
	if r.code != 1 || !strings.Contains(string(r.stdout), `"quarantined"`) {
		t.Fatalf("write after the service died: %d %s, want quarantined", r.code, r.stdout)
	}
	r = s.loomfs("", "quarantine", "list")
	if !strings.Contains(string(r.stdout), out.Container) {
		t.Fatalf("quarantine list does not name %s: %s", out.Container, r.stdout)
	}
	r = s.loomfs("", "quarantine", "clear", "--scope", scope, "--container", out.Container)
	if r.code != 1 || !strings.Contains(r.stderr, "still exists") {
		t.Fatalf("clear while the container exists: %d %s %s", r.code, r.stdout, r.stderr)
	}
	s.serve() // a new service reports the orphan
	waitFor(t, "the orphan to be reported", func() bool { return strings.Contains(s.out.String(), out.Container) })
	if err := exec.Command("docker", "rm", "-f", out.Container).Run(); err != nil {
		t.Fatal(err)
	}
	r = s.loomfs("", "quarantine", "clear", "--scope", scope, "--container", out.Container)
	if r.code != 0 {
		t.Fatalf("clear once the container is gone: %d %s %s", r.code, r.stdout, r.stderr)
	}
	if r := s.tool(tools.Write, scope, map[string]any{"path": "a.txt", "content": "x"}, nil); r.code != 0 {
		t.Fatalf("write after the clear: %d %s", r.code, r.stdout)
	}
}

// loomfs run --tty gives a shell in the session sandbox and exits with
// its exit code.
func TestRunTTY(t *testing.T) {
	s := newServeEnv(t)
	r := s.loomfs("echo hi-$((6*7))\nexit 7\n", "run", "--tty", "--scope", "acme/coder/tty", "--", "sh")
	if r.code != 7 || !strings.Contains(string(r.stdout), "hi-42") {
		t.Fatalf("run --tty: %d %q %s", r.code, r.stdout, r.stderr)
	}
	var _ = time.Second
}

// A process left running by a service that was killed is shown ended by
// the next service of the node, not running forever.
func TestProcessOfDeadServiceEnds(t *testing.T) {
	s := newServeEnv(t)
	scope := "acme/coder/dead"
	var out tools.ProcessOutput
	if r := s.tool(tools.ProcessStart, scope, map[string]any{"command": "sleep 600", "yield_ms": 100}, &out); r.code != 0 {
		t.Fatalf("start: %d %s %s", r.code, r.stdout, r.stderr)
	}
	t.Cleanup(func() { exec.Command("docker", "rm", "-f", out.Container).Run() })
	s.cmd.Process.Kill()
	s.cmd.Wait()
	detachUnder(s.mountDir)
	s.serve()
	var list tools.ProcessListResult
	if r := s.tool(tools.ProcessList, scope, map[string]any{}, &list); r.code != 0 || len(list.Processes) != 1 || list.Processes[0].Status != tools.StatusExited {
		t.Fatalf("list after the service died: %d %s", r.code, r.stdout)
	}
}

// The issue's own scenario (issue 43) through loomfs serve and separate
// tool calls: `sleep 201 & sleep 202 & sleep 1` is reported exited only
// once both sleeps are gone, with left_running_killed 2; a KILL sent to a
// running process reaches a child that left its session; and a process
// read answers a since never past its cursor.
func TestProcessTreeEndsWithIt(t *testing.T) {
	s := newServeEnv(t)
	scope := "acme/coder/tree"
	t.Cleanup(func() { s.loomfs("", "processes", "stop", "--scope", scope) })
	sleeps := func(marker string) string {
		t.Helper()
		var out tools.ProcessOutput
		cmd := "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' 2>/dev/null <$f; echo; done | grep -c '^[s]leep " + marker + "'"
		if r := s.tool(tools.ProcessStart, scope, map[string]any{"command": cmd, "yield_ms": 10000}, &out); r.code != 0 || out.Status != tools.StatusExited {
			t.Fatalf("count: %d %s %s", r.code, r.stdout, r.stderr)
		}
		return strings.TrimSpace(out.Stdout)
	}
	var out tools.ProcessOutput
	if r := s.tool(tools.ProcessStart, scope, map[string]any{"command": "sleep 201 & sleep 202 & sleep 1", "yield_ms": 15000}, &out); r.code != 0 {
		t.Fatalf("start: %d %s %s", r.code, r.stdout, r.stderr)
	}
	if out.Status != tools.StatusExited || out.LeftRunningKilled == nil || *out.LeftRunningKilled != 2 {
		t.Fatalf("sleep 201 & sleep 202 & sleep 1: %+v, want exited with left_running_killed 2", out)
	}
	if n := sleeps("20[12]"); n != "0" {
		t.Fatalf("%s of the sleeps still run after their process exited", n)
	}
	var r tools.ProcessOutput
	if res := s.tool(tools.ProcessRead, scope, map[string]any{"process_id": out.ProcessID, "since": 1000}, &r); res.code != 0 || r.Since > r.Cursor {
		t.Fatalf("read past the end: %d %s, want since at most cursor", res.code, res.stdout)
	}

	if res := s.tool(tools.ProcessStart, scope, map[string]any{"command": "setsid sleep 301 </dev/null >/dev/null 2>&1 & exec sleep 302", "yield_ms": 500}, &out); res.code != 0 || out.Status != tools.StatusRunning {
		t.Fatalf("start: %d %s", res.code, res.stdout)
	}
	time.Sleep(2 * time.Second) // the issue sent its KILL two seconds later
	var info tools.ProcessInfo
	if res := s.tool(tools.ProcessSignal, scope, map[string]any{"process_id": out.ProcessID, "signal": "KILL"}, &info); res.code != 0 || info.Status != tools.StatusExited {
		t.Fatalf("KILL: %d %s", res.code, res.stdout)
	}
	if n := sleeps("30[12]"); n != "0" {
		t.Fatalf("%s processes of the tree survived its KILL", n)
	}
}
