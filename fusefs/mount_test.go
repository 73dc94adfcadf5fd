package fusefs

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

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
	if got := e.sink.find("create", "ok", ""); len(got) != 1 || !strings.HasPrefix(got[0].Path, ".loomfs-probe-") {
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
