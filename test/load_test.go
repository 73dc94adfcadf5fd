package test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentloom/loomfs/loom"
	"github.com/agentloom/loomfs/nodeid"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/sandbox"
	"github.com/agentloom/loomfs/store"
	"github.com/agentloom/loomfs/tools"
)

// TestBusyNodeNoFalseQuarantine is the shell loop of the busy-worker issue:
// 20 scopes, each with two commands and two tool writes at once, 80 loomfs
// processes on one node. Every call succeeds, no scope is quarantined, and
// no call tells its user of another call's container: a new container's
// namespace takes a copy of every projection mounted at the moment, which
// made projections look held after their own container was gone, and
// other calls' containers looked orphaned.
func TestBusyNodeNoFalseQuarantine(t *testing.T) {
	c := newCLI(t)
	type call struct {
		what string
		args []string
	}
	var calls []call
	var scopes []string
	for s := 1; s <= 20; s++ {
		scope := fmt.Sprintf("busy/a/s%d", s)
		scopes = append(scopes, scope)
		for k := 1; k <= 2; k++ {
			calls = append(calls,
				call{scope + " run", []string{"run", "--scope", scope, "--", "sh", "-c", fmt.Sprintf("echo c%d >> log.txt", k)}},
				call{scope + " write", []string{"tool", "workspace_write", "--scope", scope, "--input", fmt.Sprintf(`{"path":"t%d.txt","content":"w%d"}`, k, k)}})
		}
	}
	var wg sync.WaitGroup
	errs := make([]string, len(calls))
	var retried atomic.Int32
	for i, cl := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A call that waited the whole lock wait behind its scope's
			// commands (a host loaded by more than this test) is told to
			// retry later, and does, once.
			for try := 0; try < 2; try++ {
				cmd := exec.Command(loomfsBin, append([]string{"--root", c.root}, cl.args...)...)
				cmd.Env = cliEnv()
				var out, stderr bytes.Buffer
				cmd.Stdout, cmd.Stderr = &out, &stderr
				err := cmd.Run()
				said := ownLines(stderr.String(), "busy/")
				if err != nil && try == 0 && strings.Contains(out.String()+said, "is busy (another write or command holds its lock") {
					retried.Add(1)
					continue
				}
				if err != nil || said != "" {
					errs[i] = fmt.Sprintf("%s: %v: %s %s", cl.what, err, out.Bytes(), said)
				}
				break
			}
		}()
	}
	wg.Wait()
	if n := retried.Load(); n > 0 {
		t.Logf("%d calls waited out the scope lock wait and were retried", n)
	}
	failed := 0
	for _, e := range errs {
		if e != "" {
			failed++
			if failed <= 5 {
				t.Error(e)
			}
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d calls failed or wrote to stderr", failed, len(calls))
	}
	if r := c.run("", "--json", "quarantine", "list"); strings.TrimSpace(string(r.stdout)) != "[]" {
		t.Errorf("quarantined: %s %s", r.stdout, r.stderr)
	}
	for s := 1; s <= 20; s++ {
		if left := loomfsContainers(t, fmt.Sprintf("busy/a/s%d", s)); len(left) != 0 {
			t.Errorf("s%d: containers left: %v", s, left)
		}
	}
	if left := projectionMounts(scopes); len(left) != 0 {
		t.Errorf("projections left mounted: %v", left)
	}
}

