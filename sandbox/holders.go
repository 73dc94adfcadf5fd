package sandbox

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/store"
)

// Holders lists the processes other than this one that keep the mount of
// device dev (a projection, mounted at dir in this process's namespace)
// alive: a process with an open file, working directory or root on it, and
// every process of another mount namespace that has a copy of it of its own
// (a runtime's helper that outlived its container, such as gVisor's gofer).
// A copy that receives propagation from this one (every new namespace's
// copy of a projection mounted on shareMountpoint, as a container runtime's
// init has until it pivots into its root) goes when this mount goes: only a
// process that uses it, by a file or a directory, holds it.
// With dir "", only the container's leftovers are looked for. With
// containerID set, processes whose command line names that container
// (its runtime shim, a runtime process that outlived it) count too: once
// the engine reports the container removed, they are leftovers of it.
// It reads /proc only and never calls into the mount, so a stuck daemon
// can't make it hang.
func Holders(dir string, dev uint64, containerID string) ([]store.Holder, error) {
	selfNS, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return nil, fmt.Errorf("own mount namespace: %w", err)
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	self := os.Getpid()
	peer := peerGroup(dir, dev)
	// The copies of dev in each namespace, read once per namespace.
	copies := map[string]nsCopies{}
	var out []store.Holder
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		proc := "/proc/" + e.Name()
		if containerID != "" && namesContainer(proc, containerID) {
			if h, ok := holder(pid); ok {
				out = append(out, h)
			}
			continue
		}
		ns, err := mountNS(proc)
		if err != nil {
			continue // gone, a kernel thread, or stuck in an exec
		}
		if dir == "" {
			continue // leftovers of the container only
		}
		c, ok := copies[ns]
		if !ok {
			if ns == selfNS {
				c.used = mountIDs(proc+"/mountinfo", dev)
			} else {
				c = namespaceCopies(proc+"/mountinfo", dev, peer)
			}
			copies[ns] = c
		}
		if len(c.own) > 0 || len(c.used) > 0 && holdsFile(proc, dir, c.used) {
			if h, ok := holder(pid); ok {
				out = append(out, h)
			}
		}
	}
	return out, nil
}

// nsCopies are the mounts of a projection's device in one mount namespace.
type nsCopies struct {
	own  map[string]bool // copies of its own: every process of the namespace holds them
	used map[string]bool // copies that hold only while a process uses them
}

// namespaceCopies sorts the mounts of device dev in another namespace's
// mountinfo: copies in peer group peer, or its slaves, go when the mount
// in this namespace goes, so they hold only what a process keeps open on
// them; any other copy is the namespace's own.
func namespaceCopies(path string, dev uint64, peer string) nsCopies {
	var c nsCopies
	eachMount(path, dev, func(f []string) {
		set := &c.own
		if peer != "" && (slices.Contains(f[6:], "shared:"+peer) || slices.Contains(f[6:], "master:"+peer)) {
			set = &c.used
		}
		if *set == nil {
			*set = map[string]bool{}
		}
		(*set)[f[0]] = true
	})
	return c
}

// namesContainer reports whether the command line of the process at proc
// holds id as one of its arguments, or as the last part of one (a path).
func namesContainer(proc, id string) bool {
	data, err := os.ReadFile(proc + "/cmdline")
	if err != nil {
		return false
	}
	for _, arg := range bytes.Split(data, []byte{0}) {
		if a := string(arg); a == id || strings.HasSuffix(a, "/"+id) {
			return true
		}
	}
	return false
}

// mountIDs returns the ids of the mounts of device dev in a mountinfo file.
func mountIDs(path string, dev uint64) map[string]bool {
	var mids map[string]bool
	eachMount(path, dev, func(f []string) {
		if mids == nil {
			mids = map[string]bool{}
		}
		mids[f[0]] = true
	})
	return mids
}

// peerGroup returns the peer group of this namespace's mount of dev at
// dir, or "" when it is not shared.
func peerGroup(dir string, dev uint64) string {
	var peer string
	eachMount("/proc/self/mountinfo", dev, func(f []string) {
		if f[4] != dir {
			return
		}
		for _, o := range f[6:] {
			if g, ok := strings.CutPrefix(o, "shared:"); ok {
				peer = g
			}
		}
	})
	return peer
}

// eachMount calls fn with the fields of each line of a mountinfo file that
// mounts device dev, up to the "-" separator.
func eachMount(path string, dev uint64, fn func(f []string)) {
	data, err := os.ReadFile(path)
	if err != nil {
		return
	}
	want := fmt.Sprintf("%d:%d", unix.Major(dev), unix.Minor(dev))
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if i := slices.Index(f, "-"); i >= 6 && f[2] == want {
			fn(f[:i])
		}
	}
}

// holdsFile reports whether the process at proc has an open file on one of
// the mounts mids, or its working directory or root under dir.
func holdsFile(proc, dir string, mids map[string]bool) bool {
	for _, link := range []string{"cwd", "root"} {
		if t, err := os.Readlink(proc + "/" + link); err == nil && (t == dir || strings.HasPrefix(t, dir+"/")) {
			return true
		}
	}
	fds, err := os.ReadDir(proc + "/fdinfo")
	if err != nil {
		return false
	}
	for _, fd := range fds {
		data, err := os.ReadFile(proc + "/fdinfo/" + fd.Name())
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "mnt_id:"); ok && mids[strings.TrimSpace(v)] {
				return true
			}
		}
	}
	return false
}

