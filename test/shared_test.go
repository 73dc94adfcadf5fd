package test

// More of the two-node trial (DEPLOY.md §6) on the volume sharedVolume
// gives: with LOOMFS_DFS_ROOTS, two clients of a real distributed
// filesystem.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// TestNodesProbe: check --probe passes on a fresh volume from both nodes,
// names the filesystem as the mount table does, and passes through both
// nodes at once with --peer.
func TestNodesProbe(t *testing.T) {
	_, a, b := sharedVolume(t)
	var types []string
	for _, n := range []*node{a, b} {
		r := n.run("--json", "check", "--probe")
		var rep store.CheckReport
		if err := json.Unmarshal(r.stdout, &rep); err != nil || r.code != 0 || !rep.OK || !rep.AdvisoryLockLocal {
			t.Fatalf("check --probe on %s: exit %d, %s %s", n.root, r.code, r.stdout, r.stderr)
		}
		if rep.Filesystem == "" || rep.Filesystem == "fuse" {
			t.Errorf("check on %s names the filesystem %q; the mount table names it exactly", n.root, rep.Filesystem)
		}
		types = append(types, rep.Filesystem)
	}
	t.Logf("filesystem: %v", types)

	// Through both clients at once: replaces seen at once, locks
	// excluding, locked increments lost none.
	r := a.run("--json", "check", "--probe", "--peer", b.root)
	var rep store.CheckReport
	if err := json.Unmarshal(r.stdout, &rep); err != nil || r.code != 0 || !rep.OK {
		t.Fatalf("check --probe --peer: exit %d, %s %s", r.code, r.stdout, r.stderr)
	}
	for _, c := range rep.Checks {
		if c.Name == "probe_peer" {
			t.Logf("probe_peer: %s", c.Detail)
			return
		}
	}
	t.Errorf("check --probe --peer made no probe_peer check: %s", r.stdout)
}

// TestNodesReplay: a call made with --call-id on node B is replayed, not
// run again, on either node.
func TestNodesReplay(t *testing.T) {
	_, a, b := sharedVolume(t)
	const scope = "acme/coder/s1"
	in := `{"path":"r","content":"once"}`
	first := b.run("tool", "workspace_write", "--scope", scope, "--input", in, "--call-id", "c-1")
	if first.code != 0 {
		t.Fatalf("write with a call id on node B: exit %d %s %s", first.code, first.stdout, first.stderr)
	}
	a.mustTool(scope, "workspace_write", `{"path":"r","content":"changed"}`)
	for _, n := range []*node{b, a} {
		again := n.run("tool", "workspace_write", "--scope", scope, "--input", in, "--call-id", "c-1")
		if again.code != 0 || !bytes.Equal(first.stdout, again.stdout) {
			t.Errorf("replay on %s: exit %d, %s; want %s", n.root, again.code, again.stdout, first.stdout)
		}
	}
	if m := b.mustTool(scope, "workspace_read", `{"path":"r"}`); m["content"] != "changed" {
		t.Errorf("a replay wrote again: %v", m["content"])
	}
}

// TestNodesMCPSession: a whole MCP session over stdio against node B
// (every request is a recorded call); node A sees what it wrote.
func TestNodesMCPSession(t *testing.T) {
	_, a, b := sharedVolume(t)
	const scope = "acme/coder/s1"
	client := mcp.NewClient(&mcp.Implementation{Name: "loomfs-test", Version: "1"}, nil)
	ctx := context.Background()
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: b.command("mcp", "--scope", scope)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	call := func(name string, args map[string]any) string {
		t.Helper()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var txt strings.Builder
		for _, c := range res.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				txt.WriteString(tc.Text)
			}
		}
		if res.IsError {
			t.Fatalf("%s over MCP on node B: %s", name, txt.String())
		}
		return txt.String()
	}
	call("workspace_mkdir", map[string]any{"path": "notes"})
	call("workspace_write", map[string]any{"path": "notes/a.txt", "content": "one\n"})
	call("workspace_edit", map[string]any{"path": "notes/a.txt", "old_text": "one", "new_text": "two"})
	if got := call("workspace_read", map[string]any{"path": "notes/a.txt"}); !strings.Contains(got, "two") {
		t.Errorf("read over MCP: %q", got)
	}
	if got := call("workspace_list", map[string]any{"path": "notes"}); !strings.Contains(got, "a.txt") {
		t.Errorf("list over MCP: %q", got)
	}
	if m := a.mustTool(scope, "workspace_read", `{"path":"notes/a.txt"}`); m["content"] != "two\n" {
		t.Errorf("node A reads %q", m["content"])
	}
}