// TestLoad is a busy worker (issue 49): LOOMFS_LOAD_AGENTS agents (20 by
// default; bench/load.sh runs 50) on scopes of their own, each looping for
// LOOMFS_LOAD_DURATION (60s by default) through what a coding agent does,
// every call a loomfs process as a platform would start it: writes with
// the last hash, a read, an edit, a patch, grep and glob, a build-like
// workspace_command, two calls refused on purpose, and, in every fourth
// agent, a line to a Python REPL in the scope's session sandbox (loomfs
// serve). It asserts no call failed but the refused ones (with the codes
// they were provoked for), nothing was quarantined, no container or
// projection is left, the audit verifies, and each scope holds exactly
// the files its agent wrote, as it wrote them. It prints p50/p99 per
// operation, and the CPU time and peak memory of the loomfs processes by
// kind.
//
// Off by default (loadConfig): LOOMFS_LOAD_HEAVY=1 makes agent 0 a heavy
// one (a 1 GiB dd and an untar of 20,000 files through its commands, its
// calls timed apart from the others'); LOOMFS_LOAD_DOOR=api makes the tool
// calls through the Go API in this process, a session per agent;
// LOOMFS_LOAD_NODES=2 splits the agents over two nodes of
// LOOMFS_DFS_ROOTS; LOOMFS_LOAD_POLICY names a policy file for them all.
func TestLoad(t *testing.T) {
	cfg := loadConfigFromEnv(t)
	nodes := cfg.startNodes(t)
	usage := newProcUsage()
	stats := &latencies{d: map[string][]time.Duration{}}
	results := make([]*loadAgent, cfg.agents)
	for i := range cfg.agents {
		n := nodes[i%len(nodes)]
		a := &loadAgent{s: n.serveEnv, node: n.name, usage: usage, stats: stats, n: i, scope: fmt.Sprintf("load/a/s%d", i),
			heavy: cfg.heavy && i == 0, files: map[string]string{}}
		a.repl = i%4 == 3 && !a.heavy
		if n.api != nil {
			a.session = n.api.open(t, a.scope)
		}
		results[i] = a
	}
	selfCPU, _, _ := procCPU(strconv.Itoa(os.Getpid()))
	usage.sample(loomfsBin, 500*time.Millisecond)
	var wg sync.WaitGroup
	began := time.Now()
	for _, a := range results {
		wg.Go(func() { a.run(began.Add(cfg.dur)) })
	}
	wg.Wait()
	elapsed := time.Since(began)
	usage.stopSampling()
	for _, n := range nodes {
		usage.running("serve", n.cmd.Process.Pid, 0)
		if n.api != nil {
			usage.running("this process (the API door)", os.Getpid(), selfCPU)
		}
	}

	var failures []string
	calls, provoked, iterations := 0, 0, 0
	for _, a := range results {
		failures = append(failures, a.failures...)
		calls += a.calls
		provoked += a.provoked
		iterations += a.iterations
	}
	t.Logf("%v, %v: %d iterations, %d calls (%d refused on purpose), %d failed", cfg, elapsed.Round(time.Second), iterations, calls, provoked, len(failures))
	for _, line := range stats.table() {
		t.Log(line)
	}
	for _, line := range usage.table() {
		t.Log(line)
	}
	// The first failure of each kind, and how many there were.
	kinds := map[string]int{}
	for _, f := range failures {
		kind, _, _ := strings.Cut(f[strings.Index(f, ": ")+2:], ":")
		if kinds[kind]++; kinds[kind] == 1 {
			t.Error(f)
		}
	}
	for kind, n := range kinds {
		if n > 1 {
			t.Errorf("%s: %d failures in all", kind, n)
		}
	}
	for _, a := range results {
		if a.iterations == 0 {
			t.Errorf("%s: no iteration finished in %v", a.scope, cfg.dur)
		}
	}
	for _, n := range nodes {
		if n.api != nil {
			// The sessions' command pools go with them.
			n.api.close(t)
			if said := ownLines(n.api.log.String(), "load/"); said != "" {
				t.Errorf("the API door logged: %s", said)
			}
		}
	}

	if r := nodes[0].loomfs("", "--json", "quarantine", "list"); strings.TrimSpace(string(r.stdout)) != "[]" {
		t.Errorf("quarantined: %s %s", r.stdout, r.stderr)
	}
	for _, a := range results {
		if a.repl {
			if r := a.s.loomfs("", "processes", "stop", "--scope", a.scope); r.code != 0 {
				t.Errorf("%s: processes stop: %d %s %s", a.scope, r.code, r.stdout, r.stderr)
			}
		}
		if left := loomfsContainers(t, a.scope); len(left) != 0 {
			t.Errorf("%s: containers left: %v", a.scope, left)
		}
		a.checkFiles(t, filepath.Join(a.s.root, "spaces", "load", "agents", "a", "sessions", fmt.Sprintf("s%d", a.n), "main"))
	}
	if r := nodes[0].loomfs("", "audit", "verify"); r.code != 0 {
		t.Errorf("audit verify: %d %s %s", r.code, r.stdout, r.stderr)
	}
	// The pool's projections of one-call processes went with them; the
	// service's went with processes stop.
	var scopes, mountDirs []string
	for _, a := range results {
		scopes = append(scopes, a.scope)
	}
	for _, n := range nodes {
		mountDirs = append(mountDirs, n.mountDir)
	}
	if left := projectionMounts(scopes, mountDirs...); len(left) != 0 {
		t.Errorf("projections left mounted: %v", left)
	}
}

