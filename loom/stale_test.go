package loom_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/loom"
	"github.com/agentloom/loomfs/store"
)

// mountedAt reports whether something is mounted at dir.
func mountedAt(t *testing.T, dir string) bool {
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

// fuseMount serves src at mp with bindfs (a FUSE daemon of its own) and
// returns it, unmounted in t.Cleanup.
func fuseMount(t *testing.T, src, mp string) *exec.Cmd {
	t.Helper()
	if _, err := exec.LookPath("bindfs"); err != nil {
		t.Fatalf("bindfs is needed (scripts/setup installs it): %v", err)
	}
	cmd := exec.Command("bindfs", "-f", src, mp)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		unix.Unmount(mp, unix.MNT_DETACH)
	})
	for deadline := time.Now().Add(10 * time.Second); !mountedAt(t, mp); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("bindfs did not mount")
		}
	}
	return cmd
}

// A worker killed with SIGKILL while it served a projection in the node's
// mount directory leaves a dead FUSE mount there; the next loomfs serve or
// mcp on the node detaches it when it starts (SweepStaleMounts) and
// removes its mountpoint. A live projection beside it is left alone.
func TestStaleProjectionDetachedAtStart(t *testing.T) {
	base := t.TempDir()
	mountDir, src := filepath.Join(base, "mnt"), filepath.Join(base, "src")
	for _, d := range []string{mountDir, src} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	dead, live := filepath.Join(mountDir, "ws-dead"), filepath.Join(mountDir, "ws-live")
	for _, d := range []string{dead, live} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	daemon := fuseMount(t, src, dead)
	fuseMount(t, src, live)
	daemon.Process.Kill()
	daemon.Wait()
	var st unix.Statfs_t
	if err := unix.Statfs(dead, &st); err != unix.ENOTCONN || !mountedAt(t, dead) {
		t.Fatalf("the killed daemon's mount: statfs %v, mounted %v; want a dead mount left", err, mountedAt(t, dead))
	}

	n := loom.New(loom.Config{Store: store.Config{Root: filepath.Join(base, "root")}, MountDir: mountDir})
	n.SweepStaleMounts()
	if err := n.Close(); err != nil { // waits for the sweep
		t.Fatal(err)
	}

	if mountedAt(t, dead) {
		t.Error("the dead projection is still mounted after the next start")
	}
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Errorf("the dead projection's mountpoint is still there: %v", err)
	}
	if !mountedAt(t, live) {
		t.Fatal("the live projection was detached")
	}
	if _, err := os.ReadDir(live); err != nil {
		t.Errorf("the live projection does not answer: %v", err)
	}
}
