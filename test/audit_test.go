package test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// record is what the audit log holds of one event, as audit query --json
// prints it.
type record struct {
	Kind   string `json:"kind"`
	Node   string `json:"node"`
	PID    int    `json:"pid"`
	Seq    uint64 `json:"seq"`
	CallID string `json:"call_id"`
	Actor  struct {
		Space, Agent, Session, Container, Operator string
	} `json:"actor"`
	Scope  string         `json:"scope"`
	Source string         `json:"source"`
	Op     string         `json:"op"`
	Path   string         `json:"path"`
	Bytes  int64          `json:"bytes"`
	SHA256 string         `json:"sha256"`
	Result string         `json:"result"`
	Code   string         `json:"code"`
	Detail map[string]any `json:"detail"`
}

func (c *cli) auditRecords(scope string) []record {
	c.t.Helper()
	r := c.run("", "--json", "audit", "query", "--scope", scope)
	if r.code != 0 {
		c.t.Fatalf("audit query: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	var out []record
	sc := bufio.NewScanner(bytes.NewReader(r.stdout))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var rec record
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			c.t.Fatalf("audit query line %q: %v", sc.Text(), err)
		}
		out = append(out, rec)
	}
	return out
}

func find(recs []record, match func(record) bool) *record {
	for i := range recs {
		if match(recs[i]) {
			return &recs[i]
		}
	}
	return nil
}

// TestAuditEveryDoor: a tool write, a write through a real mount, a
// sandbox command writing a file and a symlink refused inside its
// container each leave their records, with the right fields, and the log
// verifies.
func TestAuditEveryDoor(t *testing.T) {
	c := newCLI(t)
	const scope = "sp/ag/audit"
	hash := filepath.Base(c.stateDir(scope))

	// 1. The tool door.
	if m, code := c.tool(scope, "workspace_write", `{"path":"tool.txt","content":"from the tool"}`, "--call-id", "audit-call-1"); code != 0 {
		t.Fatalf("write: %v", m)
	}

	// 2. A real mount, written by a process on the host.
	base := t.TempDir()
	os.Chmod(base, 0o700)
	mnt := filepath.Join(base, "mnt")
	os.Mkdir(mnt, 0o755)
	mount, out := c.start("mount", "--scope", scope, mnt)
	waitFor(t, "the mount", func() bool { return strings.Contains(out.String(), "mounted ") })
	if err := os.WriteFile(filepath.Join(mnt, "fuse.txt"), []byte("through the mount"), 0o600); err != nil {
		t.Fatal(err)
	}
	mount.Process.Signal(syscall.SIGTERM)
	if err := mount.Wait(); err != nil {
		t.Fatalf("mount: %v: %s", err, out)
	}

	// 3. A sandbox command writing a file and a symlink, and a refused
	// FIFO in it.
	r := c.run("", "run", "--scope", scope, "--call-id", "audit-call-2", "--", "sh", "-c", "echo hi > cmd.txt; ln -s /etc/passwd escape; mkfifo pipe; true")
	if r.code != 0 {
		t.Fatalf("run: %d %s %s", r.code, r.stdout, r.stderr)
	}

	recs := c.auditRecords(scope)
	checks := []struct {
		name  string
		match func(record) bool
	}{
		{"tool call started", func(r record) bool {
			return r.Source == "tool" && r.Op == "workspace_write" && r.Result == "started" && r.CallID == "audit-call-1"
		}},
		{"tool write with bytes and sha256", func(r record) bool {
			return r.Source == "tool" && r.Op == "workspace_write" && r.Result == "ok" && r.CallID == "audit-call-1" &&
				r.Path == "tool.txt" && r.Bytes == 13 && len(r.SHA256) == 64 && r.Scope == hash &&
				r.Actor.Space == "sp" && r.Actor.Agent == "ag" && r.Actor.Session == "audit"
		}},
		{"create through the mount", func(r record) bool {
			return r.Source == "fuse" && r.Op == "create" && r.Path == "fuse.txt" && r.Result == "ok" && r.Actor.Container == ""
		}},
		{"bytes written through the mount at release", func(r record) bool {
			return r.Source == "fuse" && r.Op == "release" && r.Path == "fuse.txt" && r.Bytes > 0
		}},
		{"container created", func(r record) bool {
			return r.Source == "sandbox" && r.Op == "container_create" && r.CallID == "audit-call-2" && strings.HasPrefix(r.Actor.Container, "loomfs-")
		}},
		{"container removal confirmed", func(r record) bool {
			return r.Source == "sandbox" && r.Op == "container_removed" && r.CallID == "audit-call-2"
		}},
		{"file the command wrote, with its call id and container", func(r record) bool {
			return r.Source == "fuse" && r.Op == "create" && r.Path == "cmd.txt" && r.CallID == "audit-call-2" && strings.HasPrefix(r.Actor.Container, "loomfs-")
		}},
		{"symlink made inside the container", func(r record) bool {
			return r.Source == "fuse" && r.Op == "symlink" && r.Path == "escape" && r.Result == "ok" &&
				r.CallID == "audit-call-2" && strings.HasPrefix(r.Actor.Container, "loomfs-")
		}},
		{"fifo refused inside the container", func(r record) bool {
			return r.Source == "fuse" && r.Op == "mknod" && r.Path == "pipe" && r.Result == "refused" && r.Code == "special_file_refused" &&
				r.CallID == "audit-call-2" && strings.HasPrefix(r.Actor.Container, "loomfs-")
		}},
		{"command outcome", func(r record) bool {
			return r.Source == "tool" && r.Op == "workspace_command" && r.Result == "ok" && r.CallID == "audit-call-2"
		}},
	}
	for _, ch := range checks {
		if find(recs, ch.match) == nil {
			t.Errorf("no audit record: %s", ch.name)
		}
	}
	for _, rec := range recs {
		if rec.Node == "" || rec.PID == 0 || rec.Seq == 0 {
			t.Errorf("record without node, pid or seq: %+v", rec)
		}
	}
	if t.Failed() {
		b, _ := json.MarshalIndent(recs, "", " ")
		t.Logf("records:\n%s", b)
	}
	if v := c.run("", "audit", "verify"); v.code != 0 {
		t.Fatalf("audit verify: %d %s %s", v.code, v.stdout, v.stderr)
	}
}

