package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"

	"github.com/agentloom/loomfs/sandbox/enginetest"
	"github.com/agentloom/loomfs/slots"
)

func TestCheckHost(t *testing.T) {
	for _, tc := range []struct {
		host string
		ok   bool
	}{
		{"unix:///var/run/docker.sock", true},
		{"unix:///run/user/1000/docker.sock", true},
		{"tcp://127.0.0.1:2375", false},
		{"tcp://docker.example:2376", false},
		{"ssh://user@host", false},
		{"npipe:////./pipe/docker_engine", false},
		{"http://localhost:2375", false},
		{"unix://relative/docker.sock", false},
		{"unix://", false},
		{"unix:///var/run/../run/docker.sock", false},
		{"/var/run/docker.sock", false},
		{"", false},
	} {
		err := CheckHost(tc.host)
		if (err == nil) != tc.ok {
			t.Errorf("CheckHost(%q) = %v, want ok=%v", tc.host, err, tc.ok)
		}
		if err != nil && (!errors.Is(err, ErrHostNotLocal) || !strings.Contains(err.Error(), "local unix:// socket")) {
			t.Errorf("CheckHost(%q) error %q does not name the local-socket rule", tc.host, err)
		}
	}
}

func TestNonUnixEngineRefused(t *testing.T) {
	for _, host := range []string{"tcp://127.0.0.1:2375", "ssh://root@10.0.0.1", "npipe:////./pipe/docker_engine"} {
		t.Run(host, func(t *testing.T) {
			t.Setenv("AGENT_LOOM_DOCKER_HOST", host)
			_, err := NewRunner(context.Background(), ConfigFromEnv())
			if !errors.Is(err, ErrHostNotLocal) {
				t.Fatalf("NewRunner with %s: err = %v, want ErrHostNotLocal", host, err)
			}
			_, err = BuildImage(context.Background(), BuildOptions{Minimal: true})
			if !errors.Is(err, ErrHostNotLocal) {
				t.Fatalf("BuildImage with %s: err = %v, want ErrHostNotLocal", host, err)
			}
		})
	}
}

func TestRequestRefusedBeforeAnythingStarts(t *testing.T) {
	r := newTestRunner(t, Config{})
	file := filepath.Join(t.TempDir(), "file")
	os.WriteFile(file, nil, 0o600)
	link := filepath.Join(t.TempDir(), "link")
	os.Symlink(t.TempDir(), link)
	for _, tc := range []struct {
		name string
		edit func(*Request)
	}{
		{"timeout below 1s", func(q *Request) { q.Timeout = 500 * time.Millisecond }},
		{"timeout above 120s", func(q *Request) { q.Timeout = 121 * time.Second }},
		{"negative timeout", func(q *Request) { q.Timeout = -time.Second }},
		{"empty command", func(q *Request) { q.Command = "  " }},
		{"NUL in command", func(q *Request) { q.Command = "echo a\x00b" }},
		{"no marker hooks", func(q *Request) { q.Marker = nil }},
		{"empty scope hash", func(q *Request) { q.ScopeHash = "" }},
		{"scope hash with slash", func(q *Request) { q.ScopeHash = "ab/cd" }},
		{"empty scope", func(q *Request) { q.Scope = "" }},
		{"control character in call", func(q *Request) { q.Call = "c\n1" }},
		{"relative workspace", func(q *Request) { q.Workspace = "ws" }},
		{"unclean workspace", func(q *Request) { q.Workspace = q.Workspace + "/../x" }},
		{"workspace is host root", func(q *Request) { q.Workspace = "/" }},
		{"missing workspace is not created", func(q *Request) { q.Workspace = filepath.Join(q.Workspace, "missing") }},
		{"workspace is a file", func(q *Request) { q.Workspace = file }},
		{"workspace is a symlink", func(q *Request) { q.Workspace = link }},
		{"skill id with slash", func(q *Request) { q.Skills = map[string]string{"a/b": t.TempDir()} }},
		{"skill id dot-dot", func(q *Request) { q.Skills = map[string]string{"..": t.TempDir()} }},
		{"skill id leading dot", func(q *Request) { q.Skills = map[string]string{".x": t.TempDir()} }},
		{"empty skill id", func(q *Request) { q.Skills = map[string]string{"": t.TempDir()} }},
		{"skill id too long", func(q *Request) { q.Skills = map[string]string{strings.Repeat("s", 65): t.TempDir()} }},
		{"missing skill dir", func(q *Request) { q.Skills = map[string]string{"s1": "/nonexistent/skill"} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, m := newRequest(t, "echo hi")
			tc.edit(&req)
			_, err := r.Run(context.Background(), req)
			if !errors.Is(err, ErrInvalidRequest) {
				t.Fatalf("Run: err = %v, want ErrInvalidRequest", err)
			}
			if sets, _ := m.counts(); sets != 0 {
				t.Fatalf("marker set %d times for a refused request", sets)
			}
		})
	}
}

func TestTimeoutRangeMessage(t *testing.T) {
	r := newTestRunner(t, Config{})
	req, _ := newRequest(t, "true")
	req.Timeout = 121 * time.Second
	_, err := r.Run(context.Background(), req)
	if err == nil || !strings.Contains(err.Error(), "outside the allowed 1s to 2m0s") {
		t.Fatalf("err = %v, want the allowed range named", err)
	}
}