// loadAgent is one agent of TestLoad and what it knows of its scope.
type loadAgent struct {
	s       *serveEnv     // the agent's node
	node    string        // its name
	session *loom.Session // the agent's session when the calls go through the Go API
	usage   *procUsage
	stats   *latencies
	n       int
	scope   string
	repl    bool
	heavy   bool // a 1 GiB dd and an untar of 20,000 files, in a loop

	files      map[string]string // path → the content the agent last wrote
	notes      int               // the iteration notes.txt names
	process    string            // the REPL's process id
	cursor     int64
	failures   []string
	refusal    string // the message of the last refusal, for a failure's report
	calls      int
	provoked   int
	iterations int
}

func (a *loadAgent) failf(format string, args ...any) {
	a.failures = append(a.failures, a.scope+": "+fmt.Sprintf(format, args...))
}

// call runs one tool, timed under op, through the agent's session or as a
// loomfs process, and decodes its answer into out. It returns the error
// code of a refusal, or "" and ok.
func (a *loadAgent) call(op, tool string, in map[string]any, out any) (code string, ok bool) {
	b, _ := json.Marshal(in)
	var res []byte
	if a.session != nil {
		began := time.Now()
		r, err := a.session.Tools.Call(context.Background(), tool, "", b)
		a.stats.add(op, time.Since(began))
		a.calls++
		if err != nil {
			pe := policy.Public(err)
			a.refusal = pe.Message
			return string(pe.Code), false
		}
		res = r
	} else {
		cmd := exec.Command(loomfsBin, "--root", a.s.root, "tool", tool, "--scope", a.scope, "--input", string(b))
		cmd.Env = append(a.s.env(), nodeid.Env+"="+a.node) // the node its loomfs serve runs as
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		began := time.Now()
		err := cmd.Run()
		a.stats.add(op, time.Since(began))
		kind := "tool " + tool
		if a.heavy {
			kind += " (heavy)"
		}
		a.usage.exited(kind, cmd.ProcessState)
		a.calls++
		if err != nil {
			var e struct {
				Error struct{ Code, Message string } `json:"error"`
			}
			if json.Unmarshal(stdout.Bytes(), &e) == nil && e.Error.Code != "" {
				a.refusal = e.Error.Message
				return e.Error.Code, false
			}
			a.failf("%s: %v: %s %s", op, err, stdout.Bytes(), stderr.Bytes())
			return "", false
		}
		if said := ownLines(stderr.String(), "load/"); said != "" {
			a.failf("%s: said on stderr: %s", op, said)
		}
		res = stdout.Bytes()
	}
	if out != nil {
		if err := json.Unmarshal(res, out); err != nil {
			a.failf("%s: answer %q: %v", op, res, err)
			return "", false
		}
	}
	return "", true
}

// must is call for a call that must succeed.
func (a *loadAgent) must(op, tool string, in map[string]any, out any) bool {
	code, ok := a.call(op, tool, in, out)
	if code != "" {
		a.failf("%s: refused: %s (%s)", op, code, a.refusal)
	}
	return ok
}

