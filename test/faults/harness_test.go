package faults

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// scope is the scope every cell works on, in a root of its own. Its
// session id is this process's, so that two runs of the matrix on one
// node never take each other's containers for their own.
var scope = fmt.Sprintf("faults/agent/s%d", os.Getpid())

var (
	loomfsBin string
	// full runs the whole matrix (LOOMFS_FAULTS=full), not the CI slice.
	full bool
)

func TestMain(m *testing.M) {
	if h := os.Getenv("LOOMFS_FAULTS_HELPER"); h != "" {
		os.Exit(helper(h, os.Args[1:]))
	}
	full = os.Getenv("LOOMFS_FAULTS") == "full"
	loomfsBin = os.Getenv("LOOMFS_BIN")
	var dir string
	if loomfsBin == "" {
		var err error
		dir, err = os.MkdirTemp("", "loomfs-faults-")
		if err != nil {
			panic(err)
		}
		loomfsBin = filepath.Join(dir, "loomfs")
		build := exec.Command("go", "build", "-o", loomfsBin, "../../cmd/loomfs")
		build.Stdout, build.Stderr = os.Stdout, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "build loomfs:", err)
			os.Exit(1)
		}
	}
	unmountCtl := mountFusectl()
	code := m.Run()
	unmountCtl()
	tally.print()
	if dir != "" {
		os.RemoveAll(dir)
	}
	os.Exit(code)
}

// mountFusectl mounts the FUSE control filesystem if it is not, so that a
// connection a killed daemon leaves stuck can be seen and aborted, and
// returns what undoes it.
func mountFusectl() func() {
	if ents, err := os.ReadDir(fusectl); err != nil || len(ents) > 0 || mounted(fusectl) {
		return func() {}
	}
	if exec.Command("mount", "-t", "fusectl", "none", fusectl).Run() != nil {
		return func() {}
	}
	return func() { exec.Command("umount", fusectl).Run() }
}

// fault is what strace injects into a process: an errno, or SIGKILL, at
// the when-th call of one system call. strace counts per thread, so every
// thread that reaches its when-th call of it gets the fault.
type fault struct {
	syscall string
	errno   string // "" for a kill
	when    int
}

func (f fault) kill() bool { return f.errno == "" }

// inject is the fault as strace's -e inject= spells it.
func (f fault) inject() string {
	if f.kill() {
		return fmt.Sprintf("%s:signal=KILL:when=%d", f.syscall, f.when)
	}
	return fmt.Sprintf("%s:error=%s:when=%d", f.syscall, f.errno, f.when)
}

// name is the cell's subtest name: -run '/openat_ENOSPC_3$' reruns it.
func (f fault) name() string {
	e := f.errno
	if f.kill() {
		e = "KILL"
	}
	return fmt.Sprintf("%s_%s_%d", f.syscall, e, f.when)
}

// syscalls are the calls that change the volume; faults go into these.
var syscalls = []string{"write", "pwrite64", "fsync", "fdatasync", "openat", "openat2", "renameat2", "linkat", "mkdirat", "fallocate", "ftruncate", "unlinkat"}

var errnos = []string{"ENOSPC", "EIO", "EDQUOT", "EMFILE", "EINTR"}

// sliceErrno is the one errno the CI slice injects into each call: the
// one that call meets most on a failing volume.
var sliceErrno = map[string]string{
	"write": "ENOSPC", "pwrite64": "ENOSPC", "fallocate": "ENOSPC", "ftruncate": "EDQUOT",
	"fsync": "EIO", "fdatasync": "EIO",
	"openat": "EMFILE", "openat2": "ENOSPC",
	"renameat2": "EDQUOT", "linkat": "EDQUOT", "mkdirat": "ENOSPC",
	"unlinkat": "EINTR",
}

// outcome is how a process ended.
type outcome struct {
	exit   int    // exit status, -1 when killed by a signal
	signal string // the signal that ended it, if one did
	stdout string
	stderr string
	hung   bool // it did not end within its budget and was killed
}

func (o outcome) String() string {
	s := fmt.Sprintf("exit %d", o.exit)
	if o.signal != "" {
		s = "killed by " + o.signal
	}
	if o.hung {
		s = "hung (killed at the end of its budget)"
	}
	return fmt.Sprintf("%s, stdout %q, stderr %q", s, clip(o.stdout), clip(o.stderr))
}

func clip(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 600 {
		return s[:600] + "…"
	}
	return s
}

