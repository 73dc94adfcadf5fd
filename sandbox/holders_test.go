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

// TestHoldersByNamespace: another mount namespace holds a mount only when
// its copy is its own: a copy that receives propagation from this one (a
// service's namespace on a host whose / is shared) goes when the mount
// goes, and is no holder; a private copy (what a runtime's helper gets) is.
func TestHoldersByNamespace(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mount("loomfs-test", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatalf("mount: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	if err := unix.Mount("", dir, "", unix.MS_SHARED, ""); err != nil {
		t.Fatalf("make shared: %v", err)
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	start := func(propagation string) *exec.Cmd {
		c := exec.Command("unshare", "--mount", "--propagation", propagation, "sleep", "600")
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Process.Kill(); c.Wait() })
		return c
	}
	slave := start("slave")
	private := start("private")
	// unshare execs sleep once the namespace is set up.
	for _, c := range []*exec.Cmd{slave, private} {
		for i := 0; i < 100; i++ {
			if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", c.Process.Pid)); strings.TrimSpace(string(b)) == "sleep" {
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
	if !slices.Contains(pids, private.Process.Pid) || slices.Contains(pids, slave.Process.Pid) {
		t.Errorf("holders %v; want the private namespace's %d and not the slave's %d", pids, private.Process.Pid, slave.Process.Pid)
	}
}