// TestAuditUnavailableRefuses: when the log can't be written the tool
// refuses with audit_unavailable and the workspace is unchanged.
func TestAuditUnavailableRefuses(t *testing.T) {
	c := newCLI(t)
	const scope = "sp/ag/noaudit"
	c.tool(scope, "workspace_write", `{"path":"keep","content":"k"}`)
	dir := filepath.Join(c.root, ".agentloom-audit")
	// A file where the log directory should be: even root can't write there.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	m, code := c.tool(scope, "workspace_write", `{"path":"new","content":"x"}`)
	if code != 1 || errCode(m) != "audit_unavailable" {
		t.Fatalf("write without an audit log: %v", m)
	}
	os.Remove(dir)
	if m, _ := c.tool(scope, "workspace_stat", `{"path":"new"}`); errCode(m) != "not_found" {
		t.Fatalf("the refused write changed the workspace: %v", m)
	}
	// And loomfs check says so while it lasts.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	r := c.run("", "--json", "check")
	if r.code != 1 || !strings.Contains(string(r.stdout), "audit") {
		t.Fatalf("check with an unwritable audit log: exit %d %s", r.code, r.stdout)
	}
}

// TestAuditToolCallsShareFiles: many short-lived loomfs tool processes
// (LOOMFS_AUDIT_TOOL_CALLS, default 1000), four at a time, append to their
// node's one chain: a handful of files, every record there, the ledger
// registering and closing each process, and the log verifies.
func TestAuditToolCallsShareFiles(t *testing.T) {
	calls := 1000
	if v := os.Getenv("LOOMFS_AUDIT_TOOL_CALLS"); v != "" {
		calls, _ = strconv.Atoi(v)
	}
	c := newCLI(t)
	const scope = "sp/ag/many"
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan string, calls)
	next := make(chan int)
	for range 4 {
		wg.Go(func() {
			for i := range next {
				name, input := "workspace_write", fmt.Sprintf(`{"path":"f%d","content":"x"}`, i)
				if i%2 == 1 {
					name, input = "workspace_stat", `{"path":"."}`
				}
				r := c.run("", "tool", name, "--scope", scope, "--input", input)
				if r.code != 0 {
					errs <- fmt.Sprintf("%s %d: exit %d %s %s", name, i, r.code, r.stdout, r.stderr)
				}
			}
		})
	}
	for i := range calls {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	t.Logf("%d loomfs tool processes in %v", calls, time.Since(start).Round(time.Millisecond))

	files, _ := os.ReadDir(filepath.Join(c.root, ".agentloom-audit"))
	var names []string
	for _, f := range files {
		names = append(names, f.Name())
	}
	if len(files) >= 10 {
		t.Errorf("%d tool calls left %d audit files, want fewer than 10: %v", calls, len(files), names)
	}
	// A write is two records (started, outcome), a stat one.
	want := calls/2*2 + (calls - calls/2)
	if recs := c.auditRecords(scope); len(recs) != want {
		t.Errorf("%d records, want %d", len(recs), want)
	}
	v := c.run("", "--json", "audit", "verify")
	var rep struct {
		OK    bool `json:"ok"`
		Nodes []struct {
			Writers, Closed int
		} `json:"nodes"`
	}
	if err := json.Unmarshal(v.stdout, &rep); err != nil || v.code != 0 || !rep.OK || len(rep.Nodes) != 1 || rep.Nodes[0].Writers != calls || rep.Nodes[0].Closed != calls {
		t.Fatalf("audit verify: exit %d %.2000s %s", v.code, v.stdout, v.stderr)
	}
	t.Logf("audit files: %v", names)
}

