package test

// Fencing a node presumed dead on CephFS (issue 50), on the single-host
// cluster of scripts/cephfs. Node A and node B get ceph-fuse mounts of
// their own: fencing A evicts its client, which must not be one of the
// two mounts every other shared-volume test uses.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"net/http"
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

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/fence"
	"github.com/agentloom/loomfs/nodeid"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
	"github.com/agentloom/loomfs/tools"
)

// cephStateEnv is scripts/cephfs's state directory (its ceph.conf): the
// fence test mounts clients of its own and asks the cluster to fence.
const cephStateEnv = "LOOMFS_CEPHFS_STATE"

// A writer of node A runs in a re-executed test binary: it appends a line
// to the file named by the variable, working in its directory and opening
// it by name each time (as a program in a workspace that opens, writes and
// closes would), syncing each, and says "wrote N" or, at its first
// failure, "error ERRNO" and ends. Its working directory keeps it on the
// mount it started on: by its whole path, once a fenced loomfs mount has
// gone, it would write on in the empty directory the mount leaves behind
// (the node's own disk, never the volume), and never see the fence.
const fenceWriterEnv = "LOOMFS_FENCE_TEST_WRITER"

func init() {
	if path := os.Getenv(fenceWriterEnv); path != "" {
		lateWriter(path)
		os.Exit(0)
	}
}

func lateWriter(path string) {
	if err := os.Chdir(filepath.Dir(path)); err != nil {
		var en syscall.Errno
		errors.As(err, &en)
		fmt.Printf("error %d\n", int(en))
		return
	}
	name := filepath.Base(path)
	for i := 1; ; i++ {
		err := appendSync(name, fmt.Sprintf("A line %d\n", i))
		if err != nil {
			var en syscall.Errno
			errors.As(err, &en)
			fmt.Printf("error %d\n", int(en))
			return
		}
		fmt.Printf("wrote %d\n", i)
		time.Sleep(20 * time.Millisecond)
	}
}

// startLateWriter starts a writer (lateWriter) appending to path in a
// re-executed test binary; its lines come out of the channel. It is
// killed at cleanup, stopped or not.
func startLateWriter(t *testing.T, path string) (*exec.Cmd, <-chan string) {
	t.Helper()
	w := exec.Command(os.Args[0], "-test.run=^$")
	w.Env = append(os.Environ(), fenceWriterEnv+"="+path)
	stdout, err := w.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	w.Stderr = os.Stderr
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Process.Signal(syscall.SIGCONT); w.Process.Kill(); w.Wait() })
	lines := make(chan string, 1024)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	return w, lines
}

// awaitWrites waits for n "wrote" lines of a writer.
func awaitWrites(t *testing.T, who string, lines <-chan string, n int) {
	t.Helper()
	for i := 0; i < n; {
		select {
		case l, ok := <-lines:
			if !ok || !strings.HasPrefix(l, "wrote ") {
				t.Fatalf("%s said %q", who, l)
			}
			i++
		case <-time.After(30 * time.Second):
			t.Fatalf("%s wrote nothing in 30 s", who)
		}
	}
}

// awaitError waits for a writer's error line and returns it.
func awaitError(t *testing.T, who string, lines <-chan string) string {
	t.Helper()
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("%s ended without a word", who)
			}
			if strings.HasPrefix(l, "error ") {
				return l
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s went on writing for 30 s after A woke up", who)
		}
	}
}

func appendSync(path, line string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	_, err = f.WriteString(line)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// cephClient is one ceph-fuse mount standing in for one node's.
type cephClient struct {
	dir string
	cmd *exec.Cmd
}

// mountCephClient mounts the cluster of conf at a new directory as node
// would: client metadata naming the node and this boot. It is unmounted
// and stopped at cleanup, fenced or not.
func mountCephClient(t *testing.T, conf, node string) *cephClient {
	t.Helper()
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Fatal(err)
	}
	meta := fmt.Sprintf("%s=%s,%s=%s", fence.NodeKey, node, fence.BootKey, strings.TrimSpace(string(boot)))
	return mountCephFuse(t, conf, "--client_metadata="+meta, "--client_reconnect_stale=false")
}

// mountCephFuse mounts the cluster of conf at a new directory with
// ceph-fuse and its options, and unmounts and stops it at cleanup.
func mountCephFuse(t *testing.T, conf string, options ...string) *cephClient {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ceph-fuse", append(append([]string{"-c", conf}, options...), "-f", dir)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	logf, err := os.Create(filepath.Join(filepath.Dir(dir), "ceph-fuse.out"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start ceph-fuse: %v", err)
	}
	c := &cephClient{dir: dir, cmd: cmd}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGCONT)
		if isMounted(t, dir) {
			unix.Unmount(dir, unix.MNT_DETACH)
		}
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		logf.Close()
	})
	deadline := time.Now().Add(30 * time.Second)
	for !isMounted(t, dir) {
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(logf.Name())
			t.Fatalf("ceph-fuse did not mount %s in 30 s: %s", dir, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return c
}

// treeSums returns the sha256 of every regular file under root, by path.
func treeSums(t *testing.T, root string) map[string]string {
	t.Helper()
	sums := map[string]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		h := sha256.New()
		if _, err := io.Copy(h, f); err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		sums[rel] = hex.EncodeToString(h.Sum(nil))
		return nil
	})
	if err != nil {
		t.Fatalf("checksum the volume: %v", err)
	}
	return sums
}