// cell is one run of one operation with one fault, in a root of its own.
type cell struct {
	t      *testing.T
	dir    string // scratch, outside the root
	root   string // the workspace root
	policy string // policy file, if the operation needs one
	f      *fault // nil: no fault (setup, checks, counting)
	log    string // strace's output for the traced process
	ack    bool   // the operation said it was done (exit 0, a result)
}

func newCell(t *testing.T) *cell {
	dir := t.TempDir()
	c := &cell{t: t, dir: dir, root: filepath.Join(dir, "root"), log: filepath.Join(dir, "strace.log")}
	if err := os.Mkdir(c.root, 0o700); err != nil {
		t.Fatal(err)
	}
	return c
}

// env is a clean environment: nothing of the test's own leaks in.
func env() []string {
	return []string{"PATH=" + os.Getenv("PATH"), "AGENT_LOOM_SANDBOX_RUNTIME=" + os.Getenv("AGENT_LOOM_SANDBOX_RUNTIME")}
}

// args are loomfs's global flags for this cell, then the command's.
func (c *cell) args(cmd ...string) []string {
	a := []string{"--root", c.root}
	if c.policy != "" {
		a = append(a, "--policy", c.policy)
	}
	return append(a, cmd...)
}

// plain is loomfs without a fault.
func (c *cell) plain(cmd ...string) *exec.Cmd {
	x := exec.Command(loomfsBin, c.args(cmd...)...)
	x.Env = env()
	return x
}

// traced is loomfs under strace with the cell's fault (or, for the
// counting run, tracing the calls faults go into).
func (c *cell) traced(cmd ...string) *exec.Cmd {
	return c.tracedExec(loomfsBin, c.args(cmd...)...)
}

func (c *cell) tracedExec(bin string, args ...string) *exec.Cmd {
	s := []string{"-f", "-qq", "-y", "-o", c.log}
	if c.f != nil {
		s = append(s, "-e", "trace="+c.f.syscall, "-e", "inject="+c.f.inject())
	} else {
		s = append(s, "-e", "trace="+strings.Join(syscalls, ","))
	}
	x := exec.Command("strace", append(append(s, bin), args...)...)
	x.Env = env()
	return x
}

// run runs x to its end or its budget, in a process group of its own so
// that a hang is ended whole.
func run(x *exec.Cmd, stdin string, budget time.Duration) outcome {
	var out, errb bytes.Buffer
	x.Stdout, x.Stderr = &out, &errb
	x.Stdin = strings.NewReader(stdin)
	x.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	x.WaitDelay = 5 * time.Second // a stuck thread of a killed process may hold its pipes
	if err := x.Start(); err != nil {
		return outcome{exit: -1, stderr: "start: " + err.Error()}
	}
	done := make(chan error, 1)
	go func() { done <- x.Wait() }()
	var o outcome
	select {
	case <-done:
	case <-time.After(budget):
		o.hung = true
		syscall.Kill(-x.Process.Pid, syscall.SIGKILL)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			// Killed, and still not gone: a thread sleeps in the kernel
			// uninterruptibly (a FUSE request no daemon will answer).
			return outcome{exit: -1, signal: "none (unkillable: a thread waits in the kernel)", hung: true}
		}
	}
	o.stdout, o.stderr = out.String(), errb.String()
	ws := x.ProcessState.Sys().(syscall.WaitStatus)
	switch {
	case ws.Signaled():
		o.exit, o.signal = -1, ws.Signal().String()
	default:
		o.exit = ws.ExitStatus()
	}
	return o
}

// must runs loomfs without a fault and fails the cell unless it exits 0.
func (c *cell) must(stdin string, cmd ...string) string {
	c.t.Helper()
	o := run(c.plain(cmd...), stdin, time.Minute)
	if o.exit != 0 {
		c.t.Fatalf("setup: loomfs %s: %s", strings.Join(cmd, " "), o)
	}
	return o.stdout
}

// tool runs one tool without a fault.
func (c *cell) tool(name string, input any) outcome {
	b, _ := json.Marshal(input)
	return run(c.plain("tool", name, "--scope", scope, "--input", string(b), "--timeout", "20s"), "", time.Minute)
}

// fired reports whether strace injected the cell's fault.
func (c *cell) fired() bool {
	b, _ := os.ReadFile(c.log)
	if c.f.kill() {
		return bytes.Contains(b, []byte("killed by SIGKILL"))
	}
	return bytes.Contains(b, []byte("(INJECTED)"))
}

