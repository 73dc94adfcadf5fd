package sandbox

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/fusefs"
	"github.com/agentloom/loomfs/store"
	"github.com/agentloom/loomfs/tools"
)

// servedMount is a fusefs mount a Pool may keep, as cmd/loomfs wires it.
type servedMount struct{ *fusefs.Mounted }

func (s servedMount) Serve(call CallInfo) {
	s.Mounted.Serve(fusefs.Call{CallID: call.CallID, Container: call.Container, Refused: func(r fusefs.Refusal) {
		if call.Refused != nil {
			call.Refused(tools.PolicyEvent{Op: r.Op, Path: r.Path, Code: string(r.Code), Message: r.Message})
		}
	}})
}

// TestPoolReusesProjection: the commands of one workspace run over one
// projection, mounted once; each sees what the tool door wrote before it,
// reports only its own refusals, and the projection goes at Close.
func TestPoolReusesProjection(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	if err := os.Chmod(base, 0o700); err != nil {
		t.Fatal(err)
	}
	vol, err := store.OpenVolume(ctx, store.Config{Root: filepath.Join(base, "volume")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vol.Close() })
	ws, err := vol.Open(ctx, store.Scope{Space: "s", Agent: "a", Session: "pool"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	mounts := 0
	pool := &Pool{Dir: filepath.Join(base, "mnt"), Mount: func(ctx context.Context, ws *store.Workspace, mp string, call CallInfo) (Projection, error) {
		mounts++
		m, err := fusefs.Mount(ctx, ws, mp, fusefs.Options{AllowOther: true, CallID: call.CallID})
		if err != nil {
			return nil, err
		}
		return servedMount{m}, nil
	}}
	cmds := &Commands{Runner: newTestRunner(t, Config{}), Pool: pool, Run: "r1"}
	t.Cleanup(func() { pool.Close() })

	run := func(call, command string) tools.CommandResult {
		t.Helper()
		res, err := cmds.RunCommand(ctx, ws, tools.CommandRequest{CallID: call, Command: command})
		if err != nil {
			t.Fatalf("%s: %v", command, err)
		}
		return res
	}
	for i, content := range []string{"first", "other", "third"} {
		// Same size each time: only the journal tells the mount.
		if _, err := ws.WriteFile(ctx, "f", []byte(content), nil); err != nil {
			t.Fatal(err)
		}
		if res := run("c"+content, "cat f"); res.Stdout != content {
			t.Fatalf("command %d reads %q, want %q", i, res.Stdout, content)
		}
	}
	refused := run("refused", "ln f g; echo made > h")
	if len(refused.PolicyEvents.Events) == 0 {
		t.Fatalf("ln through the projection was not reported: %+v", refused.PolicyEvents)
	}
	if b, _, err := ws.ReadFile(ctx, "h"); err != nil || strings.TrimSpace(string(b)) != "made" {
		t.Fatalf("tools read what the command wrote: %q %v", b, err)
	}
	if res := run("after", "cat h"); len(res.PolicyEvents.Events) != 0 {
		t.Fatalf("the next command reports the last one's refusals: %+v", res.PolicyEvents)
	}
	if mounts != 1 || pool.Live() != 1 {
		t.Fatalf("%d mounts for 5 commands, %d live; want 1 and 1", mounts, pool.Live())
	}
	if err := pool.Close(); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(pool.Dir); pool.Live() != 0 || len(ents) != 0 {
		t.Fatalf("after Close: %d live, %d mountpoints left", pool.Live(), len(ents))
	}
	if _, err := cmds.RunCommand(ctx, ws, tools.CommandRequest{CallID: "late", Command: "true"}); err == nil {
		t.Fatal("a command after Close ran")
	}
}

// fakeProjection stands for a mount in the pool's unit test.
type fakeProjection struct {
	dir       string
	unmounted *int
	served    *[]string
}

func (f fakeProjection) Dir() string                 { return f.dir }
func (f fakeProjection) Probe(context.Context) error { return nil }
func (f fakeProjection) Unmount() error              { *f.unmounted++; return nil }
func (f fakeProjection) Serve(c CallInfo)            { *f.served = append(*f.served, c.CallID) }

// TestPoolLifetime: a projection given back is lent again, one left idle
// is unmounted, one discarded is not kept, and Close unmounts what is left.
func TestPoolLifetime(t *testing.T) {
	ctx := context.Background()
	var mounted, unmounted int
	var served []string
	pool := &Pool{Dir: t.TempDir(), Idle: time.Hour, Mount: func(ctx context.Context, ws *store.Workspace, mp string, call CallInfo) (Projection, error) {
		mounted++
		tmpfsAt(t, mp)
		return fakeProjection{dir: mp, unmounted: &unmounted, served: &served}, nil
	}}
	ws1, ws2 := &store.Workspace{}, &store.Workspace{}
	l, err := pool.Acquire(ctx, ws1, CallInfo{CallID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	l.Release()
	if l, err = pool.Acquire(ctx, ws1, CallInfo{CallID: "b"}); err != nil || l.Reused() != 1 {
		t.Fatalf("second lease: reused %d, %v", l.Reused(), err)
	}
	if mounted != 1 || len(served) != 1 || served[0] != "b" {
		t.Fatalf("mounted %d, served %v; want 1 and [b]", mounted, served)
	}
	// Another workspace gets its own.
	other, err := pool.Acquire(ctx, ws2, CallInfo{CallID: "c"})
	if err != nil || mounted != 2 || pool.Live() != 2 {
		t.Fatalf("second workspace: mounted %d, live %d, %v", mounted, pool.Live(), err)
	}
	// Held by a process: discarded, and the next command mounts anew.
	l.Discard()
	l.Unmount()
	if pool.Live() != 1 || unmounted != 1 {
		t.Fatalf("after Discard: live %d, unmounted %d", pool.Live(), unmounted)
	}
	// Idle: unmounted by the timer.
	var idleGone atomic.Int32
	idlePool := &Pool{Dir: t.TempDir(), Idle: time.Millisecond, Mount: func(ctx context.Context, ws *store.Workspace, mp string, call CallInfo) (Projection, error) {
		tmpfsAt(t, mp)
		return countingUnmount{fakeProjection{dir: mp, unmounted: new(int), served: &[]string{}}, &idleGone}, nil
	}}
	il, err := idlePool.Acquire(ctx, ws1, CallInfo{})
	if err != nil {
		t.Fatal(err)
	}
	il.Release()
	deadline := time.Now().Add(5 * time.Second)
	for idlePool.Live() != 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	for idleGone.Load() != 1 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if idlePool.Live() != 0 || idleGone.Load() != 1 {
		t.Fatalf("after the idle time: live %d, unmounted %d", idlePool.Live(), idleGone.Load())
	}
	other.Release()
	l, _ = pool.Acquire(ctx, ws1, CallInfo{CallID: "d"})
	l.Release()
	if err := pool.Close(); err != nil || unmounted != 3 || pool.Live() != 0 {
		t.Fatalf("Close: %v, unmounted %d, live %d", err, unmounted, pool.Live())
	}
	if _, err := pool.Acquire(ctx, ws1, CallInfo{}); err == nil {
		t.Fatal("lease after Close")
	}
}

// tmpfsAt mounts a small tmpfs at mp for the test's life: the pool makes
// what it is given shared, which only a mount can be.
func tmpfsAt(t *testing.T, mp string) {
	t.Helper()
	if err := unix.Mount("loomfs-test", mp, "tmpfs", 0, "size=64k"); err != nil {
		t.Fatalf("mount: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(mp, unix.MNT_DETACH) })
}

type countingUnmount struct {
	fakeProjection
	n *atomic.Int32
}

func (c countingUnmount) Unmount() error { c.n.Add(1); return nil }

// BenchmarkWorkspaceCommand: "true" as a workspace_command, over the
// pool's live projection and over one mounted, probed and unmounted for
// the command alone. bench/warm.sh sets it beside docker run --rm.
func BenchmarkWorkspaceCommand(b *testing.B) {
	ctx := context.Background()
	base := b.TempDir()
	os.Chmod(base, 0o700)
	vol, err := store.OpenVolume(ctx, store.Config{Root: filepath.Join(base, "volume")})
	if err != nil {
		b.Fatal(err)
	}
	defer vol.Close()
	ws, err := vol.Open(ctx, store.Scope{Space: "s", Agent: "a", Session: "bench"}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer ws.Close()
	mount := func(ctx context.Context, ws *store.Workspace, mp string, call CallInfo) (Projection, error) {
		m, err := fusefs.Mount(ctx, ws, mp, fusefs.Options{AllowOther: true, CallID: call.CallID})
		if err != nil {
			return nil, err
		}
		return servedMount{m}, nil
	}
	r, err := NewRunner(ctx, Config{Host: HostFromEnv(), Image: ImageFromEnv(), Node: testNode})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	for _, c := range []struct {
		name string
		cmds *Commands
	}{
		{"pooled", &Commands{Runner: r, Pool: &Pool{Mount: mount, Dir: filepath.Join(base, "pool")}}},
		{"per-call", &Commands{Runner: r, Mount: mount, MountDir: filepath.Join(base, "each")}},
	} {
		b.Run(c.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				if _, err := c.cmds.RunCommand(ctx, ws, tools.CommandRequest{CallID: fmt.Sprint(c.name, i), Command: "true"}); err != nil {
					b.Fatal(err)
				}
			}
		})
		if c.cmds.Pool != nil {
			c.cmds.Pool.Close()
		}
	}
}

// TestRuntimeCopyIsNoHolder: a container runtime starting another
// container while a command runs takes a copy of every mount, the
// command's projection included, into its new namespace (made a slave, as
// runc makes it, until it pivots). A copy still there when the command
// ends is no holder: the command answers and the scope is not quarantined,
// pooled or mounted per command, and the projection is unmounted at the end.
func TestRuntimeCopyIsNoHolder(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	if err := os.Chmod(base, 0o700); err != nil {
		t.Fatal(err)
	}
	vol, err := store.OpenVolume(ctx, store.Config{Root: filepath.Join(base, "volume")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vol.Close() })
	mount := func(ctx context.Context, ws *store.Workspace, mp string, call CallInfo) (Projection, error) {
		m, err := fusefs.Mount(ctx, ws, mp, fusefs.Options{AllowOther: true, CallID: call.CallID})
		if err != nil {
			return nil, err
		}
		return servedMount{m}, nil
	}
	r := newTestRunner(t, Config{})
	for _, tc := range []struct {
		name string
		dir  string
		cmds *Commands
	}{
		{"pooled", filepath.Join(base, "pool"), &Commands{Runner: r, Pool: &Pool{Mount: mount, Dir: filepath.Join(base, "pool")}}},
		{"per-call", filepath.Join(base, "each"), &Commands{Runner: r, Mount: mount, MountDir: filepath.Join(base, "each")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws, err := vol.Open(ctx, store.Scope{Space: "s", Agent: "a", Session: tc.name}, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ws.Close() })
			copied := make(chan *exec.Cmd, 1)
			go func() {
				// Once the projection is mounted, a namespace takes its copy.
				for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
					if mounted(tc.dir) {
						break
					}
				}
				c := exec.Command("unshare", "--mount", "--propagation", "slave", "sleep", "600")
				if err := c.Start(); err != nil {
					copied <- nil
					return
				}
				copied <- c
			}()
			res, err := tc.cmds.RunCommand(ctx, ws, tools.CommandRequest{CallID: "c1", Command: "sleep 2; echo done"})
			c := <-copied
			if c == nil {
				t.Fatal("unshare did not start")
			}
			t.Cleanup(func() { c.Process.Kill(); c.Wait() })
			if err != nil || res.Stdout != "done\n" {
				t.Fatalf("with a runtime's copy of the projection alive: %+v, %v", res, err)
			}
			if err := ws.CheckQuarantine(); err != nil {
				t.Fatalf("quarantined: %v", err)
			}
			if tc.cmds.Pool != nil {
				tc.cmds.Pool.Close()
			}
			if mounted(tc.dir) {
				t.Fatal("the projection is still mounted")
			}
		})
	}
}

// mounted reports whether anything is mounted under dir in this namespace.
func mounted(dir string) bool {
	data, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			return true
		}
	}
	return false
}

// TestSweepPassesOverStuckMount: a projection whose daemon does not answer
// (stuck, or dying while blocked on a file open through its own mount) does
// not stall the sweep that every command's mount begins with; a dead one
// beside it is still detached and its mountpoint removed, and so is an old
// bare bind a killed worker left, but not a fresh one.
func TestSweepPassesOverStuckMount(t *testing.T) {
	dir := t.TempDir()
	rawMount := func(name string) (mp string, dev *os.File) {
		mp = filepath.Join(dir, name)
		if err := os.Mkdir(mp, 0o700); err != nil {
			t.Fatal(err)
		}
		dev, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		// Nobody reads dev: the session never starts, and every request waits.
		opts := fmt.Sprintf("fd=%d,rootmode=40000,user_id=0,group_id=0", dev.Fd())
		if err := unix.Mount("loomfs-test", mp, "fuse", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
			dev.Close()
			t.Fatalf("mount: %v", err)
		}
		t.Cleanup(func() { dev.Close(); unix.Unmount(mp, unix.MNT_DETACH) })
		return mp, dev
	}
	// A bare bind of a killed worker, and one a worker is about to mount on.
	left, fresh := filepath.Join(dir, "ws-left"), filepath.Join(dir, "ws-fresh")
	for _, mp := range []string{left, fresh} {
		if err := os.Mkdir(mp, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := shareMountpoint(mp); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Unmount(mp, unix.MNT_DETACH) })
	}
	old := time.Now().Add(-2 * leftBindAge)
	if err := os.Chtimes(left, old, old); err != nil {
		t.Fatal(err)
	}
	stuck, _ := rawMount("ws-stuck")
	dead, deadDev := rawMount("ws-dead")
	deadDev.Close() // its daemon is gone: ENOTCONN
	swept := make(chan time.Duration, 1)
	began := time.Now()
	go func() {
		sweepStaleMounts(dir)
		swept <- time.Since(began)
	}()
	select {
	case took := <-swept:
		if took > sweepWait+2*time.Second {
			t.Errorf("the sweep took %v", took)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the sweep waits for a mount that does not answer")
	}
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Errorf("the dead mount's mountpoint is still there: %v", err)
	}
	if _, err := os.Stat(left); !os.IsNotExist(err) {
		t.Errorf("the old bare bind is still there: %v", err)
	}
	mounts := mustRead(t, "/proc/self/mountinfo")
	if !strings.Contains(mounts, " "+stuck+" ") || !strings.Contains(mounts, " "+fresh+" ") {
		t.Error("the mount that does not answer, or a fresh bind, was taken down")
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