func TestStdoutAndStderrSeparated(t *testing.T) {
	r := newTestRunner(t, Config{})
	req, _ := newRequest(t, `echo out1; echo err1 >&2; printf 'out2\n'; printf 'err2\n' 1>&2`)
	res := mustRun(t, r, req)
	if res.Stdout != "out1\nout2\n" || res.Stderr != "err1\nerr2\n" {
		t.Fatalf("stdout %q stderr %q", res.Stdout, res.Stderr)
	}
	if res.ExitCode != 0 || res.TimedOut || res.Cancelled || res.StdoutTruncated || res.StderrTruncated {
		t.Fatalf("unexpected result %+v", res)
	}
	if !strings.HasPrefix(res.ContainerName, "loomfs-"+req.ScopeHash[:12]+"-") {
		t.Fatalf("container name %q does not carry the scope hash prefix", res.ContainerName)
	}
	assertGone(t, r, res.ContainerName)
}

func TestExitCodePassedThrough(t *testing.T) {
	r := newTestRunner(t, Config{})
	for _, tc := range []struct {
		cmd  string
		want int
	}{
		{"true", 0},
		{"false", 1},
		{"exit 3", 3},
		{"exit 255", 255},
		{"kill -9 $$; echo PID 1 ignores SIGKILL from inside", 0}, // 137 under gVisor, see below
		{"sh -c 'kill -9 $$'; exit $?", 137},
		{"no-such-program", 127},
	} {
		t.Run(tc.cmd, func(t *testing.T) {
			t.Parallel()
			req, _ := newRequest(t, tc.cmd)
			if gvisor(r) && strings.HasPrefix(tc.cmd, "kill -9 $$;") {
				// gVisor's init takes a SIGKILL it sends itself, where
				// Linux ignores it for a namespace's PID 1.
				tc.want = 137
			}
			if res := mustRun(t, r, req); res.ExitCode != tc.want {
				t.Fatalf("exit code %d, want %d (stderr %q)", res.ExitCode, tc.want, res.Stderr)
			}
		})
	}
}

func TestCommandQuoting(t *testing.T) {
	r := newTestRunner(t, Config{})
	req, _ := newRequest(t, `a='it'"'"'s'; set -- x "y z"; echo "$a|$#|$2|$0"; echo '$HOME' "$HOME"`)
	res := mustRun(t, r, req)
	if want := "it's|2|y z|/bin/sh\n$HOME /tmp\n"; res.Stdout != want {
		t.Fatalf("stdout %q, want %q (stderr %q)", res.Stdout, want, res.Stderr)
	}
}

func TestTimeoutKillsAndRemoves(t *testing.T) {
	log := &eventLog{}
	r := newTestRunner(t, Config{Observe: log.observe})
	req, m := newRequest(t, "echo started; sleep 60; echo never")
	req.Timeout = time.Second
	start := time.Now()
	res, err := r.Run(context.Background(), req)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if !res.TimedOut || res.Cancelled {
		t.Fatalf("TimedOut=%v Cancelled=%v, want a timeout", res.TimedOut, res.Cancelled)
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Fatalf("a 1s timeout took %v", d)
	}
	if res.Stdout != "started\n" {
		t.Fatalf("stdout %q, want the output before the kill", res.Stdout)
	}
	if res.ExitCode != 137 {
		t.Fatalf("exit code %d, want 137 (SIGKILL)", res.ExitCode)
	}
	if !slices.Contains(log.list(), "container_kill") {
		t.Fatalf("no container_kill event in %v", log.list())
	}
	assertGone(t, r, res.ContainerName)
	if sets, clears := m.counts(); sets != 1 || clears != 1 {
		t.Fatalf("marker set %d cleared %d, want 1 and 1", sets, clears)
	}
}