var (
	unfinished = regexp.MustCompile(`^(\d+) +(.*) <unfinished \.\.\.>$`)
	resumed    = regexp.MustCompile(`^(\d+) +<\.\.\. [a-z0-9_]+ resumed>(.*)$`)
)

// calls reads the cell's strace log with each call on one line. With
// several threads traced into one log, strace cuts a call that another
// thread's line interrupts in two ("… <unfinished ...>" and "<... write
// resumed>) = -1 ENOSPC … (INJECTED)"); only the first half names the
// descriptor, only the second the fault, so the halves are joined.
func (c *cell) calls() []byte {
	b, _ := os.ReadFile(c.log)
	return joinResumed(b)
}

func joinResumed(b []byte) []byte {
	pending := map[string]string{} // thread → its unfinished call
	var out bytes.Buffer
	for _, l := range strings.Split(string(b), "\n") {
		if m := unfinished.FindStringSubmatch(l); m != nil {
			pending[m[1]] = m[2]
			continue
		}
		if m := resumed.FindStringSubmatch(l); m != nil {
			if call, ok := pending[m[1]]; ok {
				delete(pending, m[1])
				l = m[1] + " " + call + m[2]
			}
		}
		out.WriteString(l + "\n")
	}
	for pid, call := range pending {
		out.WriteString(pid + " " + call + " <unfinished ...>\n")
	}
	return out.Bytes()
}

// injected lists the calls strace failed on purpose, as its log shows
// them (the first ten): where a failing cell's fault landed.
func (c *cell) injected() []string {
	b := c.calls()
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "(INJECTED)") {
			lines = append(lines, l)
		}
	}
	return lines[:min(len(lines), 10)]
}

var injectedOnOutput = regexp.MustCompile(`(?m)^\d+ +write\([12]<[^>]*>.*\(INJECTED\)$`)

// outputLost reports whether the fault hit a write to the process's own
// stdout or stderr: what it answered did not reach the caller, through
// no fault of its own (a pipe never answers ENOSPC or EIO), so a missing
// answer or message is the fault's, not loomfs's.
func (c *cell) outputLost() bool {
	if c.f == nil || c.f.kill() {
		return false
	}
	return injectedOnOutput.Match(c.calls())
}

var injectedOnFD = regexp.MustCompile(`(?m)^\d+ +(write|pwrite64|fsync|fdatasync|ftruncate|fallocate)\(\d+<([^>]*)>.*\(INJECTED\)$`)

// offVolume reports whether the fault hit only descriptors that are not
// files (a pipe to the caller, the Go runtime's eventfd, a socket, a
// device): no volume answers there, and an errno such as ENOSPC from an
// eventfd is one the kernel never gives, so the cell says nothing about
// loomfs's handling of its storage. A write to the caller's stdout is one.
func (c *cell) offVolume() bool {
	if c.f == nil || c.f.kill() {
		return false
	}
	ms := injectedOnFD.FindAllSubmatch(c.calls(), -1)
	if len(ms) == 0 {
		return false
	}
	for _, m := range ms {
		p := string(m[2])
		if strings.HasPrefix(p, "/") && !strings.HasPrefix(p, "/dev/") && !strings.HasPrefix(p, "/proc/") {
			return false
		}
	}
	return true
}

var callLine = regexp.MustCompile(`^(\d+) +([a-z0-9_]+)\(`)

// counts reads a counting run's log: the most calls of each system call
// that one thread made, the range of a fault's when=.
func counts(log string) (map[string]int, error) {
	f, err := os.Open(log)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	per := map[string]int{} // pid/syscall → calls
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := callLine.FindStringSubmatch(sc.Text())
		if m != nil {
			per[m[1]+"/"+m[2]]++
		}
	}
	most := map[string]int{}
	for k, n := range per {
		name := k[strings.IndexByte(k, '/')+1:]
		most[name] = max(most[name], n)
	}
	return most, sc.Err()
}

// crashed names a crash in how a process ended: a signal it did not get
// from the fault, a Go runtime trace, a panic, or the usage exit status.
func crashed(o outcome, killed bool) string {
	switch {
	case o.hung:
		return "no answer within its budget (hang)"
	case o.signal != "" && !(killed && o.signal == "killed"):
		return "ended by signal " + o.signal
	case strings.Contains(o.stderr, "fatal error"), strings.Contains(o.stderr, "panic:"),
		strings.Contains(o.stderr, "SIGBUS"), strings.Contains(o.stderr, "goroutine "):
		return "Go runtime crash in stderr"
	case o.exit == 2:
		return "exit 2 (a usage error, or the Go runtime's crash status)"
	}
	return ""
}

