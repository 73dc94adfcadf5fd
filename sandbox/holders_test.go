package sandbox

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestLeftoversOfContainer: a process whose command line names a removed
// container's id counts as its leftover, with its start time, until it is
// gone; a zombie is gone.
func TestLeftoversOfContainer(t *testing.T) {
	id := strconv.FormatInt(time.Now().UnixNano(), 10) // unique, as a container id is
	p := exec.Command("sleep", "600", id)
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	defer p.Process.Kill()
	got, err := Holders("", 0, id)
	if err != nil || len(got) != 1 || got[0].PID != p.Process.Pid || got[0].Cmdline != "sleep 600 "+id || got[0].Start == 0 {
		t.Fatalf("Holders: %+v %v", got, err)
	}
	if !HolderAlive(got[0]) {
		t.Fatal("a running holder counts as gone")
	}
	if names := holderNames(got); names != "sleep (pid "+strconv.Itoa(p.Process.Pid)+")" {
		t.Errorf("holderNames %q", names)
	}
	stale := got[0]
	stale.Start++
	if HolderAlive(stale) {
		t.Error("a holder with another start time (a reused pid) counts as alive")
	}
	p.Process.Kill()
	time.Sleep(100 * time.Millisecond) // a zombie now: not yet waited for
	if HolderAlive(got[0]) {
		t.Error("a zombie counts as a live holder")
	}
	p.Wait()
	if got, _ := Holders("", 0, id); len(got) != 0 {
		t.Errorf("after the kill: %+v", got)
	}
}

// TestHoldersByNamespace: another mount namespace holds a mount when its
// copy is its own (what a runtime's helper gets). A copy that receives
// propagation from this one (a container runtime's init has one of every
// projection, mounted on its shared mountpoint, until it pivots; so has a
// service's namespace on a host whose / is shared) goes when the mount
// goes, and holds it only while a process there uses it.
func TestHoldersByNamespace(t *testing.T) {
	dir, err := os.MkdirTemp(t.TempDir(), "ws-")
	if err != nil {
		t.Fatal(err)
	}
	if err := shareMountpoint(dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeMountpoint(dir) })
	if err := unix.Mount("loomfs-test", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatalf("mount: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	start := func(args ...string) *exec.Cmd {
		c := exec.Command("unshare", append([]string{"--mount"}, append(args, "sleep", "600")...)...)
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Process.Kill(); c.Wait() })
		return c
	}
	cases := []struct {
		name string
		cmd  *exec.Cmd
		held bool
	}{
		{"a slave copy nobody uses", start("--propagation", "slave"), false},
		{"a peer copy nobody uses", start("--propagation", "unchanged"), false},
		{"a slave copy a process works in", start("--propagation", "slave", "--wd", dir), true},
		{"a private copy", start("--propagation", "private"), true},
	}
	// unshare execs sleep once the namespace is set up.
	for _, c := range cases {
		for i := 0; i < 100; i++ {
			if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", c.cmd.Process.Pid)); strings.TrimSpace(string(b)) == "sleep" {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	hs, err := Holders(dir, st.Dev, "")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, h := range hs {
		pids = append(pids, h.PID)
	}
	for _, c := range cases {
		if got := slices.Contains(pids, c.cmd.Process.Pid); got != c.held {
			t.Errorf("%s (pid %d): held %v, want %v (holders %v)", c.name, c.cmd.Process.Pid, got, c.held, pids)
		}
	}
	// What makes the unused copies no holders: they go with the mount.
	if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases[:2] {
		if mids := mountIDs(fmt.Sprintf("/proc/%d/mountinfo", c.cmd.Process.Pid), st.Dev); len(mids) != 0 {
			t.Errorf("%s: still mounted there after the unmount here", c.name)
		}
	}
}
