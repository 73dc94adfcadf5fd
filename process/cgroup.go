package process

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// What the host sees of a session sandbox's container: its cgroups, read
// and written from the host where the service can (cgroup v1 or v2, either
// engine cgroup driver, a worker with the privilege to). A fork bomb
// spinning in the container takes its CPU from anything that runs there,
// the controller included, but not from the service: counting the
// container's processes, and killing a tree in it, is then done from here.
// Under gVisor the container's processes live in the sandbox kernel, which
// the host does not see; there the controller does it all.

// hostCgroup returns the container's cgroup directory of controller ctl
// ("pids", "freezer") that holds file, as the host sees it; "" where the
// service can't see it.
func hostCgroup(id, ctl, file string) string {
	for _, d := range []string{
		"/sys/fs/cgroup/" + ctl + "/docker/" + id,
		"/sys/fs/cgroup/" + ctl + "/system.slice/docker-" + id + ".scope",
		"/sys/fs/cgroup/docker/" + id,
		"/sys/fs/cgroup/system.slice/docker-" + id + ".scope",
	} {
		if _, err := os.Stat(d + "/" + file); err == nil {
			return d
		}
	}
	return ""
}

// hostPids reads the container's pids cgroup count from the host.
func hostPids(id string) (int64, bool) {
	d := hostCgroup(id, "pids", "pids.current")
	if d == "" {
		return 0, false
	}
	data, err := os.ReadFile(d + "/pids.current")
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	return n, err == nil
}

// hostProcs returns the host pids of the container's processes.
func hostProcs(id string) ([]int, bool) {
	d := hostCgroup(id, "pids", "pids.current")
	if d == "" {
		return nil, false
	}
	data, err := os.ReadFile(d + "/cgroup.procs")
	if err != nil {
		return nil, false
	}
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, true
}

// procGroup returns a process's real group id and whether it is a zombie,
// from its status file; ok is false once it is gone.
func procGroup(pid int) (gid int, zombie, ok bool) {
	st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, false, false
	}
	for _, l := range strings.Split(string(st), "\n") {
		if v, found := strings.CutPrefix(l, "State:"); found {
			zombie = strings.HasPrefix(strings.TrimSpace(v), "Z")
		}
		if v, found := strings.CutPrefix(l, "Gid:"); found {
			if f := strings.Fields(v); len(f) > 0 {
				gid, _ = strconv.Atoi(f[0])
			}
			return gid, zombie, true
		}
	}
	return 0, false, false
}

// hostGroups counts the container's processes per group id from the host,
// which a fork bomb spinning in the container does not slow: the
// controller's count would wait for CPU behind it, and hold up the kill
// that comes next.
func hostGroups(id string) (map[int]int, bool) {
	pids, ok := hostProcs(id)
	if !ok {
		return nil, false
	}
	out := map[int]int{}
	for _, pid := range pids {
		if g, _, ok := procGroup(pid); ok {
			out[g]++
		}
	}
	return out, true
}

// A freezer stops every process of a container at once, and lets them go
// again: the cgroup freezer, which is what `docker pause` uses.
type freezer struct {
	dir string
	v2  bool // cgroup.freeze and cgroup.events, not freezer.state
}

// hostFreezer returns the container's freezer, where the host sees it.
func hostFreezer(id string) (freezer, bool) {
	if d := hostCgroup(id, "freezer", "freezer.state"); d != "" {
		return freezer{dir: d}, true
	}
	if d := hostCgroup(id, "", "cgroup.freeze"); d != "" {
		return freezer{dir: d, v2: true}, true
	}
	return freezer{}, false
}

// freeze asks the kernel to stop every process of the container, and
// waits until all have stopped, for at most wait: a process that is
// exiting, or in some system calls, stops late or not at all, and a kill
// pass goes on without it (it is found again by the next).
func (f freezer) freeze(wait time.Duration) error {
	file, value := "freezer.state", "FROZEN"
	if f.v2 {
		file, value = "cgroup.freeze", "1"
	}
	if err := os.WriteFile(f.dir+"/"+file, []byte(value), 0); err != nil {
		return fmt.Errorf("freeze the session sandbox: %w", err)
	}
	for deadline := time.Now().Add(wait); !f.frozen() && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	return nil
}

func (f freezer) frozen() bool {
	if !f.v2 {
		data, err := os.ReadFile(f.dir + "/freezer.state")
		return err == nil && strings.TrimSpace(string(data)) == "FROZEN"
	}
	data, err := os.ReadFile(f.dir + "/cgroup.events")
	return err == nil && strings.Contains(string(data), "frozen 1")
}

// thaw lets the container's processes go on.
func (f freezer) thaw() error {
	file, value := "freezer.state", "THAWED"
	if f.v2 {
		file, value = "cgroup.freeze", "0"
	}
	if err := os.WriteFile(f.dir+"/"+file, []byte(value), 0); err != nil {
		return fmt.Errorf("thaw the session sandbox: %w", err)
	}
	return nil
}

// errNoHostKill says the host can't kill in this container (gVisor, a
// worker without the privilege, a layout it does not know): the
// controller does it.
var errNoHostKill = errors.New("the host can't freeze the session sandbox")

// hostKillTree kills every process of group gid in container id from the
// host and returns how many there were. Each pass freezes the whole
// container, so that nothing of the tree can fork while it is found,
// sends each of its processes KILL, and thaws the container, where the
// KILLs land before any of them runs again; it ends when a pass finds
// none left. Frozen, a fork bomb of 250 processes is killed in one pass
// of a few milliseconds, however loaded the node.
func hostKillTree(ctx context.Context, id string, gid int) (int, error) {
	fz, ok := hostFreezer(id)
	if !ok {
		return 0, errNoHostKill
	}
	killed := map[int]bool{}
	for pass := 0; pass < 100; pass++ {
		if err := ctx.Err(); err != nil {
			return len(killed), err
		}
		if err := fz.freeze(200 * time.Millisecond); err != nil {
			fz.thaw()
			if pass == 0 {
				return 0, fmt.Errorf("%w: %v", errNoHostKill, err)
			}
			return len(killed), err
		}
		pids, ok := hostProcs(id)
		live := 0
		for _, pid := range pids {
			if g, zombie, found := procGroup(pid); found && g == gid && !zombie {
				live++
				killed[pid] = true
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		if err := fz.thaw(); err != nil {
			return len(killed), err
		}
		if !ok {
			return len(killed), errNoHostKill
		}
		if live == 0 {
			return len(killed), nil
		}
		time.Sleep(time.Duration(pass+1) * time.Millisecond) // for the KILLs to land
	}
	return len(killed), errLeft
}
