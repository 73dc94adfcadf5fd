package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/store"
)

// TestMountHelperProcess is not a test: the mount tests run the loomfs
// command line in a child process by re-running this test binary with
// LOOMFS_TEST_MAIN=1 and the arguments after "--".
func TestMountHelperProcess(t *testing.T) {
	if os.Getenv("LOOMFS_TEST_MAIN") != "1" {
		return
	}
	os.Exit(run(flag.Args(), os.Stdout, os.Stderr))
}

// mountProc is a `loomfs mount` child process.
type mountProc struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	stderr bytes.Buffer
	ready  chan string // the "mounted" line
	done   chan error
}

// startMount runs `loomfs mount` over a volume at root and waits for its
// "mounted" line.
func startMount(t *testing.T, root, scope, mountpoint string, extra ...string) *mountProc {
	t.Helper()
	args := append([]string{"-test.run=^TestMountHelperProcess$", "--", "--backend", "local", "--root", root, "mount", "--scope", scope}, extra...)
	args = append(args, mountpoint)
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "LOOMFS_TEST_MAIN=1")
	pipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &mountProc{cmd: cmd, ready: make(chan string, 1), done: make(chan error, 1)}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.stderr.WriteString(line + "\n")
			p.mu.Unlock()
			if strings.HasPrefix(line, "mounted ") {
				p.ready <- line
			}
		}
		p.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
		}
		// A killed daemon's mount is stale: clear it.
		unix.Unmount(mountpoint, unix.MNT_DETACH)
	})
	select {
	case line := <-p.ready:
		t.Logf("%s", line)
		return p
	case err := <-p.done:
		t.Fatalf("loomfs mount exited before mounting: %v\n%s", err, p.output())
	case <-time.After(20 * time.Second):
		t.Fatalf("loomfs mount did not report ready:\n%s", p.output())
	}
	return nil
}

func (p *mountProc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

// wait waits for the process to exit and returns its exit code.
func (p *mountProc) wait(t *testing.T) int {
	t.Helper()
	select {
	case err := <-p.done:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-time.After(20 * time.Second):
		t.Fatalf("loomfs mount did not exit:\n%s", p.output())
	}
	return -1
}

// isMounted reports whether dir is a mountpoint in this namespace.
func isMounted(t *testing.T, dir string) bool {
	t.Helper()
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

// mountDirs makes a volume root and a mountpoint in a root-only directory.
func mountDirs(t *testing.T) (root, mnt string) {
	t.Helper()
	base := t.TempDir()
	if err := os.Chmod(base, 0o700); err != nil {
		t.Fatal(err)
	}
	root, mnt = filepath.Join(base, "volume"), filepath.Join(base, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	return root, mnt
}

const mountScope = "sp/ag/se"

func scopeDir(t *testing.T, root string) string {
	sc, err := store.ParseScope(mountScope)
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, sc.Dir())
}

// TestMountFollowLinks: with --follow-links a host-side mount follows the
// links made in the workspace (for a mount served to a container).
func TestMountFollowLinks(t *testing.T) {
	root, mnt := mountDirs(t)
	p := startMount(t, root, mountScope, mnt, "--follow-links")
	if err := os.WriteFile(filepath.Join(mnt, "file"), []byte("hi"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("file", filepath.Join(mnt, "link")); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(mnt, "link")); err != nil || string(b) != "hi" {
		t.Errorf("through the link: %q %v", b, err)
	}
	if fi, err := os.Lstat(filepath.Join(scopeDir(t, root), "link")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("backing store holds the link as %v %v", fi.Mode(), err)
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.wait(t); code != 0 {
		t.Fatalf("exit %d:\n%s", code, p.output())
	}
}

// TestMountCommand: serves, refuses what the policy refuses, unmounts
// cleanly on SIGTERM and on SIGINT, and records in the audit log.
func TestMountCommand(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			root, mnt := mountDirs(t)
			p := startMount(t, root, mountScope, mnt, "--allow-other")
			if err := os.WriteFile(filepath.Join(mnt, "hello.txt"), []byte("hi"), 0o644); err != nil {
				t.Fatal(err)
			}
			if b, err := os.ReadFile(filepath.Join(scopeDir(t, root), "hello.txt")); err != nil || string(b) != "hi" {
				t.Fatalf("backing file: %q %v", b, err)
			}
			// A link is made, but this host-side mount does not follow it
			// (no --follow-links): its target would be the host's.
			if err := os.Symlink("/etc/passwd", filepath.Join(mnt, "link")); err != nil {
				t.Errorf("symlink through loomfs mount: %v", err)
			}
			var en syscall.Errno
			if _, err := os.ReadFile(filepath.Join(mnt, "link")); !errors.As(err, &en) || en != syscall.EPERM {
				t.Errorf("following a link through a host-side mount: %v", err)
			}
			if err := p.cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			if code := p.wait(t); code != 0 {
				t.Fatalf("exit %d after %v:\n%s", code, sig, p.output())
			}
			if isMounted(t, mnt) {
				t.Errorf("%s still mounted after %v", mnt, sig)
			}
			if !strings.Contains(p.output(), "unmounted "+mnt) {
				t.Errorf("no unmount message:\n%s", p.output())
			}
			logs, _ := filepath.Glob(filepath.Join(root, ".agentloom-audit", "*"))
			var all []byte
			for _, l := range logs {
				b, _ := os.ReadFile(l)
				all = append(all, b...)
			}
			for _, want := range []string{`"op":"create"`, `"op":"symlink"`, `"op":"readlink"`, `"result":"refused"`, `"source":"fuse"`} {
				if !bytes.Contains(all, []byte(want)) {
					t.Errorf("audit log lacks %s", want)
				}
			}
		})
	}
}

// TestMountUsage: usage errors exit 2, refusals 1.
func TestMountUsage(t *testing.T) {
	root, mnt := mountDirs(t)
	open := filepath.Join(t.TempDir(), "open")
	if err := os.Mkdir(open, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(open, "mnt"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no scope", []string{"--root", root, "mount", mnt}, exitUsage, "--scope"},
		{"no mountpoint", []string{"--root", root, "mount", "--scope", mountScope}, exitUsage, "arg"},
		{"bad scope", []string{"--root", root, "mount", "--scope", "a/../b", mnt}, exitUsage, "id"},
		{"root uid", []string{"--root", root, "mount", "--scope", mountScope, "--uid", "0", mnt}, exitUsage, "never root"},
		{"no stop timeout", []string{"--root", root, "mount", "--scope", mountScope, "--stop-timeout", "0s", mnt}, exitUsage, "--stop-timeout"},
		{"missing mountpoint", []string{"--root", root, "mount", "--scope", mountScope, filepath.Join(mnt, "nope")}, exitRefused, "no such file"},
		{"allow-other in an open directory", []string{"--root", root, "mount", "--scope", mountScope, "--allow-other", filepath.Join(open, "mnt")}, exitRefused, "0700"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], append([]string{"-test.run=^TestMountHelperProcess$", "--", "--backend", "local"}, c.args...)...)
			cmd.Env = append(os.Environ(), "LOOMFS_TEST_MAIN=1")
			// Should a case mount after all, it must not hang the test.
			time.AfterFunc(20*time.Second, func() { cmd.Process.Signal(syscall.SIGTERM) })
			out, err := cmd.CombinedOutput()
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			}
			if code != c.code || !strings.Contains(string(out), c.want) {
				t.Errorf("exit %d, want %d with %q:\n%s", code, c.code, c.want, out)
			}
		})
	}
}

