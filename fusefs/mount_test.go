package fusefs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// TestProbe: the health probe goes through the mount and leaves nothing
// behind; it fails when the mount can't take writes.
func TestProbe(t *testing.T) {
	e := newEnv(t)
	if err := e.m.Probe(context.Background()); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(e.backing); len(ents) != 0 {
		t.Errorf("the probe left %v", ents)
	}
	if got := e.sink.find("create", "ok", ""); len(got) != 1 || !strings.HasPrefix(got[0].Path, policy.ProbePrefix) {
		t.Errorf("the probe's create was not recorded through the mount: %+v", got)
	}
	if err := e.ws.Quarantine(store.Marker{Container: "c"}, "test"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(quarantineRecheck + 100*time.Millisecond)
	if err := e.m.Probe(context.Background()); err == nil {
		t.Error("probe passed on a quarantined scope")
	}
}

// TestProbesAtOnce: probes of one mount at once (a service's self-check
// beside a sandbox start's) all pass: the daemon admits one probe file at
// a time, so they take turns, and a probe that can't get its turn before
// its context ends says why.
func TestProbesAtOnce(t *testing.T) {
	e := newEnv(t)
	errs := make(chan error, 4)
	for range 4 {
		go func() { errs <- e.m.Probe(context.Background()) }()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Errorf("a probe beside three others: %v", err)
		}
	}
	if ents, _ := os.ReadDir(e.backing); len(ents) != 0 {
		t.Errorf("the probes left %v", ents)
	}
	e.m.probeSlot <- struct{}{} // a probe under way
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := e.m.Probe(ctx); err == nil || !strings.Contains(err.Error(), "another probe") {
		t.Errorf("a probe whose turn did not come: %v, want it to say another probe was under way", err)
	}
	<-e.m.probeSlot
	if err := e.m.Probe(context.Background()); err != nil {
		t.Errorf("a probe after its turn came: %v", err)
	}
}

// TestReadOnlyMount: Options.ReadOnly refuses every change and reads.
func TestReadOnlyMount(t *testing.T) {
	e := newEnv(t, withOptions(func(o *Options) { o.ReadOnly = true }))
	mustWrite(t, e.host("f"), "content")
	if b, err := os.ReadFile(e.path("f")); err != nil || string(b) != "content" {
		t.Fatalf("read: %q %v", b, err)
	}
	for _, cmd := range []string{"touch g", "echo x >> f", "rm f", "mkdir d"} {
		if out, err := runIn(t, e.mnt, cmd); err == nil || !strings.Contains(strings.ToLower(out), "read-only") {
			t.Errorf("%q on a read-only mount: %v %s", cmd, err, out)
		}
	}
}

// TestUserXattrs: with Options.UserXattrs, "user." works and every other
// namespace is still refused.
func TestUserXattrs(t *testing.T) {
	e := newEnv(t, withOptions(func(o *Options) { o.UserXattrs = true }))
	mustWrite(t, e.path("f"), "x")
	if out, err := runIn(t, e.mnt, "setfattr -n user.note -v hello f && getfattr --only-values -n user.note f"); err != nil || !strings.Contains(out, "hello") {
		t.Fatalf("user xattr: %v %s", err, out)
	}
	for _, name := range []string{"security.x", "trusted.x"} {
		out, err := runIn(t, e.mnt, "setfattr -n "+name+" -v 1 f")
		if err == nil || !strings.Contains(out, "Operation not supported") {
			t.Errorf("setfattr %s: %v %s", name, err, out)
		}
	}
	// Only the user namespace of the backing file is listed.
	if err := unix.Setxattr(e.host("f"), "trusted.hidden", []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1024)
	sz, err := unix.Listxattr(e.path("f"), buf)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(buf[:sz]); got != "user.note\x00" {
		t.Errorf("listxattr %q", got)
	}
	if len(e.sink.find("setxattr", "refused", "f")) != 2 {
		t.Errorf("namespace refusals not all recorded")
	}
}

// TestStatfs: df in the sandbox shows the scope quota.
func TestStatfs(t *testing.T) {
	e := newEnv(t, withLimits(testLimits))
	mustWrite(t, e.path("f"), string(make([]byte, 1<<20)))
	var st unix.Statfs_t
	if err := unix.Statfs(e.mnt, &st); err != nil {
		t.Fatal(err)
	}
	total, free := st.Blocks*uint64(st.Bsize), st.Bavail*uint64(st.Bsize)
	if total != testScopeLimit || free != testScopeLimit-1<<20 {
		t.Errorf("statfs shows %d bytes, %d free; want the quota %d with %d free", total, free, testScopeLimit, testScopeLimit-1<<20)
	}
}