// TestNodeFenceTakeover is issue 50's experiment: node A works through a
// tool call, a program of its own, a loomfs mount (a program appending
// through it) and a command's container (appending through its
// projection), and freezes mid-write (the programs, the mount's daemon,
// its loomfs serve and its ceph-fuse are stopped and the container
// paused, as on a node that hangs or is cut off); node B fences A and
// takes its work over, and A wakes up: not one byte A writes after the
// fence lands (the checksum of every file of the volume, the audit and
// the journals among them, and audit verify's account of A), A's callers
// get the fenced error, A's mount exits, and B's work is intact. The
// blocklist entries outlive a default expiry shortened to seconds: the
// fence pinned them.
func TestNodeFenceTakeover(t *testing.T) {
	if _, _, ok := dfsRoots(t); !ok {
		t.Skipf("needs CephFS: %s unset (make test-dfs, or scripts/cephfs up)", dfsRootsEnv)
	}
	state := os.Getenv(cephStateEnv)
	if state == "" {
		t.Skipf("%s unset: the fence test needs the cluster's ceph.conf", cephStateEnv)
	}
	conf := filepath.Join(state, "ceph.conf")
	ceph := &fence.Ceph{Conf: conf}
	ctx := context.Background()

	// The monitor's default blocklist expiry, which the MDS's own
	// eviction gets, is cut to 3 s for this test.
	const shortExpire = 3
	cephCmd(t, conf, "config", "set", "mon", "mon_osd_blocklist_default_expire", strconv.Itoa(shortExpire))
	t.Cleanup(func() {
		exec.Command("ceph", "--conf", conf, "config", "rm", "mon", "mon_osd_blocklist_default_expire").Run()
	})

	tag := strconv.FormatInt(time.Now().UnixNano(), 36) + strconv.Itoa(rand.IntN(1000))
	nameA, nameB := "fence-a-"+tag, "fence-b-"+tag
	ca, cb := mountCephClient(t, conf, nameA), mountCephClient(t, conf, nameB)
	vol := "vol-" + tag
	if err := os.Mkdir(filepath.Join(cb.dir, vol), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cb.dir, vol, store.VolumeMarker), []byte(nodeVolume+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(filepath.Join(cb.dir, vol)) })
	base := t.TempDir()
	mk := func(name, mnt string) *node {
		dir := filepath.Join(base, name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		return &node{t: t, root: filepath.Join(mnt, vol), volumeID: nodeVolume, dir: dir, name: name}
	}
	a, b := mk(nameA, ca.dir), mk(nameB, cb.dir)
	const scope = "acme/coder/fenced"

	// A works: a tool call, and a program of its own appending to a file.
	a.mustTool(scope, "workspace_write", `{"path":"owned.txt","content":"written by A before the fence"}`)
	var wsDir string
	filepath.WalkDir(a.root, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.Name() == "owned.txt" {
			wsDir = filepath.Dir(path)
		}
		return err
	})
	if wsDir == "" {
		t.Fatal("node A's file is nowhere on its mount")
	}
	latePath := filepath.Join(wsDir, "late.txt")
	writer := exec.Command(os.Args[0], "-test.run=^$")
	writer.Env = append(os.Environ(), fenceWriterEnv+"="+latePath)
	stdout, err := writer.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	writer.Stderr = os.Stderr
	if err := writer.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { writer.Process.Signal(syscall.SIGCONT); writer.Process.Kill(); writer.Wait() })
	lines := make(chan string, 1024)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	for n := 0; n < 5; {
		select {
		case l, ok := <-lines:
			if !ok || !strings.HasPrefix(l, "wrote ") {
				t.Fatalf("A's writer said %q before the fence", l)
			}
			n++
		case <-time.After(30 * time.Second):
			t.Fatal("A's writer wrote nothing in 30 s")
		}
	}

	// And a loomfs mount of A's, a program appending through it, and a
	// command of A's service whose container appends through its
	// projection: each in a scope of its own.
	mnt := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	mount := a.command("mount", "--scope", scope+"-mnt", mnt)
	mountOut := &syncBuffer{}
	mount.Stdout, mount.Stderr = mountOut, mountOut
	if err := mount.Start(); err != nil {
		t.Fatal(err)
	}
	mountEnded := make(chan error, 1)
	go func() { mountEnded <- mount.Wait() }()
	t.Cleanup(func() {
		mount.Process.Signal(syscall.SIGCONT)
		mount.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-mountEnded:
			mountEnded <- err
		case <-time.After(20 * time.Second):
			mount.Process.Kill()
		}
		if isMounted(t, mnt) {
			unix.Unmount(mnt, unix.MNT_DETACH)
		}
	})
	waitFor(t, "A's loomfs mount", func() bool { return strings.Contains(mountOut.String(), "mounted ") })
	_, mountLines := startLateWriter(t, filepath.Join(mnt, "mounted.txt"))
	awaitWrites(t, "A's writer through its loomfs mount", mountLines, 5)

	sa := startNodeService(t, a)
	t.Cleanup(func() { sa.cmd.Process.Signal(syscall.SIGCONT) }) // before its stop
	nodeContainers := func() []string {
		t.Helper()
		out, err := exec.Command("docker", "ps", "-aq", "--filter", "label=io.loomfs.node="+nameA).Output()
		if err != nil {
			t.Fatalf("docker ps: %v", err)
		}
		return strings.Fields(string(out))
	}
	t.Cleanup(func() {
		if ids := nodeContainers(); len(ids) > 0 {
			exec.Command("docker", append([]string{"unpause"}, ids...)...).Run()
			exec.Command("docker", append([]string{"rm", "-f"}, ids...)...).Run()
		}
	})
	commandAnswered := make(chan map[string]any, 1)
	go func() {
		cmd := a.command("tool", tools.Command, "--scope", scope+"-cmd", "--input",
			`{"command":"i=0; while true; do i=$((i+1)); echo C line $i >> container.txt; sleep 0.02; done","timeout_s":120}`)
		cmd.Env = sa.env
		var o bytes.Buffer
		cmd.Stdout = &o
		cmd.Run()
		var m map[string]any
		json.Unmarshal(o.Bytes(), &m)
		commandAnswered <- m
	}()
	var containerFile string
	waitFor(t, "A's container to write", func() bool {
		time.Sleep(100 * time.Millisecond)
		select {
		case m := <-commandAnswered:
			t.Fatalf("A's command ended before the fence: %v; its service: %s", m, sa.out)
		default:
		}
		if containerFile == "" {
			filepath.WalkDir(a.root, func(path string, d fs.DirEntry, err error) error {
				if err == nil && d.Name() == "container.txt" {
					containerFile = path
				}
				return err
			})
		}
		b, _ := os.ReadFile(containerFile)
		return bytes.Count(b, []byte("\n")) >= 5
	})
	containers := nodeContainers()
	if len(containers) != 1 {
		t.Fatalf("A's containers: %v, want its command's", containers)
	}

	// A freezes mid-write: its programs, its mount's daemon, its
	// command's container, its service, then its storage client.
	if err := writer.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if err := mount.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("docker", "pause", containers[0]).CombinedOutput(); err != nil {
		t.Fatalf("docker pause: %v: %s", err, out)
	}
	containerState := func() string {
		out, _ := exec.Command("docker", "inspect", "-f", "{{.State.Status}}", containers[0]).CombinedOutput()
		return strings.TrimSpace(string(out))
	}
	if st := containerState(); st != "paused" {
		t.Fatalf("A's container after docker pause: %s", st)
	}
	if err := sa.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if err := ca.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// Should the test end with A frozen, A wakes up before anything else
	// is cleaned up (removing a paused container whose projection's
	// daemon is stopped would hang).
	t.Cleanup(func() {
		for _, p := range []*os.Process{ca.cmd.Process, writer.Process, mount.Process, sa.cmd.Process} {
			p.Signal(syscall.SIGCONT)
		}
		exec.Command("docker", "unpause", containers[0]).Run()
	})
	// A control entry, added with the (shortened) default expiry: it
	// must lapse while the fence's entries stay.
	control := fmt.Sprintf("127.0.0.1:0/%d", rand.Uint32())
	cephCmd(t, conf, "osd", "blocklist", "add", control)
	t.Cleanup(func() { ceph.Unblocklist(ctx, control) })

	// B fences A and takes over.
	start := time.Now()
	r := b.run("--json", "fence", "--node", nameA, "--reason", "node A stopped answering", "--ceph-conf", conf)
	fenced := time.Since(start)
	if r.code != 0 {
		t.Fatalf("fence: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	var rec fence.Record
	if err := json.Unmarshal(r.stdout, &rec); err != nil {
		t.Fatalf("fence --json: %v: %s", err, r.stdout)
	}
	for _, in := range rec.Instances {
		t.Cleanup(func() { ceph.Unblocklist(ctx, in.Addr) })
	}
	if len(rec.Instances) != 1 || rec.Instances[0].Node != nameA || rec.Method != fence.MethodCeph || rec.Barrier < rec.OSDEpoch {
		t.Fatalf("fence record %+v: want node A's one instance, evicted, barrier reached", rec)
	}
	if rec.JournalsMarked == 0 || rec.MarkerScopes == 0 {
		t.Errorf("the fence marked %d journal files of A and %d scopes with A's markers; want A's journals and its command's marker", rec.JournalsMarked, rec.MarkerScopes)
	}
	if onVolume, err := fence.Read(b.root, nameA); err != nil || onVolume.Instances[0].Addr != rec.Instances[0].Addr {
		t.Errorf("the fence on the volume: %+v %v", onVolume, err)
	}
	b.mustTool(scope, "workspace_write", `{"path":"owned.txt","content":"B's work after the takeover"}`)
	b.mustTool(scope, "workspace_write", `{"path":"late.txt","content":"B's late.txt\n"}`)
	takeover := time.Since(start)
	// And takes over the mount's scope and the command's, clearing the
	// quarantine A's command left.
	if r := b.run("quarantine", "clear", "--fenced-node", nameA); r.code != 0 {
		t.Errorf("quarantine clear --fenced-node: exit %d %s %s", r.code, r.stdout, r.stderr)
	} else {
		t.Logf("quarantine clear --fenced-node: %s", bytes.TrimSpace(r.stdout))
	}
	b.mustTool(scope+"-mnt", "workspace_write", `{"path":"mounted.txt","content":"B's mounted.txt\n"}`)
	b.mustTool(scope+"-cmd", "workspace_write", `{"path":"container.txt","content":"B's container.txt\n"}`)
	takeoverAll := time.Since(start)
	t.Logf("fence took %s (by its record %s), fence to B's two writes landed %s, to B's work in all three scopes %s", fenced.Round(time.Millisecond), rec.Took.Round(time.Millisecond), takeover.Round(time.Millisecond), takeoverAll.Round(time.Millisecond))
	// Every instance of B still works, and only A's was evicted.
	clients, err := ceph.Clients(ctx)
	if err != nil {
		t.Fatal(err)
	}
	seenB := false
	for _, c := range clients {
		if c.Node == nameA {
			t.Errorf("node A's client.%d still has a session after the fence", c.ID)
		}
		seenB = seenB || c.Node == nameB
	}
	if !seenB {
		t.Error("node B's client lost its session: the fence hit the wrong node")
	}
	before := treeSums(t, b.root)

	// A wakes up.
	if err := ca.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()
	for _, p := range []*os.Process{writer.Process, mount.Process} {
		if err := p.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	}
	// The container before its service (which removes it once it sees
	// the fence): its writes wait for the projection's daemon.
	if st := containerState(); st != "paused" {
		t.Errorf("A's container, paused across the fence, is %s when A wakes up", st)
	}
	if out, err := exec.Command("docker", "unpause", containers[0]).CombinedOutput(); err != nil {
		t.Errorf("docker unpause: %v: %s", err, out)
	}
	if err := sa.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	var writerSaw string
	for writerSaw == "" {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("A's writer ended without a word after the fence")
			}
			if strings.HasPrefix(l, "error ") {
				writerSaw = l
			}
		case <-time.After(30 * time.Second):
			t.Fatal("A's writer went on writing for 30 s after the fence")
		}
	}
	sawAfter := time.Since(resumed)
	if writerSaw != fmt.Sprintf("error %d", int(syscall.ESHUTDOWN)) {
		t.Errorf("A's writer got %q, want ESHUTDOWN (%d)", writerSaw, int(syscall.ESHUTDOWN))
	}
	m, code, err := a.tool(scope, "workspace_write", `{"path":"owned.txt","content":"A's late write"}`)
	if err != nil {
		t.Fatal(err)
	}
	errm, _ := m["error"].(map[string]any)
	if code == 0 || errm["code"] != string(policy.VolumeUnavailable) || errm["message"] != policy.FencedMessage {
		t.Errorf("A's tool call after the fence: exit %d, %v; want volume_unavailable, this node was fenced", code, m)
	}
	mountSaw, mountSawAfter := awaitError(t, "A's writer through its loomfs mount", mountLines), time.Since(resumed)
	select {
	case err := <-mountEnded:
		mountEnded <- err // for the cleanup
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(mountOut.String(), "FENCED") {
			t.Errorf("A's mount after the fence: %v: %s", err, mountOut)
		}
	case <-time.After(30 * time.Second):
		t.Errorf("A's mount still serves 30 s after A woke up: %s", mountOut)
	}
	mountGone := time.Since(resumed)
	select {
	case m := <-commandAnswered:
		if errm, _ := m["error"].(map[string]any); errm["code"] != string(policy.VolumeUnavailable) || errm["message"] != policy.FencedMessage {
			t.Errorf("A's command, its container paused across the fence, answered %v; want volume_unavailable, this node was fenced", m)
		}
	case <-time.After(60 * time.Second):
		t.Error("A's command still runs 60 s after A woke up")
	}
	commandAnsweredAfter := time.Since(resumed)
	if ids := nodeContainers(); len(ids) != 0 {
		t.Errorf("A's containers after it woke up fenced: %v", ids)
	}
	t.Logf("after A resumed: its writer got %s in %s; its writer through its loomfs mount got %s in %s; its mount exited in %s; its command answered the fence in %s; its tool call: %v",
		writerSaw, sawAfter.Round(time.Millisecond), mountSaw, mountSawAfter.Round(time.Millisecond), mountGone.Round(time.Millisecond), commandAnsweredAfter.Round(time.Millisecond), errm["code"])

	// Nothing of A's landed: every file as B left it.
	time.Sleep(2 * time.Second)
	after := treeSums(t, b.root)
	for p, sum := range after {
		if before[p] != sum {
			t.Errorf("%s changed after A woke up", p)
		}
	}
	for p := range before {
		if _, ok := after[p]; !ok {
			t.Errorf("%s went after A woke up", p)
		}
	}
	if got, err := os.ReadFile(filepath.Join(b.root, strings.TrimPrefix(latePath, a.root))); err != nil || string(got) != "B's late.txt\n" {
		t.Errorf("late.txt as B sees it: %q %v", got, err)
	}
	for sc, file := range map[string]string{scope + "-mnt": "mounted.txt", scope + "-cmd": "container.txt"} {
		m := b.mustTool(sc, "workspace_read", `{"path":"`+file+`"}`)
		if !strings.Contains(fmt.Sprint(m), "B's "+file) {
			t.Errorf("%s in %s as B reads it: %v", file, sc, m)
		}
	}
	// The audit: A's records end where its fence found them. What A's
	// writers had not flushed when it froze was dropped with its client's
	// cache at the eviction, as in a crash of the machine: verify may
	// find A's chain shorter than its ledger's last entries say, and only
	// A's.
	r = b.run("--json", "audit", "verify", "--allow-crashed")
	var rep struct {
		Problems []struct {
			File string `json:"file"`
		} `json:"problems"`
		Fenced []struct {
			Node        string `json:"node"`
			InForce     bool   `json:"in_force"`
			LateRecords int    `json:"late_records"`
		} `json:"fenced_nodes"`
	}
	err = json.Unmarshal(r.stdout, &rep)
	for _, p := range rep.Problems {
		if !strings.HasPrefix(p.File, nameA+".") {
			t.Errorf("audit verify after A woke up: a problem outside A's files: %s", r.stdout)
		}
	}
	if len(rep.Problems) > 0 {
		t.Logf("audit verify after A woke up: %d problem(s) in A's files (its unflushed tail, dropped at the eviction)", len(rep.Problems))
	}
	if err != nil || len(rep.Fenced) != 1 || rep.Fenced[0].Node != nameA || !rep.Fenced[0].InForce || rep.Fenced[0].LateRecords != 0 {
		t.Errorf("audit verify after A woke up: exit %d %v %s %s; want A fenced, with no line after its fence", r.code, err, r.stdout, r.stderr)
	}

	// A's remount is refused by its own loomfs: the fresh client instance
	// is not on the blocklist, but the fence is recorded on the volume.
	// Re-admission refuses through the fenced mount and, run on A through
	// a fresh one, lifts the fence.
	remount := mountCephClient(t, conf, nameA)
	a2 := mk(nameA, remount.dir)
	m, code, err = a2.tool(scope, "workspace_write", `{"path":"owned.txt","content":"A's write through its remount"}`)
	if err != nil {
		t.Fatal(err)
	}
	if errm, _ := m["error"].(map[string]any); code != 1 || errm["message"] != policy.FencedMessage {
		t.Errorf("A's tool call through a fresh mount before re-admission: exit %d, %v; want this node was fenced", code, m)
	}
	if r := a.run("fence", "--readmit", "--node", nameA); r.code != 1 {
		t.Errorf("re-admission through the fenced mount: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	if r := a2.run("fence", "--readmit", "--node", nameA); r.code != 0 || !strings.Contains(string(r.stdout), "fresh client instance") {
		t.Fatalf("re-admission on A through a fresh mount: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	a2.mustTool(scope, "workspace_write", `{"path":"readmitted.txt","content":"A again, re-admitted"}`)

	// The control entry lapses at the monitor's next tick or so; A's
	// entry, pinned by the fence, stays.
	deadline := time.Now().Add(30 * time.Second)
	for {
		list, err := ceph.Blocklisted(ctx)
		if err != nil {
			t.Fatal(err)
		}
		until, ok := list[rec.Instances[0].Addr]
		if !ok {
			t.Fatalf("node A's blocklist entry is gone %s after the fence", time.Since(start).Round(time.Second))
		}
		if _, ok := list[control]; !ok {
			if until.Before(time.Now().Add(365 * 24 * time.Hour)) {
				t.Errorf("node A's entry lapses at %s, want years ahead", until)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the control entry did not lapse in 30 s with a %d s default expiry", shortExpire)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// TestNodeFenceReadyCheck: on CephFS, loomfs check --probe says whether loomfs
// fence could shut this node's mount out, and what is missing when not,
// as the mount's own ceph-fuse says over its admin socket.
func TestNodeFenceReadyCheck(t *testing.T) {
	conf := cephConf(t)
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Fatal(err)
	}
	tag := strconv.FormatInt(time.Now().UnixNano(), 36)
	meta := func(node string) string {
		return fmt.Sprintf("--client_metadata=%s=%s,%s=%s", fence.NodeKey, node, fence.BootKey, strings.TrimSpace(string(boot)))
	}
	tests := []struct {
		name    string
		node    string // this node, as loomfs names it
		options []string
		want    string // in fence_ready's detail; "" when it passes
	}{
		{"metadata names this node, reconnect off", "ready-" + tag, []string{meta("ready-" + tag), "--client_reconnect_stale=false"}, ""},
		{"no client metadata", "bare-" + tag, []string{"--client_reconnect_stale=false"}, "has no loomfs_node"},
		{"metadata names another node", "self-" + tag, []string{meta("other-" + tag), "--client_reconnect_stale=false"}, `names node "other-` + tag + `"`},
		{"stale reconnection on", "stale-" + tag, []string{meta("stale-" + tag), "--client_reconnect_stale=true"}, "client_reconnect_stale is on"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := mountCephFuse(t, conf, tc.options...)
			vol := filepath.Join(c.dir, "vol-"+tag)
			if err := os.Mkdir(vol, 0o700); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(vol) })
			if err := os.WriteFile(filepath.Join(vol, store.VolumeMarker), []byte(nodeVolume+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			n := &node{t: t, root: vol, volumeID: nodeVolume, dir: t.TempDir(), name: tc.node}
			r := n.run("--json", "check", "--probe")
			var rep store.CheckReport
			if err := json.Unmarshal(r.stdout, &rep); err != nil {
				t.Fatalf("check --probe: exit %d, %s %s", r.code, r.stdout, r.stderr)
			}
			var item *store.CheckItem
			for i, c := range rep.Checks {
				if c.Name == "fence_ready" {
					item = &rep.Checks[i]
				}
			}
			if item == nil {
				t.Fatalf("check --probe on ceph-fuse made no fence_ready check: %s", r.stdout)
			}
			if tc.want == "" {
				if !item.OK || !rep.Fenceable || !rep.OK || r.code != 0 {
					t.Errorf("check --probe: exit %d, fenceable %v, fence_ready %+v; want it to pass", r.code, rep.Fenceable, *item)
				}
				return
			}
			if item.OK || rep.Fenceable || rep.OK || r.code != 1 || !strings.Contains(item.Detail, tc.want) {
				t.Errorf("check --probe: exit %d, fenceable %v, fence_ready %+v; want it to fail saying %q", r.code, rep.Fenceable, *item, tc.want)
			}
		})
	}
}

// TestNodeFencedRefusesUntilReadmitted: a node the volume records as
// fenced serves nothing from it, even through a mount that works (a
// fresh one): its tool calls answer the fenced error and its mount is
// refused, saying how to re-admit it; only the administrator's re-admission
// (which needs the record, and audits) lets it serve again.
func TestNodeFencedRefusesUntilReadmitted(t *testing.T) {
	_, a, b := sharedVolume(t)
	a.name = "fenced-a-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	const scope = "acme/coder/readmit"
	a.mustTool(scope, "workspace_write", `{"path":"a.txt","content":"before the fence"}`)
	if r := b.run("fence", "--readmit", "--node", a.name); r.code != 1 || !strings.Contains(r.stderr, "no fence record") {
		t.Errorf("readmit of a node never fenced: exit %d %s", r.code, r.stderr)
	}
	if r := b.run("fence", "--node", a.name, "--confirm-fenced-externally", "--reason", "powered off"); r.code != 0 {
		t.Fatalf("fence --confirm-fenced-externally: exit %d %s %s", r.code, r.stdout, r.stderr)
	}

	m, code, err := a.tool(scope, "workspace_write", `{"path":"a.txt","content":"after the fence"}`)
	if err != nil {
		t.Fatal(err)
	}
	if errm, _ := m["error"].(map[string]any); code != 1 || errm["code"] != string(policy.VolumeUnavailable) || errm["message"] != policy.FencedMessage {
		t.Errorf("a fenced node's tool call: exit %d, %v; want volume_unavailable, this node was fenced", code, m)
	}
	mnt := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	mount := a.command("mount", "--scope", scope, mnt)
	mount = exec.CommandContext(ctx, mount.Path, mount.Args[1:]...)
	mount.Env, mount.Dir = a.command().Env, a.dir
	r := runCmd(t, mount)
	if isMounted(t, mnt) {
		unix.Unmount(mnt, unix.MNT_DETACH)
	}
	if r.code != 1 || !strings.Contains(r.stderr, "node "+a.name+" was fenced") || !strings.Contains(r.stderr, "fence --readmit --node "+a.name) {
		t.Errorf("a fenced node's mount: exit %d %s; want it refused, saying how to re-admit", r.code, r.stderr)
	}
	if m := b.mustTool(scope, "workspace_read", `{"path":"a.txt"}`); !strings.Contains(fmt.Sprint(m), "before the fence") {
		t.Errorf("a.txt as node B reads it: %v", m)
	}

	// The administrator re-admits A: from then on it serves again.
	if r := b.run("fence", "--readmit", "--node", a.name, "--reason", "replaced the disk"); r.code != 0 || !strings.Contains(string(r.stdout), "re-admitted") {
		t.Fatalf("readmit: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	if _, err := fence.Read(b.root, a.name); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the fence record after re-admission: %v", err)
	}
	a.mustTool(scope, "workspace_write", `{"path":"a.txt","content":"after re-admission"}`)
	r = b.run("--json", "audit", "query", "--op", "readmit")
	if r.code != 0 || !strings.Contains(string(r.stdout), `"fenced_by"`) || !strings.Contains(string(r.stdout), "replaced the disk") {
		t.Errorf("the re-admission in the audit: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
}

// nodeService is a node's loomfs serve on a shared volume, in
// directories of the test's own; it is stopped at cleanup.
type nodeService struct {
	n   *node
	env []string // the node's name and the service's socket
	cmd *exec.Cmd
	out *syncBuffer
}

func startNodeService(t *testing.T, n *node, args ...string) *nodeService {
	t.Helper()
	dir := t.TempDir()
	socket, mountDir := filepath.Join(dir, "sock", "serve.sock"), filepath.Join(dir, "mnt")
	t.Cleanup(func() { detachUnder(mountDir) })
	s := &nodeService{n: n, env: append(cliEnv(), nodeid.Env+"="+n.name, "AGENT_LOOM_SERVE_SOCKET="+socket), out: &syncBuffer{}}
	s.cmd = n.command(append([]string{"serve", "--socket", socket, "--mount-dir", mountDir}, args...)...)
	s.cmd.Env = s.env
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.cmd.Process.Signal(syscall.SIGTERM)
		s.cmd.Wait()
	})
	waitFor(t, "loomfs serve to listen", func() bool { return strings.Contains(s.out.String(), "serving processes") })
	return s
}

// run runs loomfs on the service's node, its calls going to the service.
func (s *nodeService) run(args ...string) result {
	s.n.t.Helper()
	cmd := s.n.command(args...)
	cmd.Env = s.env
	return runCmd(s.n.t, cmd)
}

func (s *nodeService) tool(scope, name, input string) (map[string]any, int) {
	s.n.t.Helper()
	r := s.run("tool", name, "--scope", scope, "--input", input)
	var m map[string]any
	json.Unmarshal(r.stdout, &m)
	return m, r.code
}

// TestNodeFencedStopsItsWork: once the volume records node A as fenced,
// A's loomfs serve fences itself within seconds: its session sandbox and
// the container of a one-shot command A's tool call is still running are
// removed, the service stays up and says so, A's calls are refused with
// the fenced error (its MCP session's too), and A's loomfs mount
// unmounts and exits. A's serve says so in /readyz and as
// loomfs_node_fenced, 0 before and 1 after, on a real scrape. Node B,
// taking over, sees A's process as lost, through its own service and
// without one.
func TestNodeFencedStopsItsWork(t *testing.T) {
	_, a, b := sharedVolume(t)
	// A fenced node removes every container the engine runs for it: its
	// name is the test's own, never one another test's containers carry.
	a.name = "fenced-a-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	const scope = "acme/coder/fenced-work"
	metricsA := freeAddr(t)
	sa, sb := startNodeService(t, a, "--metrics", metricsA), startNodeService(t, b)
	fencedSeries := func() string {
		t.Helper()
		return grepLines(promtoolCheck(t, metricsA), "loomfs_node_fenced")
	}
	if got := fencedSeries(); got != "loomfs_node_fenced 0" {
		t.Errorf("A's metrics before the fence: %q, want loomfs_node_fenced 0", got)
	}
	nodeContainers := func() []string {
		t.Helper()
		b, err := exec.Command("docker", "ps", "-aq", "--filter", "label=io.loomfs.node="+a.name).Output()
		if err != nil {
			t.Fatalf("docker ps: %v", err)
		}
		return strings.Fields(string(b))
	}
	t.Cleanup(func() {
		if ids := nodeContainers(); len(ids) > 0 {
			exec.Command("docker", append([]string{"rm", "-f"}, ids...)...).Run()
		}
	})

	m, code := sa.tool(scope, tools.ProcessStart, `{"command":"sleep 600","yield_ms":100}`)
	if code != 0 {
		t.Fatalf("process start on A: exit %d %v", code, m)
	}
	pid, _ := m["process_id"].(string)
	// A one-shot command, still running when the fence comes.
	ended := make(chan map[string]any, 1)
	go func() {
		cmd := a.command("tool", tools.Command, "--scope", scope+"-cmd", "--input", `{"command":"sleep 110","timeout_s":120}`)
		cmd.Env = sa.env
		var o bytes.Buffer
		cmd.Stdout = &o
		cmd.Run()
		var m map[string]any
		json.Unmarshal(o.Bytes(), &m)
		ended <- m
	}()
	slowly := func(cond func() bool) func() bool {
		return func() bool { time.Sleep(100 * time.Millisecond); return cond() }
	}
	waitFor(t, "A's session sandbox and command container", slowly(func() bool { return len(nodeContainers()) == 2 }))
	// And a loomfs mount of A's, serving the scope.
	mnt := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	mount := a.command("mount", "--scope", scope, mnt)
	mount.Env = sa.env
	mountOut := &syncBuffer{}
	mount.Stdout, mount.Stderr = mountOut, mountOut
	if err := mount.Start(); err != nil {
		t.Fatal(err)
	}
	mountEnded := make(chan error, 1)
	go func() { mountEnded <- mount.Wait() }()
	t.Cleanup(func() {
		mount.Process.Signal(syscall.SIGTERM)
		<-mountEnded
		if isMounted(t, mnt) {
			unix.Unmount(mnt, unix.MNT_DETACH)
		}
	})
	waitFor(t, "A's loomfs mount", func() bool { return strings.Contains(mountOut.String(), "mounted ") })
	// And an MCP session of A's.
	mcpCmd := a.command("mcp", "--scope", scope)
	mcpCmd.Env = sa.env
	mcpErr := &syncBuffer{}
	mcpCmd.Stderr = mcpErr
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "loomfs-test", Version: "1"}, nil).Connect(context.Background(), &mcp.CommandTransport{Command: mcpCmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	mcpWrite := func(content string) (isError bool, text string) {
		t.Helper()
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tools.Write, Arguments: map[string]any{"path": "mcp.txt", "content": content}})
		if err != nil {
			t.Fatalf("workspace_write over A's MCP: %v", err)
		}
		var txt strings.Builder
		for _, c := range res.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				txt.WriteString(tc.Text)
			}
		}
		return res.IsError, txt.String()
	}
	if isErr, txt := mcpWrite("before the fence"); isErr {
		t.Fatalf("workspace_write over A's MCP before the fence: %s", txt)
	}

	fenced := time.Now()
	if r := b.run("fence", "--node", a.name, "--confirm-fenced-externally", "--reason", "test"); r.code != 0 {
		t.Fatalf("fence: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	waitFor(t, "A's containers to be removed after its fence", slowly(func() bool { return len(nodeContainers()) == 0 }))
	gone := time.Since(fenced)
	waitFor(t, "A's serve to say it was fenced", func() bool { return strings.Contains(sa.out.String(), "FENCED") })
	if got := fencedSeries(); !strings.HasPrefix(got, "loomfs_node_fenced 1\nloomfs_node_fenced_timestamp_seconds ") {
		t.Errorf("A's metrics after the fence: %q, want loomfs_node_fenced 1 and its time", got)
	}
	if resp, err := http.Get("http://" + metricsA + "/readyz"); err != nil {
		t.Error(err)
	} else {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "fence") {
			t.Errorf("A's /readyz after the fence: %d %s, want 503 naming the fence", resp.StatusCode, body)
		}
	}
	if err := sa.cmd.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("A's serve ended after the fence: %v: %s", err, sa.out)
	}
	select {
	case err := <-mountEnded:
		mountEnded <- err // for the cleanup
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(mountOut.String(), "FENCED") || isMounted(t, mnt) {
			t.Errorf("A's mount after the fence: %v, mounted %v: %s", err, isMounted(t, mnt), mountOut)
		}
	case <-time.After(20 * time.Second):
		t.Errorf("A's mount still serves 20 s after the fence: %s", mountOut)
	}
	m, code = sa.tool(scope, tools.ProcessList, `{}`)
	if errm, _ := m["error"].(map[string]any); code != 1 || errm["message"] != policy.FencedMessage {
		t.Errorf("A's call after its fence: exit %d %v; want this node was fenced", code, m)
	}
	waitFor(t, "A's MCP session to say it was fenced", func() bool { return strings.Contains(mcpErr.String(), "FENCED") })
	if isErr, mcpSaw := mcpWrite("after the fence"); !isErr || !strings.Contains(mcpSaw, string(policy.VolumeUnavailable)) || !strings.Contains(mcpSaw, policy.FencedMessage) {
		t.Errorf("A's MCP call after the fence: %q; want volume_unavailable, this node was fenced", mcpSaw)
	}
	if m := b.mustTool(scope, "workspace_read", `{"path":"mcp.txt"}`); !strings.Contains(fmt.Sprint(m), "before the fence") {
		t.Errorf("mcp.txt as node B reads it: %v", m)
	}
	select {
	case m := <-ended:
		if errm, _ := m["error"].(map[string]any); errm["message"] != policy.FencedMessage {
			t.Errorf("A's one-shot command, its container removed by the fence, answered %v; want this node was fenced", m)
		}
	case <-time.After(30 * time.Second):
		t.Error("A's one-shot command still runs 30 s after its container was removed")
	}
	t.Logf("A's containers gone %s after the fence was recorded", gone.Round(time.Millisecond))

	// B takes over: A's process is lost, without a service and through
	// B's, which records it so; a call for it says why.
	lost := func(how string, procs []tools.ProcessInfo) {
		t.Helper()
		for _, p := range procs {
			if p.ProcessID == pid {
				if p.Status != tools.StatusLost || p.Ended == nil || !strings.Contains(p.Reason, "fenced") {
					t.Errorf("A's process %s: %+v; want lost, ended at the fence", how, p)
				}
				return
			}
		}
		t.Errorf("A's process %s is not listed: %+v", how, procs)
	}
	noService := b.command("--json", "processes", "list", "--scope", scope)
	noService.Env = append(noService.Env, "AGENT_LOOM_SERVE_SOCKET="+filepath.Join(t.TempDir(), "none.sock"))
	r := runCmd(t, noService)
	var procs []tools.ProcessInfo
	if r.code != 0 || json.Unmarshal(r.stdout, &procs) != nil {
		t.Fatalf("processes list on B without a service: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	lost("listed on B without a service", procs)
	var res tools.ProcessListResult
	m, code = sb.tool(scope, tools.ProcessList, `{}`)
	if b, _ := json.Marshal(m); code != 0 || json.Unmarshal(b, &res) != nil {
		t.Fatalf("workspace_process_list on B: exit %d %v", code, m)
	}
	lost("listed through B's service", res.Processes)
	var rec map[string]any
	if r := sb.run("processes", "show", "--scope", scope, pid); r.code != 0 || json.Unmarshal(r.stdout, &rec) != nil || rec["status"] != tools.StatusLost {
		t.Errorf("A's process record after B's listing: exit %d %s; want it recorded lost", r.code, r.stdout)
	}
	m, code = sb.tool(scope, tools.ProcessRead, `{"process_id":"`+pid+`"}`)
	if errm, _ := m["error"].(map[string]any); code != 1 || errm["code"] != string(policy.NotFound) || !strings.Contains(fmt.Sprint(errm["message"]), "fenced") {
		t.Errorf("B reading A's lost process: exit %d %v; want not_found saying A was fenced", code, m)
	}
}

// cephConf is the ceph.conf of scripts/cephfs's cluster; the test is
// skipped where there is none.
func cephConf(t *testing.T) string {
	t.Helper()
	if _, _, ok := dfsRoots(t); !ok {
		t.Skipf("needs CephFS: %s unset (make test-dfs, or scripts/cephfs up)", dfsRootsEnv)
	}
	state := os.Getenv(cephStateEnv)
	if state == "" {
		t.Skipf("%s unset: the test needs the cluster's ceph.conf", cephStateEnv)
	}
	return filepath.Join(state, "ceph.conf")
}

// cephCmd runs ceph on the cluster of conf and fails the test if it fails.
func cephCmd(t *testing.T, conf string, args ...string) {
	t.Helper()
	out, err := exec.Command("ceph", append([]string{"--conf", conf}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("ceph %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// TestNodeFencedQuarantineClear: once node A is fenced, node B clears in
// one step every quarantine A's commands left, and only those; before
// the fence it refuses. Where loomfs can't fence (not CephFS), the fence
// refuses and the operator's confirmation records it.
func TestNodeFencedQuarantineClear(t *testing.T) {
	_, a, b := sharedVolume(t)
	ctx := context.Background()
	vol, err := store.OpenVolume(ctx, store.Config{Backend: store.BackendSharedPOSIX, Root: a.root, VolumeID: a.volumeID})
	if err != nil {
		t.Fatal(err)
	}
	defer vol.Close()
	quarantine := func(scope, node, container string) {
		ws := openScope(t, vol, scope)
		if err := ws.Quarantine(store.Marker{Container: container, Node: node, Time: time.Now()}, "its worker died"); err != nil {
			t.Fatal(err)
		}
	}
	quarantine("acme/coder/s1", a.name, "loomfs-a1")
	quarantine("acme/coder/s2", a.name, "loomfs-a2")
	quarantine("acme/coder/s3", "node-c", "loomfs-c1")
	listed := func() []string {
		t.Helper()
		r := b.run("--json", "quarantine", "list")
		var ms []store.Marker
		if r.code != 0 || json.Unmarshal(r.stdout, &ms) != nil {
			t.Fatalf("quarantine list: exit %d %s %s", r.code, r.stdout, r.stderr)
		}
		var scopes []string
		for _, m := range ms {
			scopes = append(scopes, m.Scope)
		}
		return scopes
	}

	if r := b.run("quarantine", "clear", "--fenced-node", a.name); r.code == 0 || !strings.Contains(r.stderr, "fence it first") {
		t.Errorf("clear --fenced-node before the fence: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	if got := listed(); len(got) != 3 {
		t.Fatalf("quarantines after a refused clear: %v, want all three", got)
	}
	if _, _, onCeph := dfsRoots(t); !onCeph {
		r := b.run("fence", "--node", a.name)
		if r.code == 0 || !strings.Contains(r.stderr, "can't fence") || !strings.Contains(r.stderr, "--confirm-fenced-externally") {
			t.Errorf("fence on a volume loomfs can't fence: exit %d %s %s", r.code, r.stdout, r.stderr)
		}
	}
	if r := b.run("fence", "--node", a.name, "--confirm-fenced-externally", "--reason", "powered off"); r.code != 0 {
		t.Fatalf("fence --confirm-fenced-externally: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	if r := b.run("quarantine", "clear", "--fenced-node", a.name); r.code != 0 || !strings.Contains(string(r.stdout), "2 quarantine(s)") {
		t.Fatalf("clear --fenced-node: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	if got := listed(); len(got) != 1 || got[0] != "acme/coder/s3" {
		t.Errorf("quarantines after the fenced node's were cleared: %v, want node-c's alone", got)
	}
	if r := b.run("quarantine", "clear", "--fenced-node", a.name, "--scope", "acme/coder/s3"); r.code == 0 {
		t.Error("clear --fenced-node with --scope was accepted")
	}
}

// TestNodeFencedLateAuditIgnored: a fence the operator confirmed where
// node A was in fact still writing (the storage could not refuse it): an
// audit writer of A's that opened before the fence appends after it.
// Through node B's loomfs, audit query skips those records and audit
// verify still checks them and says how many lines A wrote after its
// fence, in which files; A's records from before the fence, and B's, are
// read as ever. Once A is re-admitted, its new records are read again.
func TestNodeFencedLateAuditIgnored(t *testing.T) {
	_, a, b := sharedVolume(t)
	a.name = "late-a-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	const scope = "acme/coder/late-audit"
	a.mustTool(scope, "workspace_write", `{"path":"before.txt","content":"A before its fence"}`)
	// A's writer that froze with its log open, before the fence.
	late, err := audit.Open(a.root, audit.Options{Node: a.name})
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	if r := b.run("fence", "--node", a.name, "--confirm-fenced-externally", "--reason", "test: still writing"); r.code != 0 {
		t.Fatalf("fence: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	b.mustTool(scope, "workspace_write", `{"path":"b.txt","content":"B after the fence"}`)
	for i := range 3 {
		if err := late.Record(context.Background(), audit.Event{Source: audit.SourceTool, Op: "workspace_write", Result: "ok", Path: fmt.Sprintf("late-%d.txt", i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := late.Close(); err != nil {
		t.Fatal(err)
	}
	paths := func() map[string]bool {
		t.Helper()
		r := b.run("--json", "audit", "query", "--node", a.name)
		if r.code != 0 {
			t.Fatalf("audit query: exit %d %s", r.code, r.stderr)
		}
		seen := map[string]bool{}
		for _, l := range bytes.Split(bytes.TrimSpace(r.stdout), []byte("\n")) {
			var rec audit.Record
			if json.Unmarshal(l, &rec) == nil {
				seen[rec.Path] = true
			}
		}
		return seen
	}
	if seen := paths(); !seen["before.txt"] || seen["late-0.txt"] || seen["late-2.txt"] {
		t.Errorf("A's records through B's audit query after the fence: %v; want before.txt and none of the late ones", seen)
	}
	verify := func() audit.Report {
		t.Helper()
		r := b.run("--json", "audit", "verify", "--allow-crashed")
		var rep audit.Report
		if err := json.Unmarshal(r.stdout, &rep); err != nil {
			t.Fatalf("audit verify: exit %d %v %s %s", r.code, err, r.stdout, r.stderr)
		}
		if !rep.OK() || r.code != 0 {
			t.Errorf("audit verify: exit %d, problems %v", r.code, rep.Problems)
		}
		return rep
	}
	rep := verify()
	// Three events, and the writer's close in A's ledger (it opened
	// before the fence).
	if len(rep.Fenced) != 1 || rep.Fenced[0].Node != a.name || !rep.Fenced[0].InForce || rep.Fenced[0].LateRecords != 4 || len(rep.Fenced[0].LateFiles) != 2 {
		t.Errorf("audit verify's account of A: %+v; want its late events and ledger entries, in its chain file and its ledger", rep.Fenced)
	}
	said := false
	for _, w := range rep.Warnings {
		said = said || strings.Contains(w.Message, "node "+a.name+" was fenced")
	}
	if !said {
		t.Errorf("audit verify's warnings do not name A's late lines: %v", rep.Warnings)
	}

	// Re-admitted, A writes again and is read again; what it wrote while
	// fenced stays skipped.
	if r := b.run("fence", "--readmit", "--node", a.name); r.code != 0 {
		t.Fatalf("readmit: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	a.mustTool(scope, "workspace_write", `{"path":"readmitted.txt","content":"A again"}`)
	if seen := paths(); !seen["before.txt"] || !seen["readmitted.txt"] || seen["late-1.txt"] {
		t.Errorf("A's records after its re-admission: %v; want before.txt and readmitted.txt, none of the late ones", seen)
	}
	if rep := verify(); len(rep.Fenced) != 1 || rep.Fenced[0].InForce || rep.Fenced[0].LateRecords != 4 {
		t.Errorf("audit verify after A's re-admission: %+v", rep.Fenced)
	}
}

// TestNodeFencedLateRecordsIgnored: a fence the operator confirmed where
// node A was in fact still writing (the storage could not refuse it): a
// Workspace of A's opened before the fence finishes a call, writes a
// file and leaves a marker after it. Through node B's loomfs, the call A
// finished late answers unknown_outcome as a call only started does, a
// call A finished before the fence replays, and A's late marker refuses
// nothing. The fence's record says what it marked.
func TestNodeFencedLateRecordsIgnored(t *testing.T) {
	_, a, b := sharedVolume(t)
	a.name = "late-r-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	const scope, other = "acme/coder/late-records", "acme/coder/late-marker"
	ctx := context.Background()
	in := func(file string) string { return `{"path":"` + file + `","content":"x"}` }
	if r := a.run("tool", "workspace_write", "--scope", scope, "--call-id", "c-1", "--input", in("one.txt")); r.code != 0 {
		t.Fatalf("A's call c-1: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	// A's worker that froze with its scopes open, before the fence.
	t.Setenv(nodeid.Env, a.name)
	vol, err := store.OpenVolume(ctx, store.Config{Backend: store.BackendSharedPOSIX, Root: a.root, VolumeID: a.volumeID})
	if err != nil {
		t.Fatal(err)
	}
	defer vol.Close()
	ws, wsOther := openScope(t, vol, scope), openScope(t, vol, other)
	if rec, err := ws.BeginCall(ctx, "c-2", "workspace_write", []byte(in("two.txt"))); err != nil || rec != nil {
		t.Fatalf("A begins c-2: %+v %v", rec, err)
	}

	r := b.run("--json", "fence", "--node", a.name, "--confirm-fenced-externally", "--reason", "test: still writing")
	var rec fence.Record
	if r.code != 0 || json.Unmarshal(r.stdout, &rec) != nil {
		t.Fatalf("fence: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	if rec.CallLogsMarked == 0 || rec.JournalsMarked == 0 || rec.MarkerScopes != 0 {
		t.Errorf("the fence's record: %d call logs, %d journal files, %d scopes with a marker; want A's call logs and journal files marked, no marker", rec.CallLogsMarked, rec.JournalsMarked, rec.MarkerScopes)
	}

	// A wakes up and writes on.
	if _, err := ws.WriteFile(ctx, "two.txt", []byte("x"), nil); err != nil {
		t.Fatal(err)
	}
	if err := ws.FinishCall("c-2", "workspace_write", []byte(in("two.txt")), json.RawMessage(`{"bytes":1}`), nil); err != nil {
		t.Fatal(err)
	}
	if err := wsOther.SetMarker(store.Marker{Container: "loomfs-late", Node: a.name, Time: time.Now()}); err != nil {
		t.Fatal(err)
	}

	if r := b.run("tool", "workspace_write", "--scope", scope, "--call-id", "c-1", "--input", in("one.txt")); r.code != 0 {
		t.Errorf("B replays c-1, done before the fence: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	var m map[string]any
	r = b.run("tool", "workspace_write", "--scope", scope, "--call-id", "c-2", "--input", in("two.txt"))
	json.Unmarshal(r.stdout, &m)
	if errm, _ := m["error"].(map[string]any); r.code == 0 || errm["code"] != string(policy.UnknownOutcome) {
		t.Errorf("B replays c-2, done only after the fence: exit %d %s %s; want unknown_outcome", r.code, r.stdout, r.stderr)
	}
	if r := b.run("--json", "quarantine", "list"); r.code != 0 || strings.TrimSpace(string(r.stdout)) != "[]" {
		t.Errorf("quarantine list: exit %d %s %s; want none", r.code, r.stdout, r.stderr)
	}
	b.mustTool(other, "workspace_write", in("b.txt"))
	if r := b.run("--json", "quarantine", "list"); r.code != 0 || strings.TrimSpace(string(r.stdout)) != "[]" {
		t.Errorf("quarantine list after B's write where A left a late marker: exit %d %s %s; want none", r.code, r.stdout, r.stderr)
	}
}

// openScope opens scope on vol in this process, closed when the test
// ends.
func openScope(t *testing.T, vol *store.Volume, scope string) *store.Workspace {
	t.Helper()
	sc, err := store.ParseScope(scope)
	if err != nil {
		t.Fatal(err)
	}
	ws, err := vol.Open(context.Background(), sc, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	return ws
}