// refused is call for a call provoked to be refused with code.
func (a *loadAgent) refused(op, tool string, in map[string]any, code string) {
	a.provoked++
	if got, ok := a.call(op, tool, in, nil); ok || got != code {
		a.failf("%s: want %s, got %q", op, code, got)
	}
}

// write replaces path with content, on the condition that it still holds
// what the agent last wrote there.
func (a *loadAgent) write(path, content string) {
	expected := ""
	if old, ok := a.files[path]; ok {
		expected = sha(old)
	}
	var res struct {
		SHA256 string `json:"sha256"`
	}
	if a.must("write", tools.Write, map[string]any{"path": path, "content": content, "expected_sha256": expected}, &res) {
		if res.SHA256 != sha(content) {
			a.failf("write %s: sha256 %s, want %s", path, res.SHA256, sha(content))
		}
		a.files[path] = content
	}
}

func (a *loadAgent) run(until time.Time) {
	if a.heavy {
		for ; time.Now().Before(until); a.iterations++ {
			a.heavyIterate()
		}
		return
	}
	a.write("notes.txt", "iteration 0\n")
	if a.repl {
		var out tools.ProcessOutput
		if a.must("process_start", tools.ProcessStart, map[string]any{"command": "python3 -i -q", "yield_ms": 200}, &out) {
			a.process, a.cursor = out.ProcessID, out.Cursor
		}
	}
	for i := 1; time.Now().Before(until); i++ {
		a.iterate(i)
		a.iterations++
	}
}

// iterate is one round of an agent's work.
func (a *loadAgent) iterate(i int) {
	main := fmt.Sprintf("/* agent %d, iteration %d */\n#include \"util.h\"\nint main(void) { return util() - %d; }\n", a.n, i, i)
	a.write("src/main.c", main)
	a.write("src/util.c", fmt.Sprintf("int util(void) {\n\treturn %d;\n}\n", i))

	var read struct {
		Content string `json:"content"`
		SHA256  string `json:"sha256"`
	}
	if a.must("read", tools.Read, map[string]any{"path": "src/main.c"}, &read) && (read.Content != main || read.SHA256 != sha(main)) {
		a.failf("read src/main.c: %q (%s), want what was written", read.Content, read.SHA256)
	}

	edited := strings.Replace(main, "return util()", "return 2 * util()", 1)
	var edit struct {
		SHA256 string `json:"sha256"`
	}
	if a.must("edit", tools.Edit, map[string]any{"path": "src/main.c", "old_text": "return util()", "new_text": "return 2 * util()", "expected_sha256": sha(main)}, &edit) {
		if edit.SHA256 != sha(edited) {
			a.failf("edit: sha256 %s, want %s", edit.SHA256, sha(edited))
		}
		a.files["src/main.c"] = edited
	}

	patch := fmt.Sprintf("*** Begin Patch\n*** Update File: notes.txt\n@@\n-iteration %d\n+iteration %d\n*** End Patch\n", a.notes, i)
	if a.must("patch", tools.ApplyPatch, map[string]any{"patch": patch}, nil) {
		a.notes = i
		a.files["notes.txt"] = fmt.Sprintf("iteration %d\n", i)
	}

	var grep struct {
		Matches []struct {
			Path string `json:"path"`
		} `json:"matches"`
	}
	if a.must("grep", tools.Grep, map[string]any{"pattern": `util\(`, "path": "src"}, &grep) && len(grep.Matches) != 2 {
		a.failf("grep: %d matches, want 2: %+v", len(grep.Matches), grep.Matches)
	}
	var glob struct {
		Matches []string `json:"matches"`
	}
	if a.must("glob", tools.Glob, map[string]any{"pattern": "**/*.c"}, &glob) && !slices.Equal(glob.Matches, []string{"src/main.c", "src/util.c"}) {
		a.failf("glob: %v", glob.Matches)
	}

	// A build: a loop over the sources and a Python step, writing a log.
	var cmd tools.CommandResult
	build := `for f in src/*.c; do printf '%s %s\n' "$f" "$(wc -l < "$f")"; done > build.log && python3 -c 'print(len(open("build.log").read().splitlines()))'`
	if a.must("command", tools.Command, map[string]any{"command": build, "timeout_s": 120}, &cmd) {
		if cmd.ExitCode != 0 || cmd.Stdout != "2\n" || cmd.TimedOut {
			a.failf("command: exit %d, timed out %v, stdout %q, stderr %q", cmd.ExitCode, cmd.TimedOut, cmd.Stdout, cmd.Stderr)
		} else {
			a.files["build.log"] = fmt.Sprintf("src/main.c %d\nsrc/util.c %d\n", strings.Count(a.files["src/main.c"], "\n"), strings.Count(a.files["src/util.c"], "\n"))
		}
	}

	a.refused("refused_read", tools.Read, map[string]any{"path": fmt.Sprintf("missing-%d.txt", i)}, "not_found")
	a.refused("refused_write", tools.Write, map[string]any{"path": "../escape.txt", "content": "x"}, "invalid_path")

	if a.process != "" {
		a.repl1(i)
	}
}