// answer checks a tool's answer: a JSON result with exit 0, or a JSON
// error with a code and exit 1. It returns the error code ("" for a result).
func answer(o outcome) (code string, problem string) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(o.stdout), &m); err != nil {
		return "", fmt.Sprintf("the answer is not JSON (%s)", o)
	}
	e, isErr := m["error"]
	switch {
	case o.exit == 0 && !isErr:
		return "", ""
	case o.exit == 1 && isErr:
		var ev struct{ Code, Message string }
		if err := json.Unmarshal(e, &ev); err != nil || ev.Code == "" || ev.Message == "" {
			return "", fmt.Sprintf("an error without code and message (%s)", o)
		}
		if strings.Contains(ev.Message, "/") && strings.Contains(ev.Message, "/tmp/") {
			return ev.Code, fmt.Sprintf("the message shows a host path: %q", ev.Message)
		}
		return ev.Code, ""
	}
	return "", fmt.Sprintf("exit status and answer disagree (%s)", o)
}

// main is the scope's directory in the backing store.
func (c *cell) main() string {
	p := strings.Split(scope, "/")
	return filepath.Join(c.root, "spaces", p[0], "agents", p[1], "sessions", p[2], "main")
}

// tree is the scope's content as the backing store holds it: each file's
// content, "/" for a directory. Hidden temporary names are left out (the
// glob check looks for them where an agent looks).
type tree map[string]string

func (c *cell) tree() tree {
	t := tree{}
	filepath.WalkDir(c.main(), func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == c.main() {
			return nil
		}
		rel, _ := filepath.Rel(c.main(), p)
		if strings.HasPrefix(d.Name(), ".agentloom-") {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			t[rel] = "/"
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t[rel] = "unreadable: " + err.Error()
			return nil
		}
		t[rel] = string(b)
		return nil
	})
	return t
}

func (t tree) String() string {
	keys := make([]string, 0, len(t))
	for k := range t {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%q ", k, clip(t[k]))
	}
	return "{" + strings.TrimSpace(b.String()) + "}"
}