// version is the content of the n-th write of the crash test: a header,
// a body and the body's sha256, so a torn file is recognised.
func version(n int) []byte {
	body := bytes.Repeat([]byte(fmt.Sprintf("version %d|", n)), 20000)
	sum := sha256.Sum256(body)
	return append(append([]byte(fmt.Sprintf("v%d\n", n)), body...), []byte("\n"+hex.EncodeToString(sum[:])+"\n")...)
}

// whole reports which version b is, or -1 if it is none (torn).
func whole(b []byte) int {
	var n int
	if _, err := fmt.Sscanf(string(b), "v%d\n", &n); err != nil {
		return -1
	}
	if !bytes.Equal(b, version(n)) {
		return -1
	}
	return n
}

// TestMountCrash: kill -9 the daemon while a process writes through the
// mount with the atomic pattern (write a temporary file, fsync, rename over
// the target); the backing target holds one whole version, and the next
// `loomfs mount` at the same point clears the stale mount and serves it.
//
// A plain stream of write(2) calls through FUSE is not atomic (a crash
// leaves what reached the backing file so far, as on any filesystem); the
// rename is, because the daemon makes it with one renameat2 on the
// backing store.
func TestMountCrash(t *testing.T) {
	root, mnt := mountDirs(t)
	p := startMount(t, root, mountScope, mnt)
	target := filepath.Join(mnt, "target")
	if err := os.WriteFile(target, version(0), 0o600); err != nil {
		t.Fatal(err)
	}

	var written atomic.Int64
	stopped := make(chan error, 1)
	go func() {
		for n := 1; ; n++ {
			tmp := filepath.Join(mnt, fmt.Sprintf("target.tmp%d", n))
			f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err == nil {
				_, err = f.Write(version(n))
				if err == nil {
					err = f.Sync()
				}
				if cerr := f.Close(); err == nil {
					err = cerr
				}
			}
			if err == nil {
				err = os.Rename(tmp, target)
			}
			if err != nil {
				stopped <- err
				return
			}
			written.Store(int64(n))
		}
	}()
	for written.Load() < 5 {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(37 * time.Millisecond) // somewhere in the middle of a write
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.wait(t)
	select {
	case err := <-stopped:
		t.Logf("writer stopped after %d renames: %v", written.Load(), err)
	case <-time.After(10 * time.Second):
		t.Fatal("the writer did not notice the daemon died")
	}

	backing := filepath.Join(scopeDir(t, root), "target")
	b, err := os.ReadFile(backing)
	if err != nil {
		t.Fatal(err)
	}
	n := whole(b)
	if n < 0 {
		t.Fatalf("backing target is torn: %d bytes", len(b))
	}
	if int64(n) < written.Load() {
		t.Fatalf("backing target holds version %d, but version %d was renamed into place", n, written.Load())
	}
	t.Logf("backing target holds whole version %d", n)

	var st unix.Statfs_t
	if err := unix.Statfs(mnt, &st); err != unix.ENOTCONN {
		t.Fatalf("after the kill, statfs of the mountpoint: %v, want ENOTCONN (a stale mount)", err)
	}
	p2 := startMount(t, root, mountScope, mnt)
	if !strings.Contains(p2.output(), "recovered a stale mount") {
		t.Errorf("no word of the stale mount:\n%s", p2.output())
	}
	if b, err := os.ReadFile(target); err != nil || whole(b) != n {
		t.Fatalf("through the new mount: version %d, %v", whole(b), err)
	}
	if err := p2.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p2.wait(t); code != 0 {
		t.Fatalf("exit %d:\n%s", code, p2.output())
	}
	if isMounted(t, mnt) {
		t.Error("mount left behind")
	}
}

// TestSetProcs: a process serving a mount runs Go code on servingProcs
// CPUs for its volume's filesystem unless --procs or the GOMAXPROCS
// variable says otherwise; --procs wins.
func TestSetProcs(t *testing.T) {
	before := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(before) })
	local := t.TempDir()
	// A volume on a FUSE filesystem: a loomfs mount stands in for
	// ceph-fuse.
	root, mnt := mountDirs(t)
	startMount(t, root, mountScope, mnt)
	remote := filepath.Join(mnt, "volume")
	cases := []struct {
		args []string
		env  string
		root string
		want int
	}{
		{nil, "", local, servingProcs(cpusAllowed(), false)},
		{nil, "", remote, 3},
		{[]string{"--procs", "3"}, "", local, 3},
		{[]string{"--procs", "1"}, "", remote, 1},
		{nil, "5", remote, 5},
		{[]string{"--procs", "2"}, "5", local, 2},
		{[]string{"--procs", "0"}, "", local, 7}, // left as it was
	}
	for _, tc := range cases {
		runtime.GOMAXPROCS(7)
		if tc.env != "" {
			// As the runtime would have read it at start.
			runtime.GOMAXPROCS(atoi(t, tc.env))
		}
		t.Setenv("GOMAXPROCS", tc.env)
		cmd := &cobra.Command{Use: "x", Run: func(*cobra.Command, []string) {}}
		var procs int
		addProcsFlag(cmd.Flags(), &procs)
		if err := cmd.ParseFlags(tc.args); err != nil {
			t.Fatal(err)
		}
		setProcs(procs, cmd.Flags().Changed("procs"), tc.root)
		if got := runtime.GOMAXPROCS(0); got != tc.want {
			t.Errorf("%v with GOMAXPROCS=%q, volume at %s: %d procs, want %d", tc.args, tc.env, tc.root, got, tc.want)
		}
	}
}

