package sandbox

import (
	"os/exec"
	"strconv"
	"testing"
	"time"
)

func TestMaskHostPaths(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`OCI runtime create failed: unable to retrieve OCI runtime error (open /var/run/docker/containerd/daemon/x/log.json: no such file or directory): /usr/local/lib/loomfs/runtime-failstart did not terminate successfully: exit status 1: unknown`,
			`OCI runtime create failed: unable to retrieve OCI runtime error (open <path>: no such file or directory): <path> did not terminate successfully: exit status 1: unknown`},
		{`creating interfaces from net namespace "/proc/18572/ns/net": cannot run with network enabled in root network namespace: unknown`,
			`creating interfaces from net namespace "<path>": cannot run with network enabled in root network namespace: unknown`},
		{`path=/srv/x,other`, `path=<path>,other`},
		{`exit status 1`, `exit status 1`},
		{`a/b relative stays`, `a/b relative stays`},
	} {
		if got := MaskHostPaths(tc.in); got != tc.want {
			t.Errorf("MaskHostPaths(%q)\n = %q\nwant %q", tc.in, got, tc.want)
		}
	}
}

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