// TestUnmountWhileFollowerWaitsOnAWrite: a drop of the follower waits for
// the page lock of a write the mount is serving (here one the scope's
// io_bytes_per_s holds back for a minute; on a slow backing store, one
// the store holds back). Unmount does not wait for that drop while the
// session lives: it cuts the writer off, and the drop ends with the
// session.
func TestUnmountWhileFollowerWaitsOnAWrite(t *testing.T) {
	base := t.TempDir()
	os.Chmod(base, 0o700)
	ctx := context.Background()
	vol, err := store.OpenVolume(ctx, store.Config{Root: filepath.Join(base, "volume")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vol.Close() })
	pol := policy.Default()
	pol.Limits.IOBytesPerSec = 4 << 10
	ws, err := vol.Open(ctx, testScope, pol)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	if _, err := ws.WriteFile(ctx, "f", []byte("old"), nil); err != nil {
		t.Fatal(err)
	}
	mnt := filepath.Join(base, "mnt")
	os.Mkdir(mnt, 0o755)
	m, err := Mount(ctx, ws, mnt, Options{Audit: &recorder{}})
	if err != nil {
		t.Fatal(err)
	}
	mountsMu.Lock()
	mounted = append(mounted, m.Dir())
	mountsMu.Unlock()
	unmounted := make(chan error, 1)
	t.Cleanup(func() {
		select {
		case <-unmounted:
		case <-time.After(time.Minute):
		}
	})
	if m.follower == nil {
		t.Fatal("the mount has no follower")
	}
	// Another door changes f in place while the write is held back.
	m2 := secondMount(t, &env{vol: vol, mnt: mnt})

	f, err := os.OpenFile(filepath.Join(m.Dir(), "f"), os.O_WRONLY, 0)
	if err != nil {
		m.Unmount()
		t.Fatal(err)
	}
	wrote := make(chan error, 1)
	go func() {
		// One request, a minute's worth: the kernel holds the lock of
		// its last page, which it only partly fills, until it is
		// answered (whole pages it unlocks at once).
		_, err := f.Write(make([]byte, 60*4096+100))
		f.Close()
		wrote <- err
	}()
	time.Sleep(200 * time.Millisecond) // the write is in the daemon
	before := m.fsys.drops.Load()
	if err := os.Chmod(filepath.Join(m2, "f"), 0o640); err != nil {
		t.Fatal(err)
	}
	// The follower drops f and waits in the kernel, in its pass.
	inPass := func() bool {
		if m.follower.mu.TryLock() {
			m.follower.mu.Unlock()
			return false
		}
		return true
	}
	for deadline := time.Now().Add(5 * time.Second); m.fsys.drops.Load() == before || !inPass(); {
		if time.Now().After(deadline) {
			m.Unmount()
			t.Fatal("the follower never waited for the write: the test proves nothing")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	if !inPass() {
		m.Unmount()
		t.Fatal("the follower's pass did not wait for the write: the test proves nothing")
	}

	start := time.Now()
	go func() { unmounted <- m.Unmount() }()
	select {
	case err := <-unmounted:
		unmounted <- err
		if !errors.Is(err, ErrDetached) {
			t.Errorf("unmount with a write in flight: %v, want ErrDetached", err)
		}
		t.Logf("unmounted %v after the follower began to wait", time.Since(start).Round(time.Millisecond))
	case <-time.After(10 * time.Second):
		m.Detach()
		t.Fatal("Unmount waited for the follower, which waited for the write it serves")
	}
	if err := <-wrote; err == nil {
		t.Error("the cut-off write succeeded")
	}
}

// TestUnmountAfterAbortLeavesNoDeadMount: a mount whose connection was
// aborted from outside while in use (a sandbox cuts off a projection's
// holders so) is dead but still in the namespace; Unmount takes it out
// instead of leaving a mount that answers ENOTCONN.
func TestUnmountAfterAbortLeavesNoDeadMount(t *testing.T) {
	e := newEnv(t)
	held, err := os.Open(e.mnt) // keeps the mount busy
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	unix.Unmount(e.mnt, unix.MNT_FORCE) // busy: aborts the connection, stays mounted
	select {
	case <-e.m.ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the forced unmount did not end the session")
	}
	if err := e.m.Unmount(); err != nil {
		t.Fatalf("Unmount of an aborted mount: %v", err)
	}
	mounts, _ := os.ReadFile("/proc/self/mounts")
	if strings.Contains(string(mounts), " "+e.mnt+" ") {
		t.Fatalf("%s is still mounted after Unmount", e.mnt)
	}
}
