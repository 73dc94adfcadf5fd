package test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentloom/loomfs/store"
)

// These tests need the Docker engine and the sandbox image that
// scripts/setup provides; in CI their absence is a failure, not a skip.

func (c *cli) stateDir(scope string) string {
	sc, err := store.ParseScope(scope)
	if err != nil {
		c.t.Fatal(err)
	}
	return filepath.Join(c.root, store.LocksDir, sc.Hash())
}

// syncBuffer is a bytes.Buffer a running process writes while a test reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// start runs loomfs in the background.
func (c *cli) start(args ...string) (*exec.Cmd, *syncBuffer) {
	c.t.Helper()
	cmd := exec.Command(loomfsBin, append([]string{"--root", c.root}, args...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd, out
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// loomfsContainers lists the containers carrying loomfs's labels for scope.
func loomfsContainers(t *testing.T, scope string) []string {
	sc, _ := store.ParseScope(scope)
	out, err := exec.Command("docker", "ps", "-aq", "--filter", "label=io.loomfs.scope_hash="+sc.Hash()).Output()
	if err != nil {
		t.Fatalf("docker ps: %v", err)
	}
	return strings.Fields(string(out))
}

func TestCommandEndToEnd(t *testing.T) {
	c := newCLI(t)
	const scope = "sp/ag/cmd"
	c.tool(scope, "workspace_write", `{"path":"in.txt","content":"3\n4\n5\n"}`)
	r := c.run("", "run", "--scope", scope, "--", "python3", "-c",
		`import os; n=sum(int(x) for x in open("in.txt")); open("out.txt","w").write(str(n)); print("uid", os.getuid())`)
	if r.code != 0 || !strings.Contains(string(r.stdout), "uid 1000") {
		t.Fatalf("run: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if m, _ := c.tool(scope, "workspace_read", `{"path":"out.txt"}`); m["content"] != "12" {
		t.Fatalf("result through the tools: %v", m)
	}
	if r := c.run("", "run", "--scope", scope, "--", "sh", "-c", "exit 3"); r.code != 3 {
		t.Fatalf("exit code not passed through: %d", r.code)
	}
	m, code := c.tool(scope, "workspace_command", `{"command":"echo out; echo err >&2; touch made; stat -c %a made","timeout_s":30}`)
	if code != 0 || m["stdout"] != "out\n600\n" || m["stderr"] != "err\n" || m["exit_code"] != 0.0 {
		t.Fatalf("workspace_command: %v", m)
	}
	if r := c.run("", "run", "--scope", scope, "--timeout", "1", "--", "sleep", "30"); r.code != exitTimedOutCode {
		t.Fatalf("timeout: exit %d (%s)", r.code, r.stderr)
	}
	if left := loomfsContainers(t, scope); len(left) != 0 {
		t.Fatalf("containers left behind: %v", left)
	}
	if _, err := os.Stat(filepath.Join(c.stateDir(scope), store.ExecMarker)); !os.IsNotExist(err) {
		t.Fatalf("execution marker left after confirmed cleanup: %v", err)
	}
}

const exitTimedOutCode = 124

// TestEscapesFromInsideContainer: a process in the sandbox meets the same
// policy through the projection. A symlink it makes is emulated: inside
// the container it resolves against the container's own view, and the
// backing store holds no symlink.
func TestEscapesFromInsideContainer(t *testing.T) {
	c := newCLI(t)
	const scope = "sp/ag/esc"
	script := `
ln -s /etc/passwd link && [ "$(readlink link)" = /etc/passwd ] && cmp -s link /etc/passwd && echo symlink-emulated
echo x > f; ln f hard 2>/dev/null && echo hardlink-made || echo hardlink-refused
mkfifo p 2>/dev/null && echo fifo-made || echo fifo-refused
mkdir .agentloom-x 2>/dev/null && echo reserved-made || echo reserved-refused
chmod u+s f 2>/dev/null && echo suid-made || echo suid-refused
ls -a /workspace | tr '\n' ' '`
	r := c.run("", "run", "--scope", scope, "--", script)
	out := string(r.stdout)
	for _, want := range []string{"symlink-emulated", "hardlink-refused", "fifo-refused", "reserved-refused", "suid-refused"} {
		if !strings.Contains(out, want) {
			t.Errorf("want %s in %q (stderr %q)", want, out, r.stderr)
		}
	}
	sc, err := store.ParseScope(scope)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(filepath.Join(c.root, sc.Dir(), "link"))
	if err != nil || !fi.Mode().IsRegular() {
		t.Errorf("the backing store holds the link as %v (%v), want a regular file", fi.Mode(), err)
	}
}

// TestCommandHoldsScopeLock: a write from another process waits until a
// running command ends.
func TestCommandHoldsScopeLock(t *testing.T) {
	c := newCLI(t)
	const scope = "sp/ag/lock"
	run, out := c.start("run", "--scope", scope, "--", "sh", "-c", "sleep 2; echo end > ended")
	marker := filepath.Join(c.stateDir(scope), store.ExecMarker)
	waitFor(t, "the execution marker", func() bool { _, err := os.Stat(marker); return err == nil })
	if m, code := c.tool(scope, "workspace_write", `{"path":"w","content":"x"}`); code != 0 {
		t.Fatalf("write: %v", m)
	}
	if m, _ := c.tool(scope, "workspace_read", `{"path":"ended"}`); m["content"] != "end\n" {
		t.Fatalf("the write finished before the command ended: %v", m)
	}
	if err := run.Wait(); err != nil {
		t.Fatalf("run: %v: %s", err, out)
	}
}

// TestQuarantineAfterWorkerDies: the worker is killed while its container
// runs. The marker stays, the next writer quarantines the scope, reads
// still work, and an administrator clears it only once the container is
// gone.
func TestQuarantineAfterWorkerDies(t *testing.T) {
	c := newCLI(t)
	const scope = "sp/ag/q"
	c.tool(scope, "workspace_write", `{"path":"keep","content":"k"}`)
	run, _ := c.start("run", "--scope", scope, "--", "sleep", "60")
	marker := filepath.Join(c.stateDir(scope), store.ExecMarker)
	var names []string
	waitFor(t, "the container", func() bool { names = loomfsContainers(t, scope); return len(names) == 1 })
	waitFor(t, "the execution marker", func() bool { _, err := os.Stat(marker); return err == nil })
	run.Process.Signal(syscall.SIGKILL)
	run.Wait()
	t.Cleanup(func() { exec.Command("docker", "rm", "-f", names[0]).Run() })

	m, code := c.tool(scope, "workspace_write", `{"path":"w","content":"x"}`)
	if code != 1 || errCode(m) != "quarantined" {
		t.Fatalf("write after a dead worker: %v", m)
	}
	if m, code := c.tool(scope, "workspace_command", `{"command":"true"}`); code != 1 || errCode(m) != "quarantined" {
		t.Fatalf("command in a quarantined scope: %v", m)
	}
	if m, code := c.tool(scope, "workspace_read", `{"path":"keep"}`); code != 0 || m["content"] != "k" {
		t.Fatalf("read in a quarantined scope: %v", m)
	}
	r := c.run("", "--json", "quarantine", "list")
	var list []store.Marker
	if err := json.Unmarshal(r.stdout, &list); err != nil || len(list) != 1 || list[0].Scope != scope {
		t.Fatalf("quarantine list: %s %v", r.stdout, err)
	}
	name := list[0].Container
	if r := c.run("", "quarantine", "clear", "--scope", scope, "--container", name); r.code != 1 {
		t.Fatalf("clear while the container exists: exit %d %s", r.code, r.stdout)
	}
	if r := c.run("", "quarantine", "clear", "--scope", scope, "--container", "loomfs-other"); r.code == 0 {
		t.Fatal("clear accepted the wrong container name")
	}
	if err := exec.Command("docker", "rm", "-f", name).Run(); err != nil {
		t.Fatal(err)
	}
	if r := c.run("", "quarantine", "clear", "--scope", scope, "--container", name); r.code != 0 {
		t.Fatalf("clear: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	if m, code := c.tool(scope, "workspace_write", `{"path":"w","content":"x"}`); code != 0 {
		t.Fatalf("write after clear: %v", m)
	}
	// The dead worker's projection was detached by the next command.
	if r := c.run("", "run", "--scope", scope, "--", "true"); r.code != 0 {
		t.Fatalf("run after clear: %d %s", r.code, r.stderr)
	}
	for _, dir := range staleProjections() {
		t.Errorf("stale projection left mounted at %s", dir)
		syscall.Unmount(dir, syscall.MNT_DETACH)
	}
}

// staleProjections lists loomfs mounts whose daemon is gone.
func staleProjections() []string {
	var out []string
	mounts, _ := os.ReadFile("/proc/mounts")
	for _, line := range strings.Split(string(mounts), "\n") {
		f := strings.Fields(line)
		if len(f) > 2 && f[2] == "fuse.loomfs" {
			var st syscall.Statfs_t
			if err := syscall.Statfs(f[1], &st); err == syscall.ENOTCONN {
				out = append(out, f[1])
			}
		}
	}
	return out
}