func (t tree) equal(u tree) bool {
	if len(t) != len(u) {
		return false
	}
	for k, v := range t {
		if w, ok := u[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// scopeHeld checks what every cell must leave behind: nothing temporary
// in an agent's sight, the scope free for the next call, the quota
// account equal to a walk, and the audit chain intact. It returns the
// problems found.
func (c *cell) scopeHeld() []string {
	var bad []string
	o := c.tool("workspace_glob", map[string]any{"pattern": "**", "limit": 1000})
	if o.exit != 0 {
		bad = append(bad, "glob after the fault: "+o.String())
	} else if strings.Contains(o.stdout, ".agentloom") {
		bad = append(bad, "a temporary file is in an agent's sight: "+clip(o.stdout))
	}
	probe := map[string]any{"path": "faults-probe.txt", "content": "probe\n"}
	if o := c.tool("workspace_write", probe); o.exit != 0 {
		bad = append(bad, "the next call on the scope failed: "+o.String())
	} else if o := c.tool("workspace_delete", map[string]any{"path": "faults-probe.txt"}); o.exit != 0 {
		bad = append(bad, "the next delete on the scope failed: "+o.String())
	}
	bad = append(bad, c.quotaHeld()...)
	bad = append(bad, c.auditHeld()...)
	return bad
}

// quotaHeld compares the scope's quota account with a walk (check --scope),
// after a reconcile if they differ: a process that ends (or is killed)
// between its change and its account's update leaves the difference to
// the next reconcile, which a mount runs (--reconcile). The mount is given
// reconcileStart to start and reconcileWait to correct the account (it
// logs each correction): a reconcile corrects only once the mount's own
// start-up probe has gone idle (twice quota.Options.Idle) and two walks
// agree, and on a loaded node the mount alone may take longer than 10 s
// to start. A mount stopped before it corrected anything reconciled
// nothing, and the judge says so rather than blame the account.
func (c *cell) quotaHeld() []string {
	if c.quotaDiff() == "" {
		return nil
	}
	mnt := filepath.Join(c.dir, "reconcile")
	os.Mkdir(mnt, 0o755)
	d, ready := startMountWithin(c.plain("mount", "--scope", scope, "--reconcile", "200ms", mnt), mnt, reconcileStart)
	corrected := false
	for end := time.Now().Add(reconcileWait); ready && !corrected && time.Now().Before(end); {
		select {
		case <-d.done:
			ready = false
		case <-time.After(50 * time.Millisecond):
		}
		corrected = strings.Contains(d.stderr.String(), "quota account corrected")
	}
	o := d.stop(30 * time.Second)
	if o.exit != 0 {
		return []string{"the reconciling mount: " + o.String()}
	}
	if d := c.quotaDiff(); d != "" {
		if !corrected {
			return []string{fmt.Sprintf("the quota account is not a walk of the scope, and a mount reconciling every 200ms corrected nothing in %v: %s (mount: %s)", reconcileWait, d, o)}
		}
		return []string{"the quota account is not a walk of the scope after a reconcile: " + d}
	}
	return nil
}

// How long quotaHeld's reconciling mount is given to start, and then to
// correct the account.
var (
	reconcileStart = time.Minute
	reconcileWait  = 30 * time.Second
)

// quotaDiff is what check --scope says when the account is not a walk.
func (c *cell) quotaDiff() string {
	o := run(c.plain("--json", "check", "--scope", scope), "", time.Minute)
	var r struct {
		Quota *struct {
			OK     bool   `json:"ok"`
			Match  bool   `json:"match"`
			Detail string `json:"detail"`
		} `json:"quota"`
	}
	if err := json.Unmarshal([]byte(o.stdout), &r); err != nil || r.Quota == nil {
		return "check --scope: " + o.String()
	}
	if !r.Quota.OK {
		return r.Quota.Detail
	}
	return ""
}

// auditHeld runs audit verify, allowing writers the fault ended.
func (c *cell) auditHeld() []string {
	if _, err := os.Stat(filepath.Join(c.root, ".agentloom-audit")); err != nil {
		return nil // nothing was audited yet (the fault stopped the first writer early)
	}
	o := run(c.plain("audit", "verify", "--allow-crashed"), "", time.Minute)
	if o.exit != 0 || crashed(o, false) != "" {
		return []string{"audit verify --allow-crashed: " + o.String()}
	}
	return nil
}

// mounted reports whether dir is a mount point in this namespace.
func mounted(dir string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && unescapeMount(f[4]) == dir {
			return true
		}
	}
	return false
}

func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// detach lazily unmounts dir if something is mounted there.
func detach(dir string) {
	if mounted(dir) {
		exec.Command("umount", "-l", dir).Run()
	}
}

// detachUnder detaches every mount below dir, deepest first: what a cell
// that is not judged leaves (a daemon the fault ended beside its own
// mount), which would otherwise outlive the test and fail its cleanup.
func detachUnder(dir string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var under []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(unescapeMount(f[4]), dir+"/") {
			under = append(under, unescapeMount(f[4]))
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(under)))
	for _, m := range under {
		exec.Command("umount", "-l", m).Run()
	}
}

// results counts cells per door and matrix: run (the fault fired) and
// holding (every invariant held).
type results struct {
	mu    sync.Mutex
	cells map[string]*[2]int // "matrix door" → run, holding
	codes map[string]int     // "door errno → code" → cells
}

var tally = &results{cells: map[string]*[2]int{}, codes: map[string]int{}}

func (r *results) add(matrix, door string, held bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := matrix + "\t" + door
	if r.cells[k] == nil {
		r.cells[k] = new([2]int)
	}
	r.cells[k][0]++
	if held {
		r.cells[k][1]++
	}
}

func (r *results) code(door, errno, code string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.codes[door+"\t"+errno+"\t"+code]++
}

// print writes the table RELIABILITY.md is made from.
func (r *results) print() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.cells) == 0 {
		return
	}
	keys := make([]string, 0, len(r.cells))
	for k := range r.cells {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	fmt.Println("faults: matrix\tdoor\tcells run\tcells holding")
	for _, k := range keys {
		fmt.Printf("faults: %s\t%d\t%d\n", k, r.cells[k][0], r.cells[k][1])
	}
	keys = keys[:0]
	for k := range r.codes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	fmt.Println("faults: door\tinjected\tanswer code\tcells")
	for _, k := range keys {
		fmt.Printf("faults: %s\t%d\n", k, r.codes[k])
	}
}