// holder describes pid, or reports false when it is gone.
func holder(pid int) (store.Holder, bool) {
	start, ok := procStart(pid)
	if !ok {
		return store.Holder{}, false
	}
	cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	line := strings.TrimSpace(string(bytes.ReplaceAll(cmd, []byte{0}, []byte{' '})))
	if line == "" {
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		line = "[" + strings.TrimSpace(string(comm)) + "]"
	}
	if len(line) > 512 {
		line = line[:512] + "…"
	}
	return store.Holder{PID: pid, Start: start, Cmdline: line}, true
}

// procStart returns a process's start time in clock ticks after boot. A
// zombie counts as gone: it holds no files any more.
func procStart(pid int) (uint64, bool) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	// The command name may hold spaces and parentheses: fields start after the last ')'.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 20 || f[0] == "Z" {
		return 0, false
	}
	v, err := strconv.ParseUint(f[19], 10, 64) // field 22 of stat(5)
	return v, err == nil
}

// shareMountpoint binds the directory mp onto itself as a shared mount,
// for a projection to be mounted on. Every new mount namespace starts with
// a copy of every mount (a container runtime's init keeps them until it
// pivots into its container's root); with its parent shared, the copy of a
// projection is that parent copy's child, so unmounting the projection here
// unmounts the copies too, and they hold nothing (Holders) unless a process
// uses one.
func shareMountpoint(mp string) error {
	if err := unix.Mount(mp, mp, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind the mountpoint onto itself: %w", err)
	}
	if err := unix.Mount("", mp, "", unix.MS_SHARED, ""); err != nil {
		unix.Unmount(mp, unix.MNT_DETACH)
		return fmt.Errorf("make the mountpoint shared: %w", err)
	}
	return nil
}

// removeMountpoint takes down the bind shareMountpoint made at mp, unless a
// projection is still mounted on it, and removes the directory. It reads
// mountinfo rather than asking the mount, which may not answer.
func removeMountpoint(mp string) {
	if fs, ok := topMount(mp); ok && !strings.HasPrefix(fs, "fuse") {
		unix.Unmount(mp, unix.MNT_DETACH)
	}
	os.Remove(mp)
}

// topMount returns the filesystem type of the uppermost mount at dir in
// this namespace, or false when nothing is mounted there.
func topMount(dir string) (string, bool) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", false
	}
	fstype := map[string]string{} // mount id → type, of the mounts at dir
	parents := map[string]bool{}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		i := slices.Index(f, "-")
		if i < 6 || i+1 >= len(f) || f[4] != dir {
			continue
		}
		fstype[f[0]] = f[i+1]
		parents[f[1]] = true
	}
	for id, t := range fstype {
		if !parents[id] {
			return t, true
		}
	}
	return "", false
}

// HolderAlive reports whether h is still running on this node: the same pid
// with the same start time.
func HolderAlive(h store.Holder) bool {
	start, ok := procStart(h.PID)
	return ok && start == h.Start
}

// holderNames is a short list of the holders' program names, for messages a
// model sees: the full command lines name host paths and stay in the
// quarantine record.
func holderNames(hs []store.Holder) string {
	var names []string
	for _, h := range hs {
		name := filepath.Base(strings.Fields(h.Cmdline + " ?")[0])
		names = append(names, fmt.Sprintf("%s (pid %d)", name, h.PID))
	}
	return strings.Join(names, ", ")
}

// abortConnection makes the FUSE session of the mount of dev at dir fail
// every pending and later request, so nothing waits on it any longer: a
// forced unmount in this namespace begins with the abort, and the fusectl
// file does the same where fusectl is mounted.
func abortConnection(dir string, dev uint64) {
	unix.Unmount(dir, unix.MNT_FORCE)
	conn := unix.Major(dev)<<20 | unix.Minor(dev) // the kernel's own dev_t encoding names the connection
	os.WriteFile(fmt.Sprintf("/sys/fs/fuse/connections/%d/abort", conn), []byte("1"), 0)
}

// nsWait bounds the read of one process's mount namespace link.
const nsWait = 200 * time.Millisecond

// nsAsking holds the processes whose namespace link a read still waits
// for, so that a stuck one costs one blocked thread, not one per scan.
var nsAsking sync.Map

// mountNS reads the mount namespace link of the process at proc. The
// read takes the process's exec lock: a process stuck in an exec (its
// binary on a mount that does not answer) blocks it for as long, and
// such a process, not yet running its new program, is not counted.
func mountNS(proc string) (string, error) {
	if _, asking := nsAsking.LoadOrStore(proc, true); asking {
		return "", fmt.Errorf("%s: an earlier read of its mount namespace is still blocked", proc)
	}
	type answer struct {
		ns  string
		err error
	}
	c := make(chan answer, 1)
	go func() {
		ns, err := os.Readlink(proc + "/ns/mnt")
		nsAsking.Delete(proc)
		c <- answer{ns, err}
	}()
	t := time.NewTimer(nsWait)
	defer t.Stop()
	select {
	case a := <-c:
		return a.ns, a.err
	case <-t.C:
		return "", fmt.Errorf("%s: its mount namespace did not answer within %v", proc, nsWait)
	}
}