// TestAuditMountKilled: a loomfs mount killed with SIGKILL is a writer that
// ended without closing: verify names it and exits 1, and 0 with
// --allow-crashed; the writers after it go on in the same chain.
func TestAuditMountKilled(t *testing.T) {
	c := newCLI(t)
	const scope = "sp/ag/killed"
	c.tool(scope, "workspace_write", `{"path":"a","content":"a"}`)
	base := t.TempDir()
	os.Chmod(base, 0o700)
	mnt := filepath.Join(base, "mnt")
	os.Mkdir(mnt, 0o755)
	mount, out := c.start("mount", "--scope", scope, mnt)
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	waitFor(t, "the mount", func() bool { return strings.Contains(out.String(), "mounted ") })
	if err := os.WriteFile(filepath.Join(mnt, "through-mount"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The mount's records are queued and written moments later (a mount
	// killed at once may lose them: the documented window, AUDIT.md). The
	// kill comes once they are written: what is tested is that written
	// records survive the kill and the chain goes on after it.
	fromMount := func() bool {
		return find(c.auditRecords(scope), func(r record) bool { return r.Source == "fuse" && r.Path == "through-mount" }) != nil
	}
	waitFor(t, "the mount's records of the write", fromMount)
	if v := c.run("", "audit", "verify"); v.code != 0 || !strings.Contains(string(v.stdout), "1 running") {
		t.Fatalf("verify while the mount runs: exit %d %s %s", v.code, v.stdout, v.stderr)
	}
	mount.Process.Signal(syscall.SIGKILL)
	mount.Wait()
	unix.Unmount(mnt, unix.MNT_DETACH)
	c.tool(scope, "workspace_write", `{"path":"b","content":"b"}`)

	v := c.run("", "audit", "verify")
	if v.code != 1 || !strings.Contains(string(v.stdout), "writer ended without closing") || strings.Contains(string(v.stdout), "BROKEN") {
		t.Fatalf("verify after SIGKILL: exit %d %s %s", v.code, v.stdout, v.stderr)
	}
	t.Logf("verify: %s", v.stdout)
	if v := c.run("", "audit", "verify", "--allow-crashed"); v.code != 0 {
		t.Fatalf("verify --allow-crashed: exit %d %s %s", v.code, v.stdout, v.stderr)
	}
	if !fromMount() {
		t.Error("the killed mount's written records are gone")
	}
}

// TestNodesAuditAcrossClients: through the shared volume's two clients, a
// writer running on node A is seen running from node B (its lock on its
// byte of the ledger), an anchor taken on A is still extended when B
// verifies after more writes, and a writer killed on A is seen from B as
// ended without closing.
func TestNodesAuditAcrossClients(t *testing.T) {
	_, a, b := sharedVolume(t)
	const scope = "acme/coder/s1"
	a.mustTool(scope, "workspace_write", `{"path":"one","content":"1"}`)
	mnt, err := os.MkdirTemp(a.dir, "mnt-")
	if err != nil {
		t.Fatal(err)
	}
	mount := a.command("mount", "--scope", scope, mnt)
	out := &syncBuffer{}
	mount.Stdout, mount.Stderr = out, out
	if err := mount.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		mount.Process.Kill()
		mount.Wait()
		unix.Unmount(mnt, unix.MNT_DETACH)
	})
	waitFor(t, "the mount on node A", func() bool { return strings.Contains(out.String(), "mounted ") })
	if r := b.run("audit", "verify"); r.code != 0 || !strings.Contains(string(r.stdout), "1 running") {
		t.Fatalf("verify on B while A's mount runs: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	anchors := filepath.Join(t.TempDir(), "anchors.jsonl")
	if r := a.run("audit", "anchor", "--to", anchors); r.code != 0 {
		t.Fatalf("anchor on A: exit %d %s", r.code, r.stderr)
	}
	b.mustTool(scope, "workspace_write", `{"path":"two","content":"2"}`)
	if r := b.run("audit", "verify", "--anchor", anchors); r.code != 0 || !strings.Contains(string(r.stdout), "anchored: the log extends") {
		t.Fatalf("verify --anchor on B: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	mount.Process.Signal(syscall.SIGKILL)
	mount.Wait()
	unix.Unmount(mnt, unix.MNT_DETACH)
	r := b.run("audit", "verify")
	if r.code != 1 || !strings.Contains(string(r.stdout), "writer ended without closing") {
		t.Fatalf("verify on B after A's mount was killed: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	if r := b.run("audit", "verify", "--allow-crashed", "--anchor", anchors); r.code != 0 {
		t.Fatalf("verify --allow-crashed on B: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
}