// The heavy agent's commands. Each clears what a command cut short may
// have left, and removes what it made: the scope ends empty.
const (
	heavyFiles = 20_000
	// 1 GiB (the policy's per-file limit) written and synced through the
	// projection; the answer is its size.
	heavyDD = `rm -f big.bin; dd if=/dev/zero of=big.bin bs=1M count=1024 conv=fsync 2>/dev/null && wc -c < big.bin && rm big.bin`
	// An archive of heavyFiles small files in 100 directories, made in the
	// container, untarred into the projection; the answer is their count.
	heavyTar = `rm -rf x; mkdir x && python3 -c '
import io, sys, tarfile
t = tarfile.open(fileobj=sys.stdout.buffer, mode="w|")
for i in range(20000):
    if i % 200 == 0:
        d = tarfile.TarInfo("d%03d" % (i // 200)); d.type = tarfile.DIRTYPE; d.mode = 0o755
        t.addfile(d)
    b = (b"%d\n" % i) * (i % 64 + 1)
    f = tarfile.TarInfo("d%03d/f%05d.txt" % (i // 200, i)); f.size = len(b)
    t.addfile(f, io.BytesIO(b))
t.close()
' | tar -x -C x && find x -type f | wc -l && rm -rf x`
)

// heavyIterate is one round of the heavy agent: the 1 GiB dd, then the
// untar, each a workspace_command in its own scope.
func (a *loadAgent) heavyIterate() {
	for _, c := range []struct{ op, command, want string }{
		{"heavy_dd", heavyDD, strconv.Itoa(1 << 30)},
		{"heavy_tar", heavyTar, strconv.Itoa(heavyFiles)},
	} {
		var res tools.CommandResult
		if a.must(c.op, tools.Command, map[string]any{"command": c.command, "timeout_s": 120}, &res) &&
			(res.ExitCode != 0 || res.TimedOut || strings.TrimSpace(res.Stdout) != c.want) {
			a.failf("%s: exit %d, timed out %v, stdout %q (want %s), stderr %q", c.op, res.ExitCode, res.TimedOut, res.Stdout, c.want, res.Stderr)
		}
	}
}

// repl1 sends one line to the agent's REPL and reads until its answer.
func (a *loadAgent) repl1(i int) {
	want := strconv.Itoa(i * 7)
	var out tools.ProcessOutput
	if !a.must("process_write", tools.ProcessWrite, map[string]any{"process_id": a.process, "input": fmt.Sprintf("print(%d * 7)\n", i), "yield_ms": 2000}, &out) {
		return
	}
	seen := out.Stdout
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(seen, want+"\n") && time.Now().Before(deadline); {
		if out.Status != tools.StatusRunning {
			a.failf("the REPL ended: %+v", out)
			a.process = ""
			return
		}
		cursor := out.Cursor
		out = tools.ProcessOutput{}
		if !a.must("process_read", tools.ProcessRead, map[string]any{"process_id": a.process, "since": cursor, "yield_ms": 1000}, &out) {
			return
		}
		seen += out.Stdout
	}
	if !strings.Contains(seen, want+"\n") {
		a.failf("the REPL did not answer %s: %q", want, seen)
	}
}

