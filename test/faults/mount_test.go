package faults

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// fusectl is where the kernel lists FUSE connections (TestMain mounts it
// if it is not).
const fusectl = "/sys/fs/fuse/connections"

// syncBuffer is a buffer a running process writes while the test reads it.
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

// daemon is a loomfs mount running in the background (under strace or not).
type daemon struct {
	x      *exec.Cmd
	mnt    string
	conn   string // the FUSE connection's control directory, once mounted
	stdout syncBuffer
	stderr syncBuffer
	done   chan struct{}
}

// startMount starts x (a loomfs mount of mnt) and waits until it says it
// is mounted or ends; ready reports which.
func startMount(x *exec.Cmd, mnt string) (d *daemon, ready bool) {
	return startMountWithin(x, mnt, 10*time.Second)
}

// startMountWithin is startMount waiting up to wait.
func startMountWithin(x *exec.Cmd, mnt string, wait time.Duration) (d *daemon, ready bool) {
	d = &daemon{x: x, mnt: mnt, done: make(chan struct{})}
	x.Stdout, x.Stderr = &d.stdout, &d.stderr
	x.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	x.WaitDelay = 5 * time.Second // a stuck thread of a killed daemon may hold its pipes
	if err := x.Start(); err != nil {
		d.stderr.Write([]byte("start: " + err.Error()))
		close(d.done)
		return d, false
	}
	go func() { x.Wait(); close(d.done) }()
	deadline := time.After(wait)
	for {
		if strings.Contains(d.stderr.String(), "mounted ") {
			return d, true
		}
		if d.conn == "" {
			d.conn = connection(mnt)
		}
		select {
		case <-d.done:
			return d, strings.Contains(d.stderr.String(), "mounted ")
		case <-deadline:
			return d, false
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// loomfsPID is the loomfs process of d: the process itself, or strace's
// child when it runs traced.
func (d *daemon) loomfsPID() int {
	if d.x.Process == nil {
		return 0
	}
	pid := d.x.Process.Pid
	if filepath.Base(d.x.Path) != "strace" {
		return pid
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	child, _ := strconv.Atoi(f[0])
	return child
}

// stop asks the mount to end (SIGTERM to loomfs) and waits for it within
// budget; past it the mount is hung, and is detached and killed.
func (d *daemon) stop(budget time.Duration) outcome {
	if pid := d.loomfsPID(); pid > 0 {
		syscall.Kill(pid, syscall.SIGTERM)
	}
	var o outcome
	select {
	case <-d.done:
	case <-time.After(budget):
		o.hung = true
		if d.conn == "" {
			d.conn = connection(d.mnt)
		}
		detach(d.mnt)
		if d.x.Process != nil {
			syscall.Kill(-d.x.Process.Pid, syscall.SIGKILL)
		}
		if d.conn != "" {
			abort(d.conn)
			d.stderr.Write([]byte("\n[faults: aborted FUSE connection " + filepath.Base(d.conn) + ", which a thread of the dead daemon kept waiting on its own mount]"))
		}
		select {
		case <-d.done:
		case <-time.After(10 * time.Second):
			o.exit, o.signal = -1, "none (unkillable: a thread waits in the kernel)"
			o.stderr = d.stderr.String()
			return o
		}
	}
	o.stdout, o.stderr = d.stdout.String(), d.stderr.String()
	if d.x.ProcessState == nil {
		o.exit = -1
		return o
	}
	ws := d.x.ProcessState.Sys().(syscall.WaitStatus)
	if ws.Signaled() {
		o.exit, o.signal = -1, ws.Signal().String()
	} else {
		o.exit = ws.ExitStatus()
	}
	return o
}

// connection is the control directory of the FUSE connection mounted at
// mnt (/sys/fs/fuse/connections/<minor>), "" if there is none. It reads the
// mount table, never the mount (a dead daemon's mount would not answer).
func connection(mnt string) string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 9 || unescapeMount(f[4]) != mnt {
			continue
		}
		_, minor, ok := strings.Cut(f[2], ":")
		if !ok {
			continue
		}
		dir := filepath.Join(fusectl, minor)
		if _, err := os.Stat(dir); err == nil {
			return dir
		}
	}
	return ""
}

// stuck reports whether the connection outlived its daemon with
// requests waiting on it: a thread of a killed daemon waits on a request
// to its own mount, so its /dev/fuse is never closed and nothing but an
// abort ends it. (A connection whose daemon is gone and that nothing
// waits on is only a mount not yet detached.)
func stuck(conn string) bool {
	if conn == "" {
		return false
	}
	b, err := os.ReadFile(filepath.Join(conn, "waiting"))
	if err != nil {
		return false
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if n == 0 {
		return false
	}
	// Mounted nowhere: not a live mount that took the number since.
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	return !strings.Contains(string(mi), " 0:"+filepath.Base(conn)+" ")
}

// abort ends a FUSE connection nothing else can end.
func abort(conn string) {
	if conn != "" {
		os.WriteFile(filepath.Join(conn, "abort"), []byte("1"), 0o200)
	}
}

// within runs fn, giving up on it after budget (a call into a hung mount
// can't be interrupted; detaching the mount ends it later).
func within(budget time.Duration, fn func() error) (err error, hung bool) {
	ch := make(chan error, 1)
	go func() { ch <- fn() }()
	select {
	case err := <-ch:
		return err, false
	case <-time.After(budget):
		return nil, true
	}
}

// clientStep is one step of a program using the mount.
type clientStep struct {
	name string
	fn   func(mnt string) error
}

var clientSteps = []clientStep{
	{"create a.txt, write, fsync", func(mnt string) error {
		f, err := os.OpenFile(filepath.Join(mnt, "a.txt"), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		_, err = f.WriteString("alpha\n")
		err = errors.Join(err, f.Sync())
		return errors.Join(err, f.Close())
	}},
	{"rename a.txt to b.txt", func(mnt string) error {
		return os.Rename(filepath.Join(mnt, "a.txt"), filepath.Join(mnt, "b.txt"))
	}},
	{"write c.txt", func(mnt string) error {
		return os.WriteFile(filepath.Join(mnt, "c.txt"), []byte("gamma\n"), 0o600)
	}},
	{"unlink c.txt", func(mnt string) error { return os.Remove(filepath.Join(mnt, "c.txt")) }},
	{"read x.txt", func(mnt string) error {
		b, err := os.ReadFile(filepath.Join(mnt, "x.txt"))
		if err == nil && string(b) != oldText {
			return fmt.Errorf("x.txt reads %q", b)
		}
		return err
	}},
}

// mountOp serves the scope through a traced mount while a program
// creates, writes, renames and unlinks through it; then the next mount of
// the scope on the same mount point must serve it.
func mountOp() op {
	var errs map[string]error
	var hung []string
	var first *daemon
	return op{
		door: "fuse", name: "create_write_rename_unlink",
		setup: func(c *cell) tree { return seed(c, map[string]string{"x.txt": oldText}) },
		do: func(c *cell) outcome {
			errs, hung = map[string]error{}, nil
			mnt := filepath.Join(c.dir, "mnt")
			os.Mkdir(mnt, 0o755)
			d, ready := startMount(c.traced("mount", "--scope", scope, mnt), mnt)
			first = d
			if ready {
				for _, s := range clientSteps {
					err, h := within(10*time.Second, func() error { return s.fn(mnt) })
					if h {
						hung = append(hung, s.name)
						detach(mnt) // ends the call, and the rest fail at once
						continue
					}
					errs[s.name] = err
				}
			}
			o := d.stop(15 * time.Second)
			c.ack = ready
			return o
		},
		held: func(c *cell, o outcome) []string {
			var bad []string
			mnt := filepath.Join(c.dir, "mnt")
			killed := c.f != nil && c.f.kill()
			for _, h := range hung {
				bad = append(bad, "a program's call into the mount hung: "+h)
			}
			for name, err := range errs {
				if err != nil && !killed && (errors.Is(err, syscall.ENOTCONN) || errors.Is(err, syscall.ECONNABORTED)) {
					bad = append(bad, fmt.Sprintf("%s: %v: the mount died under a fault it should have answered", name, err))
				}
			}
			t := c.tree()
			if errs[clientSteps[0].name] == nil && c.ack {
				// A rename answered is made; one that failed may still
				// have been made, when the daemon died after it and
				// before its answer: then the file is at either name.
				where := []string{"a.txt", "b.txt"}
				switch {
				case errs[clientSteps[1].name] == nil:
					where = []string{"b.txt"}
				case !killed:
					where = []string{"a.txt"}
				}
				found := 0
				for _, w := range where {
					if t[w] == "alpha\n" {
						found++
					}
				}
				if found != 1 {
					bad = append(bad, fmt.Sprintf("a.txt was fsynced through the mount, yet %s: %s", strings.Join(where, " or "), t))
				}
			}
			if s, ok := t["c.txt"]; ok && s != "" && s != "gamma\n" {
				bad = append(bad, fmt.Sprintf("c.txt is torn: %q", s))
			}
			if t["x.txt"] != oldText {
				bad = append(bad, fmt.Sprintf("x.txt changed: %q", t["x.txt"]))
			}
			if o.exit != 0 && c.ack && !killed && !o.hung {
				// A mount that served may still fail to close cleanly; say so.
				if !strings.Contains(o.stderr, "loomfs") && !strings.Contains(o.stderr, "error") {
					bad = append(bad, "the mount ended with status "+strconv.Itoa(o.exit)+" and no message")
				}
			}
			// The next mount on the same mount point serves the scope.
			d, ready := startMount(c.plain("mount", "--scope", scope, mnt), mnt)
			if !ready {
				d.stop(10 * time.Second)
				return append(bad, "the next mount of the scope did not start: "+clip(d.stderr.String()))
			}
			err, h := within(10*time.Second, func() error {
				return os.WriteFile(filepath.Join(mnt, "next.txt"), []byte("next\n"), 0o600)
			})
			if h || err != nil {
				bad = append(bad, fmt.Sprintf("a write through the next mount: %v (hung %v)", err, h))
			}
			if no := d.stop(30 * time.Second); no.exit != 0 {
				bad = append(bad, "the next mount did not end cleanly: "+no.String())
			}
			if mounted(mnt) {
				bad = append(bad, "a mount is left at the mount point")
				detach(mnt)
			}
			if stuck(first.conn) {
				bad = append(bad, "the faulted mount's FUSE connection outlived it with requests waiting (a thread of the killed daemon waits on its own mount; aborted)")
				abort(first.conn)
			}
			c.tool("workspace_delete", map[string]any{"path": "next.txt"})
			return bad
		},
	}
}
