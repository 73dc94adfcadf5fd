package test

// Several "nodes" on one shared volume. A node here is a loomfs process
// that sees the volume at its own path, with its own --root (and --data and
// working directory). With LOOMFS_DFS_ROOTS=A,B the two paths are two
// clients of a real distributed filesystem (scripts/cephfs: CephFS through
// two ceph-fuse mounts, each with its own caches and its own session with
// the metadata server), so locks, caches and renames go over the network
// protocol as between real nodes. Without it the volume is a local
// directory bind-mounted at two places: the nodes contend for the same
// locks through the same kernel, which shows that loomfs derives every name
// from logical ids and never from a host path, and nothing more.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentloom/loomfs/callrec"
	"github.com/agentloom/loomfs/nodeid"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/store"
)

const nodeVolume = "team-volume-v1"

// A lock holder runs in a re-executed test binary. TestMain belongs to
// cli_test.go, so the role is picked up here, before it runs.
const holdEnv = "LOOMFS_NODE_TEST_HOLD" // root path, volume id, scope, tab-separated

func init() {
	if v := os.Getenv(holdEnv); v != "" {
		if err := holdSharedLock(strings.Split(v, "\t")); err != nil {
			fmt.Fprintln(os.Stderr, "lock holder:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}

// holdSharedLock opens the shared volume at one node's path, takes the
// scope lock as a running command does or, given a fourth argument, the
// OFD lock of that file of the scope's state directory (the quota
// ledger's, the call record's), says "locked", holds it until its stdin is
// closed, releases it and says "released".
func holdSharedLock(args []string) error {
	if len(args) != 3 && len(args) != 4 {
		return fmt.Errorf("want root, volume id, scope and maybe a state file; got %q", args)
	}
	ctx := context.Background()
	vol, err := store.OpenVolume(ctx, store.Config{Backend: store.BackendSharedPOSIX, Root: args[0], VolumeID: args[1]})
	if err != nil {
		return err
	}
	sc, err := store.ParseScope(args[2])
	if err != nil {
		return err
	}
	ws, err := vol.Open(ctx, sc, nil)
	if err != nil {
		return err
	}
	var unlock func()
	if len(args) == 4 {
		unlock, err = lockStateFile(filepath.Join(args[0], store.LocksDir, sc.Hash(), args[3]))
	} else {
		unlock, err = ws.Lock(ctx)
	}
	if err != nil {
		return err
	}
	fmt.Println("locked")
	io.Copy(io.Discard, os.Stdin)
	unlock()
	fmt.Println("released")
	return nil
}

// lockStateFile takes the OFD write lock of the file at path.
func lockStateFile(path string) (unlock func(), err error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLK, &unix.Flock_t{Type: unix.F_WRLCK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() { unix.Close(fd) }, nil
}

// lockHolder runs holdSharedLock with args in a process of its own and
// returns once it holds the lock.
func lockHolder(t *testing.T, args ...string) *holder {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), holdEnv+"="+strings.Join(args, "\t"))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	h := &holder{t: t, stdin: stdin, lines: make(chan string, 4)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			h.lines <- sc.Text()
		}
		close(h.lines)
	}()
	h.expect("locked")
	return h
}

// holder is a lockHolder's process.
type holder struct {
	t     *testing.T
	stdin io.Closer
	once  sync.Once
	lines chan string
}

// letGo tells the holder to let its lock go, without waiting; it may be
// called from any goroutine, more than once.
func (h *holder) letGo() { h.once.Do(func() { h.stdin.Close() }) }

// release lets the lock go and returns when the holder says it did.
func (h *holder) release() time.Time {
	h.t.Helper()
	h.letGo()
	return h.expect("released")
}

func (h *holder) expect(want string) time.Time {
	h.t.Helper()
	select {
	case l := <-h.lines:
		if l != want {
			h.t.Fatalf("holder said %q, want %q", l, want)
		}
	case <-time.After(10 * time.Second):
		h.t.Fatalf("holder did not say %q", want)
	}
	return time.Now()
}

// node is one loomfs "node": its own mount path of the volume, its own
// data and working directory.
type node struct {
	t        *testing.T
	root     string
	volumeID string
	dir      string
	// name is the node's name ($AGENT_LOOM_NODE) for the processes run
	// on it; "" leaves it to the hostname. The two nodes of
	// sharedVolume have their own, as real nodes would: each has its
	// own audit chain and ledger, and owns its processes.
	name string
}

// dfsRootsEnv names two mount paths of one real distributed filesystem,
// "A,B": two clients standing in for two nodes (scripts/cephfs mounts
// CephFS so). Without it the nodes share a bind-mounted local directory.
const dfsRootsEnv = "LOOMFS_DFS_ROOTS"

// dfsRoots returns the two mount paths of $LOOMFS_DFS_ROOTS, or ok false.
func dfsRoots(t *testing.T) (a, b string, ok bool) {
	v := os.Getenv(dfsRootsEnv)
	if v == "" {
		return "", "", false
	}
	a, b, ok = strings.Cut(v, ",")
	if !ok || a == "" || b == "" || strings.Contains(b, ",") {
		t.Fatalf("%s=%q: want two mount paths, A,B", dfsRootsEnv, v)
	}
	return a, b, true
}

// sharedVolume makes an administrator's volume (root and marker) seen by
// two nodes at two paths: a fresh directory of the distributed filesystem
// of $LOOMFS_DFS_ROOTS through its two clients, or else a local directory
// bind-mounted twice. src is the volume as node A's client sees it; the
// volume and the mounts go at cleanup.
func sharedVolume(t *testing.T) (src string, a, b *node) {
	t.Helper()
	base := t.TempDir()
	mk := func(name, root string) *node {
		dir := filepath.Join(base, name, "work")
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		return &node{t: t, root: root, volumeID: nodeVolume, dir: dir, name: name}
	}
	marker := func(root string) {
		if err := os.MkdirAll(root, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, store.VolumeMarker), []byte(nodeVolume+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if ra, rb, ok := dfsRoots(t); ok {
		name := strings.ReplaceAll(t.Name(), "/", "-") + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
		src = filepath.Join(ra, name)
		marker(src)
		// Removed through node B: on CephFS a client's first look at files
		// another client just made can wait seconds each in the MDS, and
		// most tests end on B.
		t.Cleanup(func() { os.RemoveAll(filepath.Join(rb, name)) })
		// Two clients of one filesystem: two mounts, one volume.
		var sa, sb unix.Stat_t
		if err := unix.Stat(src, &sa); err != nil {
			t.Fatal(err)
		}
		if err := unix.Stat(filepath.Join(rb, name, store.VolumeMarker), &sb); err != nil {
			t.Fatalf("%s: node B does not see the volume made through node A: %v", dfsRootsEnv, err)
		}
		if sa.Dev == sb.Dev {
			t.Fatalf("%s: %s and %s are one mount, not two clients", dfsRootsEnv, ra, rb)
		}
		return src, mk("node-a", src), mk("node-b", filepath.Join(rb, name))
	}
	if os.Geteuid() != 0 {
		t.Skip("bind mounts need root")
	}
	src = filepath.Join(base, "export")
	marker(src)
	bind := func(name string) *node {
		mnt := filepath.Join(base, name, "mnt", "loom")
		if err := os.MkdirAll(mnt, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount(src, mnt, "", unix.MS_BIND, ""); err != nil {
			t.Fatalf("bind-mount the volume at %s: %v", mnt, err)
		}
		t.Cleanup(func() {
			if err := unix.Unmount(mnt, 0); err != nil {
				unix.Unmount(mnt, unix.MNT_DETACH)
			}
		})
		return mk(name, mnt)
	}
	return src, bind("node-a"), bind("node-b")
}

func (n *node) command(args ...string) *exec.Cmd {
	cmd := exec.Command(loomfsBin, append([]string{"--backend", "shared_posix", "--root", n.root, "--volume-id", n.volumeID,
		"--data", filepath.Join(n.dir, "data")}, args...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	if n.name != "" {
		cmd.Env = append(cmd.Env, nodeid.Env+"="+n.name)
	}
	cmd.Dir = n.dir
	return cmd
}

func (n *node) run(args ...string) result {
	n.t.Helper()
	return runCmd(n.t, n.command(args...))
}

// tool runs one tool; m is its JSON output, result or error.
func (n *node) tool(scope, name, input string) (m map[string]any, code int, err error) {
	r := n.run("tool", name, "--scope", scope, "--input", input)
	if err := json.Unmarshal(r.stdout, &m); err != nil {
		return nil, r.code, fmt.Errorf("loomfs tool %s: exit %d, stdout %q is not JSON (stderr %s)", name, r.code, r.stdout, r.stderr)
	}
	return m, r.code, nil
}

func (n *node) mustTool(scope, name, input string) map[string]any {
	n.t.Helper()
	m, code, err := n.tool(scope, name, input)
	if err != nil || code != 0 {
		n.t.Fatalf("%s on %s: exit %d, %v %v", name, n.root, code, m, err)
	}
	return m
}

func (n *node) runsShow(run string) map[string]any {
	n.t.Helper()
	r := n.run("runs", "show", "--run", run)
	var m map[string]any
	if r.code != 0 || json.Unmarshal(r.stdout, &m) != nil {
		n.t.Fatalf("runs show %s on %s: exit %d %s %s", run, n.root, r.code, r.stdout, r.stderr)
	}
	return m
}

// TestNodesShareOneVolume: two nodes mounting the volume at different
// paths compute the same scope hash, contend on the same lock directory,
// and see each other's writes, bindings and artifacts.
func TestNodesShareOneVolume(t *testing.T) {
	src, a, b := sharedVolume(t)
	if r := a.run("runs", "create", "--scope", "acme/coder/s1", "--run", "r-1", "--user", "alice"); r.code != 0 {
		t.Fatalf("runs create on node A: %d %s %s", r.code, r.stdout, r.stderr)
	}
	onA, onB := a.runsShow("r-1"), b.runsShow("r-1")
	want := store.Scope{Space: "acme", Agent: "coder", Session: "s1"}.Hash()
	if onA["main_scope_hash"] != want || onB["main_scope_hash"] != want {
		t.Errorf("scope hash on node A %v, on node B %v; want %s on both", onA["main_scope_hash"], onB["main_scope_hash"], want)
	}
	if fmt.Sprint(onA["binding"]) != fmt.Sprint(onB["binding"]) {
		t.Errorf("node B resolves the run to %v, node A to %v", onB["binding"], onA["binding"])
	}

	a.mustTool("acme/coder/s1", "workspace_write", `{"path":"from-a.txt","content":"written on node A"}`)
	if m := b.mustTool("acme/coder/s1", "workspace_read", `{"path":"from-a.txt"}`); m["content"] != "written on node A" {
		t.Errorf("node B reads %v", m["content"])
	}
	b.mustTool("acme/coder/s1/r-1/sub-1", "workspace_write", `{"path":"child.txt","content":"written on node B"}`)
	b.mustTool("acme/coder/s1", "workspace_write", `{"path":"from-b.txt","content":"written on node B"}`)

	// One lock directory per scope whichever node wrote: the main scope and
	// the child, not one per mount path.
	locks, err := os.ReadDir(filepath.Join(src, store.LocksDir))
	if err != nil {
		t.Fatal(err)
	}
	child := store.Scope{Space: "acme", Agent: "coder", Session: "s1", Run: "r-1", Instance: "sub-1"}.Hash()
	var names []string
	for _, e := range locks {
		names = append(names, e.Name())
	}
	if strings.Join(names, " ") != strings.Join(sorted(want, child), " ") {
		t.Errorf("lock directories %v; want exactly %s and %s", names, want, child)
	}

	r := a.run("--json", "artifacts", "list", "--run", "r-1", "--user", "alice")
	var l store.ArtifactList
	if r.code != 0 || json.Unmarshal(r.stdout, &l) != nil {
		t.Fatalf("artifacts list on node A: %d %s %s", r.code, r.stdout, r.stderr)
	}
	var paths []string
	for _, art := range l.Artifacts {
		paths = append(paths, art.Path)
	}
	if got := strings.Join(paths, " "); got != "from-a.txt from-b.txt subagents/sub-1/child.txt" {
		t.Errorf("node A lists %s", got)
	}
	if r := a.run("artifacts", "get", "--run", "r-1", "--user", "alice", "subagents/sub-1/child.txt"); r.code != 0 || string(r.stdout) != "written on node B" {
		t.Errorf("node A downloads %q (exit %d, %s)", r.stdout, r.code, r.stderr)
	}
	if r := b.run("artifacts", "get", "--run", "r-1", "--user", "mallory", "from-a.txt"); r.code != 1 || !strings.Contains(r.stderr, "permission_denied") || len(r.stdout) != 0 {
		t.Errorf("another user: exit %d, stdout %q, stderr %s", r.code, r.stdout, r.stderr)
	}
}

func sorted(a, b string) []string {
	if a > b {
		return []string{b, a}
	}
	return []string{a, b}
}

// TestNodesCASCounter: 2 × 200 read → increment → write(expected_sha256)
// cycles of one counter, from both nodes at once, retrying on conflict
// after a small random backoff, lose nothing.
func TestNodesCASCounter(t *testing.T) {
	if testing.Short() {
		t.Skip("800+ processes")
	}
	_, a, b := sharedVolume(t)
	const scope, each = "acme/coder/s1", 200
	a.mustTool(scope, "workspace_write", `{"path":"counter","content":"0"}`)
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	conflicts := make([]int, 2)
	for i, n := range []*node{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for done := 0; done < each; {
				m, code, err := n.tool(scope, "workspace_read", `{"path":"counter"}`)
				if err != nil || code != 0 {
					errs <- fmt.Errorf("read on %s: %v %v", n.root, m, err)
					return
				}
				v, _ := strconv.Atoi(m["content"].(string))
				in, _ := json.Marshal(map[string]any{"path": "counter", "content": strconv.Itoa(v + 1), "expected_sha256": m["sha256"]})
				w, code, err := n.tool(scope, "workspace_write", string(in))
				switch {
				case err != nil:
					errs <- err
					return
				case code == 0:
					done++
				case errCode(w) == "conflict":
					conflicts[i]++
					time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
				default:
					errs <- fmt.Errorf("write on %s: %v", n.root, w)
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
	m := b.mustTool(scope, "workspace_read", `{"path":"counter"}`)
	if m["content"] != strconv.Itoa(2*each) {
		t.Fatalf("counter %v, want %d: updates were lost", m["content"], 2*each)
	}
	t.Logf("conflicts retried: node A %d, node B %d", conflicts[0], conflicts[1])
}

// TestNodesScopeLock: a command holding the scope lock on node A (a
// process that opened the volume at A's path) holds off a write on node B
// until it ends.
func TestNodesScopeLock(t *testing.T) {
	src, a, b := sharedVolume(t)
	const scope = "acme/coder/s1"
	h := lockHolder(t, a.root, a.volumeID, scope)

	writer := b.command("tool", "workspace_write", "--scope", scope, "--input", `{"path":"w.txt","content":"after the command"}`)
	var out bytes.Buffer
	writer.Stdout, writer.Stderr = &out, &out
	if err := writer.Start(); err != nil {
		t.Fatal(err)
	}
	finished := make(chan time.Time, 1)
	go func() { writer.Wait(); finished <- time.Now() }()
	select {
	case <-finished:
		t.Fatalf("node B's write finished while node A held the scope lock: %s", out.Bytes())
	case <-time.After(1500 * time.Millisecond):
	}
	if _, err := os.Stat(filepath.Join(src, store.Scope{Space: "acme", Agent: "coder", Session: "s1"}.Dir(), "w.txt")); !os.IsNotExist(err) {
		t.Fatalf("the file was written while the lock was held: %v", err)
	}
	released := h.release()
	var done time.Time
	select {
	case done = <-finished:
	case <-time.After(20 * time.Second):
		t.Fatal("node B's write did not finish after the lock was released")
	}
	if writer.ProcessState.ExitCode() != 0 {
		t.Fatalf("node B's write: exit %d: %s", writer.ProcessState.ExitCode(), out.Bytes())
	}
	if done.Before(released) {
		t.Errorf("node B's write finished at %v, before the release at %v", done, released)
	}
	if m := a.mustTool(scope, "workspace_read", `{"path":"w.txt"}`); m["content"] != "after the command" {
		t.Errorf("node A reads %v", m["content"])
	}
}

// TestNodesStateLocksBounded: while a process on node A holds the lock of
// the scope's quota ledger, or the one that decides who begins a call (as
// a node that died holding it would, on CephFS, for about a minute), a
// tool call on node B that needs it answers timeout at its budget instead
// of waiting in the kernel, and once the lock is let go the same call
// goes through.
func TestNodesStateLocksBounded(t *testing.T) {
	_, a, b := sharedVolume(t)
	const scope = "acme/coder/locks"
	pol := quotaPolicy(t, "1 MiB")
	tool := func(n *node, budget string, args ...string) (code string, took time.Duration, r result) {
		t.Helper()
		start := time.Now()
		r = n.run(append([]string{"--policy", pol, "tool", "workspace_write", "--scope", scope, "--timeout", budget}, args...)...)
		took = time.Since(start)
		var m struct {
			Error *struct{ Code string } `json:"error"`
		}
		json.Unmarshal(r.stdout, &m)
		if m.Error != nil {
			code = m.Error.Code
		}
		return code, took, r
	}
	// The first write makes the ledger and the call record.
	if code, _, r := tool(b, "60s", "--call-id", "c-0", "--input", `{"path":"w0.txt","content":"x"}`); r.code != 0 {
		t.Fatalf("first write on B: %s exit %d %s %s", code, r.code, r.stdout, r.stderr)
	}
	for _, tc := range []struct {
		name, file string
		args       []string
	}{
		{"quota ledger", store.QuotaDir + "/ledger.lock", []string{"--input", `{"path":"w1.txt","content":"y"}`}},
		{"call record", callrec.Dir + "/" + callrec.LockName, []string{"--call-id", "c-1", "--input", `{"path":"w2.txt","content":"z"}`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := lockHolder(t, a.root, a.volumeID, scope, tc.file)
			// Let the lock go after 20 s whatever happens, so that a
			// call that can't answer at its budget fails the test
			// instead of hanging it.
			defer time.AfterFunc(20*time.Second, h.letGo).Stop()
			code, took, r := tool(b, "2s", tc.args...)
			if code != "timeout" || took > 10*time.Second {
				t.Errorf("write on B while A holds the %s lock, a 2 s budget: %q after %v (exit %d %s %s), want timeout at the budget",
					tc.name, code, took.Round(time.Millisecond), r.code, r.stdout, r.stderr)
			}
			t.Logf("answered %s after %v", code, took.Round(time.Millisecond))
			h.release()
			if code, _, r := tool(b, "60s", tc.args...); r.code != 0 {
				t.Errorf("the same write once the lock is let go: %s exit %d %s %s", code, r.code, r.stdout, r.stderr)
			}
		})
	}
}

// TestNodeWithWrongVolumeID: a third process configured with another
// volume id refuses, on every path of the volume, and creates nothing.
func TestNodeWithWrongVolumeID(t *testing.T) {
	src, a, b := sharedVolume(t)
	a.mustTool("acme/coder/s1", "workspace_write", `{"path":"f","content":"x"}`)
	everything := func() string { return tree(t, src) + tree(t, a.dir) + tree(t, b.dir) }
	before := everything()
	for _, n := range []*node{a, b} {
		wrong := *n
		wrong.volumeID = "team-volume-v2"
		m, code, err := wrong.tool("acme/coder/s1", "workspace_read", `{"path":"f"}`)
		if err != nil || code != 1 || errCode(m) != "volume_unavailable" {
			t.Errorf("wrong volume id on %s: exit %d, %v %v", n.root, code, m, err)
		}
		if r := wrong.run("check"); r.code != 1 {
			t.Errorf("check with the wrong volume id on %s: exit %d %s", n.root, r.code, r.stdout)
		}
	}
	if got := everything(); got != before {
		t.Errorf("a refused node changed the tree:\nbefore\n%s\nafter\n%s", before, got)
	}
}

// tree lists every path under dir with its type, and a file's size. A
// directory's size is left out: on CephFS it is the bytes below it, which
// the MDS brings up to date in its own time, so a tree nothing touched
// could list two sizes for it.
func tree(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			fmt.Fprintf(&b, "%s: %v\n", p, err)
			return nil
		}
		if info.IsDir() {
			fmt.Fprintf(&b, "%s %v\n", p, info.Mode())
			return nil
		}
		fmt.Fprintf(&b, "%s %v %d\n", p, info.Mode(), info.Size())
		return nil
	})
	return b.String()
}

// TestEntryPointsRefuseUnavailableVolume: with the shared root missing or
// its marker missing, empty or different, every command that would create
// a run, resume one, read artifacts, touch instance files, mount or run a
// command refuses with volume_unavailable, and nothing is created anywhere:
// not on the volume, not in the data directory, not in the working
// directory (SPEC §2.2).
func TestEntryPointsRefuseUnavailableVolume(t *testing.T) {
	states := []struct {
		name     string
		breakVol func(t *testing.T, root string)
	}{
		{"root missing", func(t *testing.T, root string) {
			if err := os.Rename(root, root+".unmounted"); err != nil {
				t.Fatal(err)
			}
		}},
		{"marker missing", func(t *testing.T, root string) { os.Remove(filepath.Join(root, store.VolumeMarker)) }},
		{"marker empty", func(t *testing.T, root string) { os.WriteFile(filepath.Join(root, store.VolumeMarker), nil, 0o600) }},
		{"marker different", func(t *testing.T, root string) {
			os.WriteFile(filepath.Join(root, store.VolumeMarker), []byte("team-volume-v0\n"), 0o600)
		}},
	}
	entries := []struct {
		name string
		args []string
	}{
		{"create a run", []string{"runs", "create", "--scope", "acme/coder/s1", "--run", "r-2", "--user", "alice"}},
		{"create a run of a new session", []string{"runs", "create", "--scope", "acme/coder/s9", "--run", "r-3", "--user", "alice"}},
		{"resume a run", []string{"runs", "show", "--run", "r-1"}},
		{"resume a legacy run", []string{"runs", "show", "--run", "old-1"}},
		{"list artifacts", []string{"artifacts", "list", "--run", "r-1", "--user", "alice"}},
		{"download an artifact", []string{"artifacts", "get", "--run", "r-1", "--user", "alice", "a.txt"}},
		{"read main files", []string{"tool", "workspace_read", "--scope", "acme/coder/s1", "--input", `{"path":"a.txt"}`}},
		{"write instance files", []string{"tool", "workspace_write", "--scope", "acme/coder/s1/r-1/sub-1", "--input", `{"path":"b.txt","content":"z"}`}},
		{"list a new instance", []string{"tool", "workspace_list", "--scope", "acme/coder/s1/r-1/sub-9"}},
		{"run a command (tool)", []string{"tool", "workspace_command", "--scope", "acme/coder/s1", "--input", `{"command":"true"}`}},
		{"run a command", []string{"run", "--scope", "acme/coder/s1", "--", "true"}},
		{"mount", []string{"mount", "--scope", "acme/coder/s1", "MOUNTPOINT"}},
		{"quarantine list", []string{"quarantine", "list"}},
	}
	for _, st := range states {
		t.Run(st.name, func(t *testing.T) {
			base := t.TempDir()
			n := &node{t: t, root: filepath.Join(base, "volume"), volumeID: nodeVolume, dir: filepath.Join(base, "work")}
			mountpoint := filepath.Join(base, "mnt")
			for _, d := range []string{n.root, n.dir, mountpoint, filepath.Join(n.dir, "data", "runs", "old-1")} {
				if err := os.MkdirAll(d, 0o700); err != nil {
					t.Fatal(err)
				}
			}
			os.WriteFile(filepath.Join(n.root, store.VolumeMarker), []byte(nodeVolume), 0o600)
			if r := n.run("runs", "create", "--scope", "acme/coder/s1", "--run", "r-1", "--user", "alice"); r.code != 0 {
				t.Fatalf("runs create: %s %s", r.stdout, r.stderr)
			}
			n.mustTool("acme/coder/s1", "workspace_write", `{"path":"a.txt","content":"x"}`)
			n.mustTool("acme/coder/s1/r-1/sub-1", "workspace_write", `{"path":"b.txt","content":"y"}`)

			st.breakVol(t, n.root)
			before := tree(t, base)
			for _, e := range entries {
				args := append([]string(nil), e.args...)
				for i, a := range args {
					if a == "MOUNTPOINT" {
						args[i] = mountpoint
					}
				}
				r := n.run(args...)
				said := string(r.stdout) + r.stderr
				if r.code != 1 || !strings.Contains(said, "volume_unavailable") && !strings.Contains(said, "shared volume unavailable") {
					t.Errorf("%s: exit %d, %s; want 1 and volume_unavailable", e.name, r.code, said)
				}
			}
			r := n.run("--json", "check", "--probe")
			if r.code != 1 || !bytes.Contains(r.stdout, []byte(`"ok": false`)) {
				t.Errorf("check --probe: exit %d, %s", r.code, r.stdout)
			}
			if got := tree(t, base); got != before {
				t.Errorf("something was created:\nbefore\n%s\nafter\n%s", before, got)
			}
		})
	}
}

// TestLegacyRunThroughCLI: a run without a binding is resolved to
// data/runs/<run_id>, and its files are left where they are.
func TestLegacyRunThroughCLI(t *testing.T) {
	base := t.TempDir()
	n := &node{t: t, root: filepath.Join(base, "volume"), volumeID: nodeVolume, dir: filepath.Join(base, "work")}
	legacy := filepath.Join(n.dir, "data", store.LegacyRunsDir, "old-1")
	if err := os.MkdirAll(legacy, 0o700); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(n.root, 0o700)
	os.WriteFile(filepath.Join(n.root, store.VolumeMarker), []byte(nodeVolume), 0o600)
	os.WriteFile(filepath.Join(legacy, "notes.md"), []byte("old"), 0o600)
	m := n.runsShow("old-1")
	if m["legacy"] != true || m["binding"] != nil || m["legacy_dir"] != legacy {
		t.Errorf("runs show of a run without a binding: %v", m)
	}
	if r := n.run("artifacts", "list", "--run", "old-1", "--user", "alice"); r.code != 1 || !strings.Contains(r.stderr, "permission_denied") {
		t.Errorf("artifacts of a legacy run: exit %d %s", r.code, r.stderr)
	}
	if r := n.run("runs", "create", "--scope", "acme/coder/s1", "--run", "old-1", "--user", "alice"); r.code != 1 || !strings.Contains(r.stderr, "legacy") {
		t.Errorf("binding a legacy run id: exit %d %s", r.code, r.stderr)
	}
	ents, _ := os.ReadDir(legacy)
	if len(ents) != 1 || ents[0].Name() != "notes.md" {
		t.Errorf("the legacy directory changed: %v", ents)
	}
}

// TestArtifactsCommand: the command line around the Go API: misuse exits 2,
// --output writes a new 0600 file and never replaces one.
func TestArtifactsCommand(t *testing.T) {
	base := t.TempDir()
	n := &node{t: t, root: filepath.Join(base, "volume"), volumeID: nodeVolume, dir: filepath.Join(base, "work")}
	os.MkdirAll(n.root, 0o700)
	os.MkdirAll(n.dir, 0o700)
	os.WriteFile(filepath.Join(n.root, store.VolumeMarker), []byte(nodeVolume), 0o600)
	if r := n.run("runs", "create", "--scope", "acme/coder/s1", "--run", "r-1", "--user", "alice"); r.code != 0 {
		t.Fatalf("runs create: %s %s", r.stdout, r.stderr)
	}
	n.mustTool("acme/coder/s1", "workspace_write", `{"path":"a.txt","content":"artifact"}`)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"list without --user", []string{"artifacts", "list", "--run", "r-1"}},
		{"get without --run", []string{"artifacts", "get", "--user", "alice", "a.txt"}},
		{"get without a path", []string{"artifacts", "get", "--run", "r-1", "--user", "alice"}},
		{"create for a child scope", []string{"runs", "create", "--scope", "acme/coder/s1/r-1/sub-1", "--run", "r-2", "--user", "alice"}},
		{"create without --user", []string{"runs", "create", "--scope", "acme/coder/s1", "--run", "r-2"}},
	} {
		if r := n.run(tc.args...); r.code != 2 {
			t.Errorf("%s: exit %d, want 2 (%s)", tc.name, r.code, r.stderr)
		}
	}
	out := filepath.Join(base, "download")
	if r := n.run("artifacts", "get", "--run", "r-1", "--user", "alice", "a.txt", "--output", out); r.code != 0 {
		t.Fatalf("get --output: exit %d %s", r.code, r.stderr)
	}
	if fi, err := os.Stat(out); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("downloaded file: %v %v; want mode 0600", fi, err)
	}
	if b, _ := os.ReadFile(out); string(b) != "artifact" {
		t.Errorf("downloaded %q", b)
	}
	os.WriteFile(out, []byte("keep me"), 0o600)
	if r := n.run("artifacts", "get", "--run", "r-1", "--user", "alice", "a.txt", "--output", out); r.code != 1 {
		t.Errorf("get --output over an existing file: exit %d", r.code)
	}
	if b, _ := os.ReadFile(out); string(b) != "keep me" {
		t.Errorf("--output replaced an existing file: %q", b)
	}
	r := n.run("--json", "artifacts", "get", "--run", "r-1", "--user", "bob", "a.txt")
	var m map[string]any
	if r.code != 1 || json.Unmarshal(r.stdout, &m) != nil || errCode(m) != "permission_denied" {
		t.Errorf("--json refusal: exit %d, %s", r.code, r.stdout)
	}
}

// TestNodesMountStopIsBounded: a loomfs mount exits within its
// --stop-timeout of SIGTERM and leaves no mount behind, however slowly the
// shared volume answers: while a process writes through it, another node's
// mount changes what it caches (its follower drops it), and, in the
// second case, a peer holds the scope's quota ledger locked, as one does
// whose client stalled mid-update (on CephFS, one waiting for the metadata
// server). Closing the workspace needs that lock; the mount leaves its
// share to the next user of the scope, as after a crash, and that user
// goes on.
func TestNodesMountStopIsBounded(t *testing.T) {
	for _, tc := range []struct {
		name       string
		holdLedger bool
	}{
		{"busy", false},
		{"ledger held by a stalled peer", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, a, b := sharedVolume(t)
			const scope = "acme/coder/s1"
			ma := a.mount(scope)
			cmd, mb, out := b.startMount(scope, "--stop-timeout", "2s")

			// A writer on each node; B's follower drops A's files
			// from B's caches, and B's own writes are under way.
			stop := make(chan struct{})
			var writers sync.WaitGroup
			for i, dir := range []string{ma, mb} {
				writers.Add(1)
				go func() {
					defer writers.Done()
					for n := 0; ; n++ {
						select {
						case <-stop:
							return
						default:
						}
						// Errors are expected once B's mount is gone.
						os.WriteFile(filepath.Join(dir, fmt.Sprintf("w%d-%d", i, n%20)), bytes.Repeat([]byte("x"), 1000+n), 0o600)
						if i == 1 {
							os.ReadFile(filepath.Join(dir, fmt.Sprintf("w0-%d", n%20)))
						}
					}
				}()
			}
			t.Cleanup(func() { close(stop); writers.Wait() })
			time.Sleep(500 * time.Millisecond)

			release := func() {}
			holders := func() int { return 0 }
			if tc.holdLedger {
				ledger := findFile(t, b.root, "ledger.lock")
				// Each open account keeps a record locked, h-ID.lock.
				holders = func() int {
					m, _ := filepath.Glob(filepath.Join(filepath.Dir(ledger), "h-*.lock"))
					return len(m)
				}
				f, err := os.OpenFile(ledger, os.O_RDWR, 0)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				lk := unix.Flock_t{Type: unix.F_WRLCK}
				if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLKW, &lk); err != nil {
					t.Fatalf("lock the quota ledger: %v", err)
				}
				release = func() {
					lk.Type = unix.F_UNLCK
					unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk)
				}
				defer release()
				// B's writes spent quota since it last settled.
				time.Sleep(300 * time.Millisecond)
			}

			before := holders()
			start := time.Now()
			stopMount(t, cmd, mb)
			// 2 s, and a request in the filesystem's client at the time.
			if took := time.Since(start); took > 8*time.Second {
				t.Errorf("loomfs mount --stop-timeout 2s exited %v after SIGTERM", took.Round(time.Millisecond))
			}
			if code := cmd.ProcessState.ExitCode(); code != 0 {
				t.Errorf("loomfs mount exited %d after SIGTERM:\n%s", code, out)
			}
			if isMounted(t, mb) {
				unix.Unmount(mb, unix.MNT_DETACH)
				t.Errorf("the mount at %s is left behind", mb)
			}
			// Closing needs the ledger only if B spent since its last
			// fold: then it leaves its share open. B may have had none
			// to fold (its writer sat waiting on the other node's
			// client, long enough for the account to go idle and fold
			// it, and its next grant waited on the lock held here): then
			// it closes its account and its record is gone.
			if tc.holdLedger && !strings.Contains(out.String(), "left open, as after a crash") && holders() != before-1 {
				t.Errorf("the mount neither said it left the workspace open nor closed its quota account (%d holder records before the stop, %d after):\n%s", before, holders(), out)
			}
			release()
			if err := os.WriteFile(filepath.Join(ma, "after"), []byte("A goes on"), 0o600); err != nil {
				t.Errorf("write through node A's mount after B's stop: %v", err)
			}
		})
	}
}

// findFile returns the path of the one file called name beneath root.
func findFile(t *testing.T, root, name string) string {
	t.Helper()
	var found []string
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Name() == name {
			found = append(found, p)
		}
		return nil
	})
	if len(found) != 1 {
		t.Fatalf("%d files called %s beneath the volume, want 1: %v", len(found), name, found)
	}
	return found[0]
}

// isMounted reports whether something is mounted at dir.
func isMounted(t *testing.T, dir string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == dir {
			return true
		}
	}
	return false
}