// checkFiles compares the scope's backing directory with what the agent
// wrote: the same files, each as last written.
func (a *loadAgent) checkFiles(t *testing.T, dir string) {
	t.Helper()
	got := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		rel, _ := filepath.Rel(dir, p)
		got[rel] = string(b)
		return err
	})
	if err != nil {
		t.Errorf("%s: %v", a.scope, err)
		return
	}
	for p, want := range a.files {
		if got[p] != want {
			t.Errorf("%s: %s holds %q, the agent wrote %q", a.scope, p, got[p], want)
		}
	}
	for p := range got {
		if _, ok := a.files[p]; !ok {
			t.Errorf("%s: %s is there, the agent did not write it", a.scope, p)
		}
	}
}

// ownLines returns what a call told its user on stderr that concerns it:
// any line but a log line about another scope (another package's tests
// share the engine, and a container whose owner they killed is an orphan,
// rightly reported) or the warning that a projection was busy at its
// unmount and was detached (another program's stat of every mount on the
// node, such as a test's look for stale ones, holds it for a moment; the
// call's work was done).
func ownLines(stderr, prefix string) string {
	var kept []string
	for _, line := range strings.Split(strings.TrimSpace(stderr), "\n") {
		var rec struct {
			Msg   string `json:"msg"`
			Scope string `json:"scope"`
			Error string `json:"error"`
		}
		if line == "" {
			continue
		}
		if json.Unmarshal([]byte(line), &rec) == nil && (rec.Scope != "" && !strings.HasPrefix(rec.Scope, prefix) ||
			strings.HasPrefix(rec.Msg, "unmount the session's projection") && strings.Contains(rec.Error, "mount was busy")) {
			continue
		}
		kept = append(kept, line)
	}
	return strings.Join(kept, "\n")
}

func sha(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// latencies collects call durations by operation.
type latencies struct {
	mu sync.Mutex
	d  map[string][]time.Duration
}

func (l *latencies) add(op string, d time.Duration) {
	l.mu.Lock()
	l.d[op] = append(l.d[op], d)
	l.mu.Unlock()
}

// table is one line per operation: calls, p50, p99 and the maximum.
func (l *latencies) table() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	ops := make([]string, 0, len(l.d))
	for op := range l.d {
		ops = append(ops, op)
	}
	sort.Strings(ops)
	lines := []string{fmt.Sprintf("%-16s %7s %10s %10s %10s", "operation", "calls", "p50 ms", "p99 ms", "max ms")}
	for _, op := range ops {
		d := slices.Clone(l.d[op])
		slices.Sort(d)
		lines = append(lines, fmt.Sprintf("%-16s %7d %10.1f %10.1f %10.1f", op, len(d), ms(rank(d, 50)), ms(rank(d, 99)), ms(d[len(d)-1])))
	}
	return lines
}

// rank is the nearest-rank p-th percentile of sorted d.
func rank(d []time.Duration, p int) time.Duration {
	i := (p*len(d) + 99) / 100
	return d[max(i, 1)-1]
}

// projectionMounts lists the mounts of the projections of scopes in the
// sandbox's default mount directory, where one-call loomfs processes mount
// them (other packages' tests use it too), and every mount in dirs.
func projectionMounts(scopes []string, dirs ...string) []string {
	var prefixes []string
	for _, scope := range scopes {
		sc, _ := store.ParseScope(scope)
		prefixes = append(prefixes, filepath.Join(sandbox.DefaultMountDir, sandbox.MountpointPrefix(sc)))
	}
	for _, dir := range dirs {
		prefixes = append(prefixes, dir+"/")
	}
	var out []string
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	for _, l := range strings.Split(string(mi), "\n") {
		f := strings.Fields(l)
		if len(f) > 4 && slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(f[4], p) }) {
			out = append(out, f[4])
		}
	}
	return out
}