// TestNodesConfirmationToken: a token given on node A is redeemed on node
// B, once.
func TestNodesConfirmationToken(t *testing.T) {
	_, a, b := sharedVolume(t)
	const scope = "acme/coder/s1"
	pol := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(pol, []byte("preset: standard\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tool := func(n *node, name, input string) (map[string]any, int) {
		t.Helper()
		r := n.run("--policy", pol, "tool", name, "--scope", scope, "--input", input)
		var m map[string]any
		if err := json.Unmarshal(r.stdout, &m); err != nil {
			t.Fatalf("%s on %s: exit %d, %q %s", name, n.root, r.code, r.stdout, r.stderr)
		}
		return m, r.code
	}
	tool(a, "workspace_mkdir", `{"path":"output"}`)
	if m, code := tool(a, "workspace_write", `{"path":"output/r.csv","content":"v1"}`); code != 0 {
		t.Fatalf("create output/r.csv: %v", m)
	}
	const overwrite = `{"path":"output/r.csv","content":"v2"}`
	m, _ := tool(a, "workspace_write", overwrite)
	e, _ := m["error"].(map[string]any)
	token, _ := e["confirm_token"].(string)
	if errCode(m) != "confirmation_required" || !strings.HasPrefix(token, "ct_") {
		t.Fatalf("overwrite on node A: %v; want confirmation_required with a token", m)
	}
	with := `{"path":"output/r.csv","content":"v2","confirm_token":"` + token + `"}`
	if m, code := tool(b, "workspace_write", with); code != 0 {
		t.Fatalf("the confirmed overwrite on node B: %v", m)
	}
	if m, _ := tool(a, "workspace_write", with); errCode(m) != "confirmation_required" {
		t.Errorf("the token again on node A: %v; a token works once", m)
	}
	// output/ is write-only under the standard policy: read it without.
	if m := a.mustTool(scope, "workspace_read", `{"path":"output/r.csv"}`); m["content"] != "v2" {
		t.Errorf("node A reads %v", m["content"])
	}
}

// TestNodesQuarantine: a scope quarantined through node A's path refuses
// changes on node B at once, and node B lists it.
func TestNodesQuarantine(t *testing.T) {
	_, a, b := sharedVolume(t)
	const scope = "acme/coder/s1"
	b.mustTool(scope, "workspace_write", `{"path":"f","content":"before"}`)
	ctx := context.Background()
	vol, err := store.OpenVolume(ctx, store.Config{Backend: store.BackendSharedPOSIX, Root: a.root, VolumeID: a.volumeID})
	if err != nil {
		t.Fatal(err)
	}
	defer vol.Close()
	sc, _ := store.ParseScope(scope)
	ws, err := vol.Open(ctx, sc, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	if err := ws.Quarantine(store.Marker{Node: "node-a"}, "a command on node A was lost"); err != nil {
		t.Fatal(err)
	}
	if m, code, err := b.tool(scope, "workspace_write", `{"path":"f","content":"after"}`); err != nil || code != 1 || errCode(m) != "quarantined" {
		t.Errorf("write on node B: exit %d, %v %v; want quarantined", code, m, err)
	}
	if m := b.mustTool(scope, "workspace_read", `{"path":"f"}`); m["content"] != "before" {
		t.Errorf("node B reads %v", m["content"])
	}
	if r := b.run("quarantine", "list"); r.code != 0 || !strings.Contains(string(r.stdout), scope) {
		t.Errorf("quarantine list on node B: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
}

// TestNodesAudit: the audit log holds the records of both nodes, and
// verifies from either.
func TestNodesAudit(t *testing.T) {
	_, a, b := sharedVolume(t)
	const scope = "acme/coder/s1"
	a.mustTool(scope, "workspace_write", `{"path":"from-a","content":"a"}`)
	b.mustTool(scope, "workspace_write", `{"path":"from-b","content":"b"}`)
	a.mustTool(scope, "workspace_write", `{"path":"from-a","content":"a2"}`)
	for _, n := range []*node{a, b} {
		if r := n.run("audit", "verify"); r.code != 0 {
			t.Errorf("audit verify on %s: exit %d %s %s", n.root, r.code, r.stdout, r.stderr)
		}
		r := n.run("--json", "audit", "query", "--scope", scope)
		if r.code != 0 {
			t.Fatalf("audit query on %s: exit %d %s", n.root, r.code, r.stderr)
		}
		writes := map[string]int{}
		for _, line := range bytes.Split(bytes.TrimSpace(r.stdout), []byte("\n")) {
			var rec record
			if err := json.Unmarshal(line, &rec); err != nil {
				t.Fatalf("audit query line %q: %v", line, err)
			}
			if rec.Op == "workspace_write" && rec.Result == "ok" {
				writes[rec.Path]++
			}
		}
		if writes["from-a"] != 2 || writes["from-b"] != 1 {
			t.Errorf("node %s's query finds writes %v; want from-a twice and from-b once", n.root, writes)
		}
	}
}

// TestNodesMountFlock: a flock taken in a loomfs mount on node A excludes
// one in a loomfs mount of the same scope on node B, until released.
func TestNodesMountFlock(t *testing.T) {
	_, a, b := sharedVolume(t)
	const scope = "acme/coder/s1"
	a.mustTool(scope, "workspace_write", `{"path":"lockme","content":"x"}`)
	open := func(n *node) *os.File {
		t.Helper()
		f, err := os.OpenFile(filepath.Join(n.mount(scope), "lockme"), os.O_RDWR, 0)
		if err != nil {
			t.Fatalf("open through the mount on %s: %v", n.root, err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	fa, fb := open(a), open(b)
	if err := unix.Flock(int(fa.Fd()), unix.LOCK_EX); err != nil {
		t.Fatalf("flock on node A: %v", err)
	}
	if err := unix.Flock(int(fb.Fd()), unix.LOCK_EX|unix.LOCK_NB); !errors.Is(err, unix.EWOULDBLOCK) {
		t.Fatalf("flock on node B while node A holds it: %v; want EWOULDBLOCK", err)
	}
	got := make(chan error, 1)
	go func() { got <- unix.Flock(int(fb.Fd()), unix.LOCK_EX) }()
	select {
	case err := <-got:
		t.Fatalf("node B got the lock while node A held it: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	if err := unix.Flock(int(fa.Fd()), unix.LOCK_UN); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("flock on node B after the release: %v", err)
		}
		t.Logf("node B got the lock %v after node A released it", time.Since(released).Round(time.Millisecond))
	case <-time.After(20 * time.Second):
		t.Fatal("node B did not get the lock after node A released it")
	}
	unix.Flock(int(fb.Fd()), unix.LOCK_UN)
}

// mount serves scope with `loomfs mount` from node n until the test ends,
// and returns the mount point.
func (n *node) mount(scope string) string {
	n.t.Helper()
	_, mnt, _ := n.startMount(scope)
	return mnt
}

// startMount runs `loomfs mount` of scope with args on node n, stopped
// with stopMount at the end of the test if it still runs, and returns it
// once mounted, with its mount point and output.
func (n *node) startMount(scope string, args ...string) (*exec.Cmd, string, *syncBuffer) {
	t := n.t
	t.Helper()
	mnt, err := os.MkdirTemp(n.dir, "mnt-")
	if err != nil {
		t.Fatal(err)
	}
	cmd := n.command(append(append([]string{"mount", "--scope", scope}, args...), mnt)...)
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			stopMount(t, cmd, mnt)
		}
	})
	waitFor(t, "the mount on "+n.root, func() bool { return strings.Contains(out.String(), "mounted ") })
	return cmd, mnt, out
}

// stopMount ends a loomfs mount the way an operator does (SIGTERM) and
// returns when it exited. A mount exits within its --stop-timeout (5 s)
// and what the kernel then still waits for: a request already in the
// shared filesystem's client (on CephFS up to a few seconds). One still
// there after 15 s fails the test with where its threads wait (their
// kernel stacks, and its goroutines through SIGQUIT) and is killed, its
// mount point detached.
func stopMount(t *testing.T, cmd *exec.Cmd, mnt string) {
	start := time.Now()
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
		took := time.Since(start)
		t.Logf("loomfs mount at %s stopped %v after SIGTERM", mnt, took.Round(time.Millisecond))
		if took > time.Second {
			t.Logf("its output:\n%s", cmd.Stdout)
		}
	case <-time.After(15 * time.Second):
		t.Errorf("loomfs mount at %s did not stop on SIGTERM:\n%s", mnt, kernelStacks(cmd.Process.Pid))
		// Its goroutines, into its output.
		cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
		}
		unix.Unmount(mnt, unix.MNT_DETACH)
		cmd.Process.Kill()
		<-done
		t.Logf("its output:\n%s", cmd.Stdout)
	}
}

// kernelStacks describes where each thread of process pid is: its state
// and its kernel stack (readable by root only).
func kernelStacks(pid int) string {
	var b strings.Builder
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
	for _, task := range tasks {
		status, _ := os.ReadFile(filepath.Join(task, "status"))
		state := ""
		for _, l := range strings.Split(string(status), "\n") {
			if strings.HasPrefix(l, "State:") {
				state = l
			}
		}
		stack, _ := os.ReadFile(filepath.Join(task, "stack"))
		fmt.Fprintf(&b, "thread %s %s\n%s", filepath.Base(task), state, stack)
	}
	return b.String()
}

// TestNodesMounts: a file written through a loomfs mount on node A is read
// through one on node B, and a change on B is seen on A.
func TestNodesMounts(t *testing.T) {
	_, a, b := sharedVolume(t)
	const scope = "acme/coder/s1"
	ma, mb := a.mount(scope), b.mount(scope)
	if err := os.WriteFile(filepath.Join(ma, "via-a.txt"), []byte("through A's mount"), 0o600); err != nil {
		t.Fatal(err)
	}
	read := time.Now()
	if got, err := os.ReadFile(filepath.Join(mb, "via-a.txt")); err != nil || string(got) != "through A's mount" {
		t.Fatalf("read through B's mount: %q %v", got, err)
	}
	t.Logf("read through B's mount of what A's mount wrote: %v", time.Since(read).Round(time.Millisecond))
	if err := os.WriteFile(filepath.Join(mb, "via-a.txt"), []byte("changed on B"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(ma, "via-a.txt")); err != nil || string(got) != "changed on B" {
		t.Errorf("read through A's mount after B's change: %q %v", got, err)
	}
}

// TestNodesSnapshot: a snapshot taken on node B after changes on node A
// holds them, and restoring it on B undoes A's later changes, as A sees.
func TestNodesSnapshot(t *testing.T) {
	_, a, b := sharedVolume(t)
	const scope = "acme/coder/s1"
	a.mustTool(scope, "workspace_write", `{"path":"f1","content":"one"}`)
	a.mustTool(scope, "workspace_write", `{"path":"f2","content":"two"}`)
	r := b.run("--json", "snapshot", "create", "--scope", scope)
	var snap struct {
		ID    string `json:"id"`
		Files int    `json:"files"`
	}
	if err := json.Unmarshal(r.stdout, &snap); err != nil || r.code != 0 || snap.Files != 2 {
		t.Fatalf("snapshot on node B: exit %d, %s %s; want 2 files", r.code, r.stdout, r.stderr)
	}
	a.mustTool(scope, "workspace_write", `{"path":"f1","content":"changed"}`)
	a.mustTool(scope, "workspace_delete", `{"path":"f2"}`)
	a.mustTool(scope, "workspace_write", `{"path":"f3","content":"new"}`)
	if r := b.run("snapshot", "restore", "--scope", scope, snap.ID); r.code != 0 {
		t.Fatalf("restore on node B: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	for path, want := range map[string]string{"f1": "one", "f2": "two"} {
		if m := a.mustTool(scope, "workspace_read", `{"path":"`+path+`"}`); m["content"] != want {
			t.Errorf("node A reads %s: %v, want %q", path, m["content"], want)
		}
	}
	if m, _, _ := a.tool(scope, "workspace_stat", `{"path":"f3"}`); errCode(m) != "not_found" {
		t.Errorf("f3 after the restore: %v", m)
	}
}

// TestNodesCASInProcess: 2 × 200 compare-and-swap increments of one
// counter by two in-process clients, one on each node's path, lose none.
func TestNodesCASInProcess(t *testing.T) {
	_, a, b := sharedVolume(t)
	const each = 200
	ctx := context.Background()
	sc := store.Scope{Space: "acme", Agent: "coder", Session: "s1"}
	open := func(n *node) *store.Workspace {
		vol, err := store.OpenVolume(ctx, store.Config{Backend: store.BackendSharedPOSIX, Root: n.root, VolumeID: n.volumeID})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { vol.Close() })
		ws, err := vol.Open(ctx, sc, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ws.Close() })
		return ws
	}
	wa, wb := open(a), open(b)
	if _, err := wa.WriteFile(ctx, "counter", []byte("0"), nil); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	errs := make(chan error, 2)
	for _, ws := range []*store.Workspace{wa, wb} {
		go func() {
			errs <- func() error {
				for done := 0; done < each; {
					// As the tools do: read unlocked, write under the scope
					// lock if the content is still what was read.
					data, sha, err := ws.ReadFile(ctx, "counter")
					if err != nil {
						return err
					}
					v, _ := strconv.Atoi(string(data))
					unlock, err := ws.Lock(ctx)
					if err != nil {
						return err
					}
					_, err = ws.WriteFile(ctx, "counter", []byte(strconv.Itoa(v+1)), &sha)
					unlock()
					switch {
					case err == nil:
						done++
					case policy.CodeOf(err) == policy.Conflict:
						time.Sleep(time.Duration(rand.IntN(5)) * time.Millisecond)
					default:
						return err
					}
				}
				return nil
			}()
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	elapsed := time.Since(start)
	data, _, err := wb.ReadFile(ctx, "counter")
	if err != nil || string(data) != strconv.Itoa(2*each) {
		t.Fatalf("counter %q %v, want %d: updates were lost", data, err, 2*each)
	}
	t.Logf("%d increments in %v: %.0f/s", 2*each, elapsed, float64(2*each)/elapsed.Seconds())
}

// TestNodesCacheFollowsJournals: each mount keeps what the kernel learned
// for minutes, so a change on node B reaches node A's mount only through
// the change journals: a file A has stat'ed, listed and read (entry,
// attributes, listing and pages cached), changed in place on B without a
// change of size, and a name A looked up in vain, created on B. It logs
// how long A took to see each: the cross-node bound is the follower's poll
// interval plus the filesystem's own delay.
func TestNodesCacheFollowsJournals(t *testing.T) {
	_, a, b := sharedVolume(t)
	const scope = "acme/coder/s1"
	ma, mb := a.mount(scope), b.mount(scope)
	if err := os.WriteFile(filepath.Join(mb, "f"), []byte("aaaa"), 0o600); err != nil {
		t.Fatal(err)
	}
	see := func(what string, check func() error) {
		t.Helper()
		start := time.Now()
		for {
			err := check()
			if err == nil {
				t.Logf("%s: seen on node A after %v", what, time.Since(start).Round(time.Millisecond))
				return
			}
			if time.Since(start) > 30*time.Second {
				t.Fatalf("%s: not seen on node A after 30 s: %v", what, err)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	content := func(want string) func() error {
		return func() error {
			b, err := os.ReadFile(filepath.Join(ma, "f"))
			if err == nil && string(b) != want {
				err = fmt.Errorf("reads %q, want %q", b, want)
			}
			return err
		}
	}
	see("a file written on B", content("aaaa"))
	if _, err := os.Stat(filepath.Join(ma, "later")); !os.IsNotExist(err) {
		t.Fatalf("stat of a missing name: %v", err)
	}
	f, err := os.OpenFile(filepath.Join(mb, "f"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("bb"), 1); err != nil {
		t.Fatal(err)
	}
	f.Close()
	see("a change in place on B, same size", content("abba"))
	if err := os.WriteFile(filepath.Join(mb, "later"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	see("a name created on B after A found it missing", func() error {
		_, err := os.Stat(filepath.Join(ma, "later"))
		return err
	})
	if err := os.Chmod(filepath.Join(mb, "f"), 0o700); err != nil {
		t.Fatal(err)
	}
	see("a chmod on B", func() error {
		fi, err := os.Stat(filepath.Join(ma, "f"))
		if err == nil && fi.Mode().Perm() != 0o700 {
			err = fmt.Errorf("mode %v", fi.Mode().Perm())
		}
		return err
	})
}