func TestCancelKillsAndRemoves(t *testing.T) {
	r := newTestRunner(t, Config{})
	req, m := newRequest(t, "echo started; : > started; sleep 60")
	req.Timeout = 100 * time.Second
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m.onClear = func() {
		if ok, err := r.ContainerExists(context.Background(), m.set[0].Container); ok || err != nil {
			t.Errorf("marker cleared while the container exists (%v, %v)", ok, err)
		}
	}
	// Cancelled once the command has begun, however long its start took
	// (a gVisor sandbox on a loaded node took more than 1.5 s).
	go func() {
		defer cancel()
		for range 600 {
			if _, err := os.Stat(filepath.Join(req.Workspace, "started")); err == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	res, err := r.Run(ctx, req)
	if !errors.Is(err, context.Canceled) || errors.Is(err, ErrQuarantined) {
		t.Fatalf("err = %v, want context.Canceled only", err)
	}
	if !res.Cancelled || res.TimedOut {
		t.Fatalf("Cancelled=%v TimedOut=%v", res.Cancelled, res.TimedOut)
	}
	if res.Stdout != "started\n" {
		t.Fatalf("stdout %q", res.Stdout)
	}
	assertGone(t, r, res.ContainerName)
	if _, clears := m.counts(); clears != 1 {
		t.Fatalf("marker cleared %d times, want 1", clears)
	}
}

func TestAlreadyCancelledStartsNothing(t *testing.T) {
	r := newTestRunner(t, Config{})
	req, m := newRequest(t, "true")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := r.Run(ctx, req); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	if sets, _ := m.counts(); sets != 0 {
		t.Fatal("marker set for a cancelled context")
	}
}

func TestOutputCappedHeadAndTail(t *testing.T) {
	r := newTestRunner(t, Config{OutputLimit: 1000})
	// 200 000 bytes between a HEAD and a TAIL line on stdout; a short stderr.
	req, _ := newRequest(t, `echo HEAD; yes 0123456789abcdefghi | head -c 200000; echo; echo TAIL; echo small >&2`)
	res := mustRun(t, r, req)
	if !res.StdoutTruncated || res.StderrTruncated {
		t.Fatalf("truncated flags stdout=%v stderr=%v", res.StdoutTruncated, res.StderrTruncated)
	}
	if !strings.HasPrefix(res.Stdout, "HEAD\n0123") || !strings.HasSuffix(res.Stdout, "\nTAIL\n") {
		t.Fatalf("stdout lost its head or tail: %.60q … %.60q", res.Stdout, res.Stdout[max(0, len(res.Stdout)-60):])
	}
	total := len("HEAD\n") + 200000 + len("\nTAIL\n")
	marker := fmt.Sprintf("\n…[loomfs: %d bytes cut]…\n", total-1000)
	if !strings.Contains(res.Stdout, marker) {
		t.Fatalf("stdout has no cut marker %q", marker)
	}
	if got := len(res.Stdout) - len(marker); got != 1000 {
		t.Fatalf("kept %d bytes, want 1000", got)
	}
	if res.Stderr != "small\n" {
		t.Fatalf("stderr %q", res.Stderr)
	}
}

// TestHardeningInsideContainer checks each SPEC §5 protection from inside a
// running container, where it must actually hold.
func TestHardeningInsideContainer(t *testing.T) {
	cfg := Config{TmpSize: 8 << 20, Memory: 128 << 20, NanoCPUs: 500_000_000, PidsLimit: 64}
	if os.Getenv("AGENT_LOOM_SANDBOX_RUNTIME") == "runsc" {
		// Under gVisor the limit counts the whole sandbox on the host: the
		// Sentry's threads and a stub process per task. 64 leaves a shell
		// too few to fork at all.
		cfg.PidsLimit = 192
	}
	r := newTestRunner(t, cfg)
	skill := t.TempDir()
	os.WriteFile(filepath.Join(skill, "SKILL.md"), []byte("skill text\n"), 0o644)
	for _, tc := range []struct {
		name  string
		cmd   string
		check func(t *testing.T, res Result, ws string)
	}{
		{"network none: only loopback", `cat /proc/net/dev`, func(t *testing.T, res Result, _ string) {
			var ifaces []string
			for _, line := range strings.Split(res.Stdout, "\n") {
				if name, _, ok := strings.Cut(line, ":"); ok && !strings.Contains(name, "|") {
					ifaces = append(ifaces, strings.TrimSpace(name))
				}
			}
			if !slices.Equal(ifaces, []string{"lo"}) {
				t.Errorf("interfaces %v, want only lo", ifaces)
			}
		}},
		{"read-only root filesystem", `touch /probe; echo rc=$?; touch /etc/probe; echo rc=$?`, func(t *testing.T, res Result, _ string) {
			// gVisor answers EACCES where Linux answers EROFS.
			if res.Stdout != "rc=1\nrc=1\n" || !strings.Contains(res.Stderr, "Read-only file system") && !(gvisor(r) && strings.Contains(res.Stderr, "Permission denied")) {
				t.Errorf("writing / was not refused: %q %q", res.Stdout, res.Stderr)
			}
		}},
		{"writable tmp", `echo hi > /tmp/a && cat /tmp/a`, func(t *testing.T, res Result, _ string) {
			if res.Stdout != "hi\n" {
				t.Errorf("stdout %q stderr %q", res.Stdout, res.Stderr)
			}
		}},
		{"tmp size-capped nosuid nodev", `grep ' /tmp ' /proc/mounts; dd if=/dev/zero of=/tmp/fill bs=1M count=16 2>&1; echo rc=$?`, func(t *testing.T, res Result, _ string) {
			want := []string{"tmpfs /tmp tmpfs", "nosuid", "nodev", "size=8192k", "No space left on device", "rc=1"}
			if gvisor(r) {
				// gVisor's /proc/mounts lists only rw and the size of its
				// own tmpfs (the engine's spec asks for nosuid,nodev; see
				// TestOrphansAndContainerConfig), and gVisor has no setuid
				// or device files to honour anyway.
				want = []string{" /tmp tmpfs rw,size=8388608", "No space left on device", "rc=1"}
			}
			for _, w := range want {
				if !strings.Contains(res.Stdout, w) {
					t.Errorf("missing %q in %q", w, res.Stdout)
				}
			}
			if strings.Contains(res.Stdout, "noexec") {
				t.Errorf("/tmp is noexec: %q", res.Stdout)
			}
		}},
		{"programs run from tmp", `printf '#!/bin/sh\necho ran\n' > /tmp/s && chmod 700 /tmp/s && /tmp/s && mkdir /tmp/bin && cp /bin/busybox /tmp/bin/busybox && /tmp/bin/busybox echo ran too`, func(t *testing.T, res Result, _ string) {
			if res.Stdout != "ran\nran too\n" {
				t.Errorf("stdout %q stderr %q", res.Stdout, res.Stderr)
			}
		}},
		{"non-root uid and gid", `id -u; id -g; id -G`, func(t *testing.T, res Result, _ string) {
			if res.Stdout != "1000\n1000\n1000\n" {
				t.Errorf("ids %q", res.Stdout)
			}
		}},
		{"no capabilities", `grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb):' /proc/self/status`, func(t *testing.T, res Result, _ string) {
			lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
			if gvisor(r) && len(lines) == 4 {
				// gVisor's status has no CapAmb line (it has no ambient set).
			} else if len(lines) != 5 {
				t.Fatalf("status lines %q", res.Stdout)
			}
			for _, l := range lines {
				if !strings.HasSuffix(l, "\t0000000000000000") {
					t.Errorf("capability set not empty: %q", l)
				}
			}
		}},
		{"no new privileges and seccomp filter", `grep -E '^(NoNewPrivs|Seccomp):' /proc/self/status`, func(t *testing.T, res Result, _ string) {
			if gvisor(r) {
				// gVisor's status has no NoNewPrivs line, and runsc applies no
				// OCI seccomp filter inside its sandbox (TestSeccompDenials):
				// the Sentry, a kernel of its own, is the system call boundary.
				if res.Stdout != "Seccomp:\t0\n" {
					t.Errorf("status %q", res.Stdout)
				}
				return
			}
			if res.Stdout != "NoNewPrivs:\t1\nSeccomp:\t2\n" {
				t.Errorf("status %q", res.Stdout)
			}
		}},
		{"umask 077 in workspace", `umask; pwd; echo x > made.txt; mkdir made.d; stat -c '%a %u' made.txt made.d`, func(t *testing.T, res Result, ws string) {
			if res.Stdout != "0077\n/workspace\n600 1000\n700 1000\n" {
				t.Errorf("stdout %q stderr %q", res.Stdout, res.Stderr)
			}
			fi, err := os.Stat(filepath.Join(ws, "made.txt"))
			if err != nil || fi.Mode().Perm() != 0o600 {
				t.Errorf("host sees %v %v, want mode 0600", fi, err)
			}
		}},
		{"pids memory and cpu limits", `cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max
cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes
cut -d' ' -f1 /sys/fs/cgroup/cpu.max 2>/dev/null || cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us
grep MemTotal /proc/meminfo`, func(t *testing.T, res Result, _ string) {
			if gvisor(r) {
				// gVisor mounts no cgroup files in its sandbox: the limits
				// apply to the sandbox as a whole on the host, and the
				// Sentry sizes the memory it shows to the limit.
				if f := strings.Fields(res.Stdout); len(f) < 3 || f[len(f)-2] != strconv.Itoa(128<<10) {
					t.Errorf("stdout %q, want MemTotal of the 128 MiB limit", res.Stdout)
				}
				return
			}
			res.Stdout = res.Stdout[:strings.LastIndex(strings.TrimSuffix(res.Stdout, "\n"), "\n")+1]
			if want := fmt.Sprintf("64\n%d\n50000\n", 128<<20); res.Stdout != want {
				t.Errorf("limits %q, want %q (stderr %q)", res.Stdout, want, res.Stderr)
			}
		}},
		{"pids limit enforced", `(for i in $(seq 100); do sleep 5 & done) 2>/dev/null; set -- /proc/[0-9]*; echo $#`, func(t *testing.T, res Result, _ string) {
			n, _ := strconv.Atoi(strings.TrimSpace(res.Stdout))
			if gvisor(r) {
				// Under gVisor the limit counts the sandbox's host threads
				// and stub processes, not its own processes one for one: it
				// bites earlier, and the shell may not get to count.
				if res.ExitCode == 0 && n >= 100 {
					t.Errorf("%d background processes with a limit of 64 (stdout %q)", n, res.Stdout)
				}
				return
			}
			if n < 10 || n > 64 {
				t.Errorf("%d background processes with a limit of 64 (stdout %q)", n, res.Stdout)
			}
		}},
		{"skills read-only", `cat /skills/s1/SKILL.md; touch /skills/s1/new; echo rc=$?`, func(t *testing.T, res Result, _ string) {
			if res.Stdout != "skill text\nrc=1\n" {
				t.Errorf("stdout %q stderr %q", res.Stdout, res.Stderr)
			}
		}},
		{"nothing else mounted", `cut -d' ' -f2 /proc/mounts`, func(t *testing.T, res Result, _ string) {
			allowed := []string{"/", "/tmp", "/workspace", "/skills/s1", "/etc/hosts", "/etc/hostname", "/etc/resolv.conf"}
			var targets []string
			for _, m := range strings.Fields(res.Stdout) {
				if m == "/proc" || m == "/dev" || m == "/sys" || strings.HasPrefix(m, "/proc/") || strings.HasPrefix(m, "/dev/") || strings.HasPrefix(m, "/sys/") {
					continue
				}
				targets = append(targets, m)
				if !slices.Contains(allowed, m) {
					t.Errorf("unexpected mount %s", m)
				}
			}
			if !slices.Contains(targets, "/workspace") || !slices.Contains(targets, "/skills/s1") {
				t.Errorf("mounts %v lack /workspace or /skills/s1", targets)
			}
			if strings.Contains(res.Stdout, "docker.sock") {
				t.Error("the docker socket is mounted")
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			req, _ := newRequest(t, tc.cmd)
			req.Skills = map[string]string{"s1": skill}
			res := mustRun(t, r, req)
			tc.check(t, res, req.Workspace)
		})
	}
}

func TestWrittenFileAppearsOnHost(t *testing.T) {
	r := newTestRunner(t, Config{})
	req, _ := newRequest(t, `mkdir -p out && printf 'result 42\n' > out/answer.txt`)
	mustRun(t, r, req)
	p := filepath.Join(req.Workspace, "out", "answer.txt")
	b, err := os.ReadFile(p)
	if err != nil || string(b) != "result 42\n" {
		t.Fatalf("host file %q, %v", b, err)
	}
	fi, _ := os.Stat(p)
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != 1000 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("host file uid %d mode %v, want 1000 and 0600", st.Uid, fi.Mode().Perm())
	}
}

// TestMarkerOrder: the marker is set before the container exists and
// cleared only after the engine confirmed its removal (SPEC §5).
func TestMarkerOrder(t *testing.T) {
	log := &eventLog{}
	r := newTestRunner(t, Config{Observe: log.observe})
	req, m := newRequest(t, "echo hi")
	m.log = log
	m.onSet = func(mk Marker) {
		if ok, err := r.ContainerExists(context.Background(), mk.Container); ok || err != nil {
			t.Errorf("container exists when the marker is set (%v, %v)", ok, err)
		}
	}
	m.onClear = func() {
		if ok, err := r.ContainerExists(context.Background(), m.set[0].Container); ok || err != nil {
			t.Errorf("container exists when the marker is cleared (%v, %v)", ok, err)
		}
	}
	before := time.Now()
	res := mustRun(t, r, req)
	want := []string{"marker_set", "container_create", "container_start", "container_exit", "container_removed", "marker_clear"}
	if got := log.list(); !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	mk := m.set[0]
	if mk.Container != res.ContainerName || mk.Node != testNode || mk.Run != "run-1" || mk.Call != "call-1" ||
		mk.Scope != req.Scope || mk.PID != os.Getpid() || mk.Time.Before(before.Add(-time.Second)) {
		t.Fatalf("marker %+v", mk)
	}
	for i, d := range log.detail {
		if strings.HasPrefix(log.ops[i], "container_") && (d["container"] != res.ContainerName || d["call"] != "call-1" || d["scope_hash"] != req.ScopeHash) {
			t.Errorf("%s detail %v", log.ops[i], d)
		}
	}
	if d := log.detail[3]; d["exit_code"] != 0 {
		t.Errorf("exit detail %v", d)
	}
}

func TestMarkerSetFailureStartsNothing(t *testing.T) {
	log := &eventLog{}
	r := newTestRunner(t, Config{Observe: log.observe})
	req, m := newRequest(t, "true")
	m.setErr = errors.New("disk full")
	if _, err := r.Run(context.Background(), req); err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("err = %v", err)
	}
	if got := log.list(); len(got) != 0 {
		t.Fatalf("events after a failed marker: %v", got)
	}
	if _, clears := m.counts(); clears != 1 {
		t.Fatalf("a failed Set was followed by %d Clear calls, want 1", clears)
	}
}

// TestQuarantineWhenRemovalUnconfirmed gives cleanup no time at all, so the
// engine can't confirm the removal: the marker must stay.
func TestQuarantineWhenRemovalUnconfirmed(t *testing.T) {
	r := newTestRunner(t, Config{CleanupTimeout: time.Nanosecond})
	req, m := newRequest(t, "true")
	res, err := r.Run(context.Background(), req)
	if !errors.Is(err, ErrQuarantined) {
		t.Fatalf("err = %v, want ErrQuarantined", err)
	}
	if !strings.Contains(err.Error(), res.ContainerName) || !strings.Contains(err.Error(), "loomfs quarantine clear") {
		t.Fatalf("error %q names neither the container nor the way out", err)
	}
	if sets, clears := m.counts(); sets != 1 || clears != 0 {
		t.Fatalf("marker set %d cleared %d, want 1 and 0", sets, clears)
	}
	// The cleanup registered by newRequest removes the container.
}

// TestCreateRefusedClearsMarker: an engine that answers the create with an
// error left no container, so the marker may go.
func TestCreateRefusedClearsMarker(t *testing.T) {
	r := newTestRunner(t, Config{Runtime: "loomfs-no-such-runtime"})
	req, m := newRequest(t, "true")
	_, err := r.Run(context.Background(), req)
	if err == nil || errors.Is(err, ErrQuarantined) || !strings.Contains(err.Error(), "create container") {
		t.Fatalf("err = %v, want a create error without quarantine", err)
	}
	if sets, clears := m.counts(); sets != 1 || clears != 1 {
		t.Fatalf("marker set %d cleared %d, want 1 and 1", sets, clears)
	}
}

func TestMissingImageRefused(t *testing.T) {
	r := newTestRunner(t, Config{Image: "loomfs-test-absent:latest"})
	req, m := newRequest(t, "true")
	_, err := r.Run(context.Background(), req)
	if !errors.Is(err, ErrImageMissing) || !strings.Contains(err.Error(), "loomfs image build --tag loomfs-test-absent:latest") {
		t.Fatalf("err = %v, want ErrImageMissing naming the build command", err)
	}
	if sets, _ := m.counts(); sets != 0 {
		t.Fatal("marker set without an image")
	}
}

// TestOrphansAndContainerConfig inspects a running container: its labels
// (its owner, this process, among them), explicit bind mounts and host
// config, and that Containers lists it and Orphans does not.
func TestOrphansAndContainerConfig(t *testing.T) {
	r := newTestRunner(t, Config{Memory: 256 << 20, PidsLimit: 100, TmpSize: 16 << 20})
	req, m := newRequest(t, "sleep 60")
	req.Skills = map[string]string{"pdf-tools": t.TempDir()}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan Result)
	go func() {
		res, _ := r.Run(ctx, req)
		done <- res
	}()

	var found Container
	for deadline := time.Now().Add(20 * time.Second); found.ID == "" && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		list, err := r.Containers(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range list {
			if c.ScopeHash == req.ScopeHash && c.State == "running" {
				found = c
			}
		}
	}
	if found.ID == "" {
		cancel()
		t.Fatal("Containers never listed the running container")
	}
	if found.Scope != req.Scope || found.Run != "run-1" || found.Call != "call-1" || found.Node != testNode || !strings.HasPrefix(found.Name, "loomfs-") ||
		found.Owner != fmt.Sprintf("%d:%d", os.Getpid(), self().Start) || self().Start == 0 {
		t.Errorf("container %+v", found)
	}
	orphans, err := r.Orphans(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range orphans {
		if c.ID == found.ID {
			t.Errorf("a running command's container, its owner alive, is listed as an orphan: %+v", c)
		}
	}
	if ok, err := r.ContainerExists(context.Background(), found.Name); !ok || err != nil {
		t.Errorf("ContainerExists(%s) = %v, %v", found.Name, ok, err)
	}
	info, err := r.cli.ContainerInspect(context.Background(), found.ID)
	if err != nil {
		t.Fatal(err)
	}
	hc := info.HostConfig
	if len(hc.Binds) != 0 || len(hc.Mounts) != 2 {
		t.Errorf("binds %v mounts %v, want no binds and two mounts", hc.Binds, hc.Mounts)
	}
	for _, mt := range hc.Mounts {
		switch mt.Target {
		case "/workspace":
			if mt.Type != "bind" || mt.Source != req.Workspace || mt.ReadOnly {
				t.Errorf("workspace mount %+v", mt)
			}
		case "/skills/pdf-tools":
			if mt.Type != "bind" || mt.Source != req.Skills["pdf-tools"] || !mt.ReadOnly {
				t.Errorf("skill mount %+v", mt)
			}
		default:
			t.Errorf("unexpected mount %+v", mt)
		}
	}
	if hc.NetworkMode != "none" || !hc.ReadonlyRootfs || !slices.Equal(hc.CapDrop, []string{"ALL"}) ||
		len(hc.SecurityOpt) != 2 || hc.SecurityOpt[0] != "no-new-privileges" || hc.SecurityOpt[1] != "seccomp="+r.seccomp || hc.Privileged ||
		hc.Memory != 256<<20 || hc.MemorySwap != 256<<20 || hc.NanoCPUs != DefaultNanoCPUs ||
		hc.PidsLimit == nil || *hc.PidsLimit != 100 || hc.Tmpfs["/tmp"] != fmt.Sprintf("rw,exec,nosuid,nodev,size=%d,mode=1777", 16<<20) {
		t.Errorf("host config %+v", hc)
	}
	if info.Config.User != "1000:1000" || info.Config.WorkingDir != "/workspace" || info.Config.Labels[LabelScopeHash] != req.ScopeHash {
		t.Errorf("config %+v", info.Config)
	}

	cancel()
	res := <-done
	assertGone(t, r, res.ContainerName)
	if _, clears := m.counts(); clears != 1 {
		t.Fatalf("marker cleared %d times", clears)
	}
	list, _ := r.Containers(context.Background())
	for _, c := range list {
		if c.ScopeHash == req.ScopeHash {
			t.Fatalf("still listed after Run returned: %+v", c)
		}
	}
	if ms := m.set; len(ms) != 1 || ms[0].PID != os.Getpid() || ms[0].PIDStart != self().Start {
		t.Errorf("the marker does not name this process: %+v", ms)
	}
}

// TestOrphansByOwner: a container is an orphan only when no live process
// owns it. Containers of a live owner, created or running, are not; one
// whose owner exited is, and so is one that names no owner.
func TestOrphansByOwner(t *testing.T) {
	r := newTestRunner(t, Config{})
	ctx := context.Background()
	gone := exec.Command("sleep", "0.3")
	if err := gone.Start(); err != nil {
		t.Fatal(err)
	}
	goneStart, ok := procStart(gone.Process.Pid)
	gone.Wait()
	if !ok {
		t.Fatal("no start time of a running process")
	}
	cases := []struct {
		name   string
		owner  string
		start  bool
		orphan bool
	}{
		{"created, owner alive", self().String(), false, false},
		{"running, owner alive", self().String(), true, false},
		{"running, owner exited", Owner{PID: gone.Process.Pid, Start: goneStart}.String(), true, true},
		{"running, a later process with the owner's pid", Owner{PID: os.Getpid(), Start: self().Start + 1}.String(), true, true},
		{"created, no owner named", "", false, true},
	}
	ids := map[string]string{}
	for _, c := range cases {
		req, _ := newRequest(t, "sleep 60")
		cc, hc := r.containerConfig(req, false)
		cc.Labels[LabelOwner] = c.owner
		if c.owner == "" {
			delete(cc.Labels, LabelOwner)
		}
		hc.Mounts = nil
		created, err := r.cli.ContainerCreate(ctx, cc, hc, nil, nil, NewContainerName(req.ScopeHash))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.removeConfirmed(context.Background(), created.ID) })
		if c.start {
			if err := r.cli.ContainerStart(ctx, created.ID, container.StartOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		ids[created.ID] = c.name
	}
	orphans, err := r.Orphans(ctx)
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, o := range orphans {
		listed[ids[o.ID]] = true
	}
	for _, c := range cases {
		if listed[c.name] != c.orphan {
			t.Errorf("%s: orphan %v, want %v", c.name, listed[c.name], c.orphan)
		}
	}
}

func TestPythonInDefaultImage(t *testing.T) {
	ctx := context.Background()
	if _, err := BuildImage(ctx, BuildOptions{Progress: testWriter{t}}); err != nil { // kept when present
		t.Fatalf("build default image: %v", err)
	}
	r := newTestRunner(t, Config{Image: DefaultImage})
	req, _ := newRequest(t, `python3 -c 'print(1)' && python3 -c '
import json, os
with open("data.json", "w") as f:
    json.dump({"cwd": os.getcwd(), "uid": os.getuid()}, f)
print(json.load(open("data.json"))["cwd"], oct(os.stat("data.json").st_mode & 0o777))
'`)
	res := mustRun(t, r, req)
	if res.Stdout != "1\n/workspace 0o600\n" || res.Stderr != "" {
		t.Fatalf("stdout %q stderr %q", res.Stdout, res.Stderr)
	}
	if b, err := os.ReadFile(filepath.Join(req.Workspace, "data.json")); err != nil || !strings.Contains(string(b), `"uid": 1000`) {
		t.Fatalf("host data.json %q, %v", b, err)
	}
}

// mustRun runs req and fails the test on an error.
func mustRun(t *testing.T, r *Runner, req Request) Result {
	t.Helper()
	res, err := r.Run(context.Background(), req)
	if err != nil {
		t.Fatalf("Run(%q): %v", req.Command, err)
	}
	return res
}

// assertGone fails unless the engine no longer knows the container.
func assertGone(t *testing.T, r *Runner, name string) {
	t.Helper()
	if ok, err := r.ContainerExists(context.Background(), name); ok || err != nil {
		t.Fatalf("container %s still exists (%v, %v)", name, ok, err)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestStartFailureAnswersWithRuntimeMessage: under a runtime that fails
// every start (loomfs-failstart, registered by scripts/setup), Run answers
// at once with ErrStartFailed and the runtime's message, host paths masked;
// the container is removed and the marker cleared.
func TestStartFailureAnswersWithRuntimeMessage(t *testing.T) {
	r := newTestRunner(t, Config{Runtime: "loomfs-failstart", CleanupTimeout: 10 * time.Second})
	req, m := newRequest(t, "echo hi")
	req.Timeout = 5 * time.Second
	began := time.Now()
	res, err := r.Run(context.Background(), req)
	if took := time.Since(began); took > req.Timeout+10*time.Second {
		t.Errorf("answered after %v", took)
	}
	if !errors.Is(err, ErrStartFailed) || !strings.Contains(err.Error(), "did not terminate successfully") ||
		strings.Contains(err.Error(), "/var/") || strings.Contains(err.Error(), "/usr/") {
		t.Fatalf("error %v", err)
	}
	if sets, clears := m.counts(); sets != 1 || clears != 1 {
		t.Errorf("marker set %d cleared %d, want 1 and 1", sets, clears)
	}
	assertGone(t, r, res.ContainerName)
}

// slowStartEngine serves the engine of HostFromEnv through a proxy that
// holds every container start request for delay before passing it on, as
// a loaded host's engine does, and returns the proxy's address.
func slowStartEngine(t *testing.T, delay time.Duration) string {
	return enginetest.Proxy(t, HostFromEnv(), func(_ http.ResponseWriter, r *http.Request) (bool, func()) {
		if enginetest.IsStart(r) {
			time.Sleep(delay)
		}
		return true, nil
	})
}

// TestStartPastTimeoutIsATimeout: an engine that takes longer than the
// command's whole time to start its container (a loaded host) gives a
// timed-out result, as the command would have had running that long, not
// a start failure; the container, which may start after all, is removed
// and the marker cleared.
func TestStartPastTimeoutIsATimeout(t *testing.T) {
	r := newTestRunner(t, Config{})
	slow, err := NewRunner(context.Background(), Config{Host: slowStartEngine(t, 2*time.Second), Image: r.cfg.Image, Node: testNode, Runtime: r.cfg.Runtime})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { slow.Close() })
	req, m := newRequest(t, "echo ran")
	req.Timeout = time.Second
	res, err := slow.Run(context.Background(), req)
	if err != nil {
		t.Fatalf("Run: %v (want a timed-out result)", err)
	}
	if !res.TimedOut || res.Cancelled {
		t.Fatalf("TimedOut=%v Cancelled=%v exit %d, want a timeout", res.TimedOut, res.Cancelled, res.ExitCode)
	}
	assertGone(t, r, res.ContainerName)
	if sets, clears := m.counts(); sets != 1 || clears != 1 {
		t.Fatalf("marker set %d cleared %d, want 1 and 1", sets, clears)
	}
}

// TestEngineBusyStartsNothing: with every start slot of the node held, a
// command waits for its time and is refused with ErrEngineBusy; nothing
// reached the engine and the marker is cleared. Once the slot is free the
// same command runs.
func TestEngineBusyStartsNothing(t *testing.T) {
	log := &eventLog{}
	dir := t.TempDir()
	r := newTestRunner(t, Config{Starts: 1, StartDir: dir, Observe: log.observe})
	release, err := slots.New(dir, 1).Take(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	req, m := newRequest(t, "echo ran")
	req.Timeout = time.Second
	m.log = log
	if _, err := r.Run(context.Background(), req); !errors.Is(err, ErrEngineBusy) || !strings.Contains(err.Error(), StartsEnv) {
		t.Fatalf("Run with the node's one slot held: %v, want ErrEngineBusy naming %s", err, StartsEnv)
	}
	if got, want := log.list(), []string{"marker_set", "container_engine_busy", "marker_clear"}; !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	release()
	req2, _ := newRequest(t, "echo ran")
	if res := mustRun(t, r, req2); res.Stdout != "ran\n" {
		t.Fatalf("after the slot was freed: %+v", res)
	}
	if sets, clears := m.counts(); sets != 1 || clears != 1 {
		t.Fatalf("marker set %d cleared %d, want 1 and 1", sets, clears)
	}
}

// countingEngine serves the engine of HostFromEnv through a proxy that
// holds every container start request for delay, and counts the
// containers between their create request and their start's answer: the
// most at once is what most returns.
func countingEngine(t *testing.T, delay time.Duration) (host string, most func() int) {
	var mu sync.Mutex
	now, peak := 0, 0
	host = enginetest.Proxy(t, HostFromEnv(), func(_ http.ResponseWriter, r *http.Request) (bool, func()) {
		switch {
		case enginetest.IsCreate(r):
			mu.Lock()
			now++
			peak = max(peak, now)
			mu.Unlock()
		case enginetest.IsStart(r):
			time.Sleep(delay)
			return true, func() {
				mu.Lock()
				now--
				mu.Unlock()
			}
		}
		return true, nil
	})
	return host, func() int {
		mu.Lock()
		defer mu.Unlock()
		return peak
	}
}

// TestStartsBounded: six commands at once on a node with two start slots
// reach the engine two at a time, and all of them run.
func TestStartsBounded(t *testing.T) {
	const starts, commands = 2, 6
	host, most := countingEngine(t, 300*time.Millisecond)
	r := newTestRunner(t, Config{})
	bounded, err := NewRunner(context.Background(), Config{Host: host, Image: r.cfg.Image, Node: testNode, Runtime: r.cfg.Runtime,
		Starts: starts, StartDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bounded.Close() })
	var wg sync.WaitGroup
	for i := range commands {
		req, _ := newRequest(t, "echo "+strconv.Itoa(i))
		wg.Go(func() {
			res, err := bounded.Run(context.Background(), req)
			if err != nil || res.Stdout != strconv.Itoa(i)+"\n" {
				t.Errorf("command %d: %+v, %v", i, res, err)
			}
		})
	}
	wg.Wait()
	if got := most(); got != starts {
		t.Fatalf("%d containers between create and start at once, want %d (the bound, reached)", got, starts)
	}
}

func TestStartsFromEnv(t *testing.T) {
	for _, tc := range []struct {
		env  string
		want int // 0: refused
	}{{"", DefaultStarts()}, {"3", 3}, {"1", 1}, {"0", 0}, {"-2", 0}, {"many", 0}} {
		t.Run(tc.env, func(t *testing.T) {
			t.Setenv(StartsEnv, tc.env)
			cfg, err := ConfigFromEnv().withDefaults()
			switch {
			case tc.want == 0 && (err == nil || !strings.Contains(err.Error(), StartsEnv)):
				t.Fatalf("%s=%q: %v, want an error naming the variable", StartsEnv, tc.env, err)
			case tc.want > 0 && (err != nil || cfg.Starts != tc.want || cfg.StartDir != DefaultStartDir):
				t.Fatalf("%s=%q: %d in %s, %v; want %d", StartsEnv, tc.env, cfg.Starts, cfg.StartDir, err, tc.want)
			}
		})
	}
}