// TestServingProcs: one P, but a process allowed on one CPU only or
// serving a volume on a remote filesystem gets three, and cpusAllowed
// sees the affinity it is given.
func TestServingProcs(t *testing.T) {
	for _, tc := range []struct {
		cpus   int
		remote bool
		want   int
	}{
		{0, false, 1}, {1, false, 3}, {2, false, 1}, {64, false, 1},
		{0, true, 3}, {1, true, 3}, {2, true, 3}, {64, true, 3},
	} {
		if got := servingProcs(tc.cpus, tc.remote); got != tc.want {
			t.Errorf("servingProcs(%d, %v) = %d, want %d", tc.cpus, tc.remote, got, tc.want)
		}
	}

	// Affinity is per thread: pin this one, and let it end with the test
	// rather than return it to the runtime pinned.
	runtime.LockOSThread()
	var all unix.CPUSet
	if err := unix.SchedGetaffinity(0, &all); err != nil {
		t.Fatal(err)
	}
	if got := cpusAllowed(); got != all.Count() {
		t.Errorf("cpusAllowed() = %d, want %d", got, all.Count())
	}
	var one unix.CPUSet
	for cpu := 0; cpu < 1024; cpu++ {
		if all.IsSet(cpu) {
			one.Set(cpu)
			break
		}
	}
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		t.Fatal(err)
	}
	if got := cpusAllowed(); got != 1 {
		t.Errorf("pinned to one CPU: cpusAllowed() = %d, want 1", got)
	}
}

// TestRemoteFS: a FUSE mount, and a path not yet made under it, are on a
// remote filesystem; a local directory is not.
func TestRemoteFS(t *testing.T) {
	root, mnt := mountDirs(t)
	startMount(t, root, mountScope, mnt)
	for _, tc := range []struct {
		path string
		want bool
	}{
		{mnt, true},
		{filepath.Join(mnt, "not", "yet"), true},
		{root, false},
		{filepath.Join(root, "not", "yet"), false},
	} {
		if got := remoteFS(tc.path); got != tc.want {
			t.Errorf("remoteFS(%s) = %v, want %v", tc.path, got, tc.want)
		}
	}
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
