package store

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/fence"
	"github.com/agentloom/loomfs/newname"
	"github.com/agentloom/loomfs/nodeid"
	"github.com/agentloom/loomfs/ofdlock"
)

// The deployment check (SPEC §7.1). By default it only looks: the root
// exists and is a directory, a shared root's marker holds the configured
// volume id, and whether this process may write there (asked of the kernel,
// nothing written). With Probe it also works in a random namespace,
// <root>/.agentloom-locks/probe-<random>/: file operations, an atomic
// replace and an advisory-lock check, then removes everything it made.
// It never creates a missing root or marker, and it only ever checks this
// node.

// CheckOptions says what to check. Nothing is taken from defaults: an
// empty Root is a failed check, not ./data/workspaces.
type CheckOptions struct {
	Backend  string // local or shared_posix
	Root     string
	VolumeID string // shared_posix: what the marker must hold
	Probe    bool   // also do file operations in a temporary namespace
	// Peer is the same volume at a second path (another client's mount):
	// with Probe, the probe's replaces and locks are checked through it.
	Peer string
}

// CheckItem is one finding.
type CheckItem struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

// CheckReport is the check's machine-readable answer. SingleNode is always
// true and AdvisoryLockLocal is true only when the probe proved local lock
// semantics: the fields say what was and wasn't shown (see Meaning).
type CheckReport struct {
	OK                bool   `json:"ok"`
	Backend           string `json:"backend"`
	Root              string `json:"root"`
	VolumeID          string `json:"volume_id,omitempty"`
	Node              string `json:"node"`
	Shared            bool   `json:"shared"`
	Probe             bool   `json:"probe"`
	SingleNode        bool   `json:"single_node"`
	AdvisoryLockLocal bool   `json:"advisory_lock_local"`
	Filesystem        string `json:"filesystem,omitempty"`
	// Fenceable: with Probe on CephFS, loomfs fence can shut this node's
	// mount out (see Meaning).
	Fenceable bool              `json:"fenceable"`
	Writable  bool              `json:"writable"`
	Checks    []CheckItem       `json:"checks"`
	Warnings  []string          `json:"warnings,omitempty"`
	Meaning   map[string]string `json:"meaning"`
}

var checkMeaning = map[string]string{
	"single_node": "Only this node was checked. That other nodes mount the same volume, see each other's writes " +
		"and exclude each other's locks is not shown by this check: only a trial on two real nodes shows it.",
	"advisory_lock_local": "true: on this node, an open-file-description lock on the volume was taken, refused to a " +
		"second open file description of the same file while held, and released. It proves local lock semantics, " +
		"not that locks conflict across nodes. false: not checked (no --probe) or the check failed.",
	"shared": "true: backend shared_posix and the root's marker holds the configured volume id. It says the " +
		"administrator's label is in place, not that the directory is on network storage.",
	"fenceable": "true: the root is on a ceph-fuse mount whose client metadata names this node (loomfs_node) and " +
		"whose stale reconnection is off, as its daemon says over its admin socket (or its command line): loomfs fence " +
		"--node <this node> would find it and keep it out. false: not CephFS, not checked (no --probe), or something is missing (the fence_ready check says what).",
	"writable": "true: the kernel's access check says this process's user may create files in the root; asked " +
		"without writing anything (the probe writes for real). false: it may not, or the check stopped before asking.",
}

// CheckMeaning says what the report's claims mean, for every report.
func CheckMeaning() map[string]string {
	m := make(map[string]string, len(checkMeaning))
	for k, v := range checkMeaning {
		m[k] = v
	}
	return m
}

func (r *CheckReport) add(name string, ok bool, format string, args ...any) bool {
	r.Checks = append(r.Checks, CheckItem{Name: name, OK: ok, Detail: fmt.Sprintf(format, args...)})
	if !ok {
		r.OK = false
	}
	return ok
}

// Check runs the deployment check and reports what it found; the report's
// OK says whether every check passed.
func Check(ctx context.Context, opts CheckOptions) *CheckReport {
	r := &CheckReport{OK: true, Backend: opts.Backend, VolumeID: opts.VolumeID, Probe: opts.Probe, SingleNode: true, Meaning: CheckMeaning()}
	r.Node, _ = nodeid.Name()
	if r.Backend == "" {
		r.Backend = BackendLocal
	}
	if r.Backend != BackendLocal && r.Backend != BackendSharedPOSIX {
		r.add("backend", false, "backend %q: want %s or %s", r.Backend, BackendLocal, BackendSharedPOSIX)
		return r
	}
	if opts.Root == "" {
		r.add("root", false, "no root given (--root or AGENT_LOOM_WORKSPACE_ROOT); check never picks a default")
		return r
	}
	root, err := filepath.Abs(opts.Root)
	if err != nil {
		r.add("root", false, "%v", err)
		return r
	}
	r.Root = root
	st, err := os.Stat(root)
	switch {
	case err != nil:
		r.add("root", false, "%s: %v (check never creates it)", root, errors.Unwrap(err))
		return r
	case !st.IsDir():
		r.add("root", false, "%s is not a directory", root)
		return r
	}
	r.add("root", true, "%s is a directory", root)
	r.Filesystem, r.Warnings = filesystemOf(root, r.Backend, r.Warnings)

	if r.Backend == BackendSharedPOSIX {
		if err := CheckMarker(root, opts.VolumeID); err != nil {
			r.add("marker", false, "%v", err)
			return r
		}
		r.Shared = true
		r.add("marker", true, "%s holds %q", VolumeMarker, opts.VolumeID)
		if err := refuseFenced(root); err != nil {
			r.add("fenced", false, "%v", err)
		}
	} else if _, err := os.Lstat(filepath.Join(root, VolumeMarker)); err == nil {
		r.Warnings = append(r.Warnings, "the root has a shared volume marker, but the local backend checks it as a local directory only")
	}

	err = unix.Faccessat(unix.AT_FDCWD, root, unix.W_OK|unix.X_OK, unix.AT_EACCESS)
	r.Writable = err == nil
	if err != nil {
		r.add("writable", false, "uid %d may not create files in %s: %v", os.Geteuid(), root, err)
		return r
	}
	r.add("writable", true, "uid %d may create files in %s (asked with access(2); nothing was written)", os.Geteuid(), root)
	if os.Geteuid() == 0 {
		r.Warnings = append(r.Warnings, "checked as root, who may write anywhere; run check as the service user to know what it may do")
	}

	auditWritable(r, root)
	selfChecks(r, root)
	if opts.Probe {
		r.AdvisoryLockLocal = probe(ctx, r, root, opts)
		fenceReady(ctx, r, root)
	}
	return r
}

// fenceReady reports, on CephFS, whether loomfs fence could shut this
// node's mount out (issue 50): a ceph-fuse mount whose client metadata
// names this node and whose stale reconnection is off, as its daemon
// says. What can't be read (the daemon is another user's) is a warning;
// what is missing fails the check.
func fenceReady(ctx context.Context, r *CheckReport, root string) {
	switch r.Filesystem {
	case "ceph":
		r.add("fence_ready", false, "a kernel CephFS mount carries no %s client metadata, so loomfs fence can't find this node's client: mount with ceph-fuse (DEPLOY.md, fencing)", fence.NodeKey)
		return
	case "fuse.ceph-fuse":
	default:
		return
	}
	m, err := fence.FindMount(ctx, MountPoints(root))
	if err != nil {
		r.Warnings = append(r.Warnings, fmt.Sprintf("whether loomfs fence can shut this node's mount out was not checked: %v", err))
		return
	}
	if miss := m.Missing(r.Node); len(miss) > 0 {
		r.add("fence_ready", false, "loomfs fence can't shut this node's mount out; its ceph-fuse (pid %d, as its %s says): %s", m.PID, m.From, strings.Join(miss, "; "))
		return
	}
	r.Warnings = append(r.Warnings, m.Unknown()...)
	r.Fenceable = len(m.Unknown()) == 0
	r.add("fence_ready", true, "ceph-fuse (pid %d, as its %s says) carries %s=%s and stale reconnection off: loomfs fence --node %s finds it and keeps it out", m.PID, m.From, fence.NodeKey, m.Metadata[fence.NodeKey], r.Node)
}

// auditWritable reports whether the audit log directory can be written:
// without it every operation is refused (audit_unavailable).
func auditWritable(r *CheckReport, root string) {
	dir := filepath.Join(root, AuditDir)
	st, err := os.Lstat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		r.add("audit", true, "%s does not exist yet; it is created on first use", AuditDir)
	case err != nil:
		r.add("audit", false, "%s: %v: operations would be refused (audit_unavailable)", dir, err)
	case !st.IsDir():
		r.add("audit", false, "%s is not a directory: every operation is refused (audit_unavailable)", dir)
	default:
		if err := unix.Faccessat(unix.AT_FDCWD, dir, unix.W_OK|unix.X_OK, unix.AT_EACCESS); err != nil {
			r.add("audit", false, "%s is not writable (%v): every operation is refused (audit_unavailable)", dir, err)
			return
		}
		r.add("audit", true, "%s is writable", dir)
	}
}

// selfChecks reports the projections whose last periodic self-check
// (SPEC §6) failed, as their mounts recorded it. Nothing is written.
func selfChecks(r *CheckReport, root string) {
	files, _ := filepath.Glob(filepath.Join(root, LocksDir, "*", SelfCheckFile))
	failed := 0
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		var sc SelfCheck
		if json.Unmarshal(b, &sc) != nil || sc.OK {
			continue
		}
		failed++
		r.add("self_check", false, "projection of %s on node %s (pid %d) failed its self-check at %s: %s", sc.Scope, sc.Node, sc.PID, sc.Time.Format(time.RFC3339), sc.Error)
	}
	if failed == 0 && len(files) > 0 {
		r.add("self_check", true, "%d projection(s) passed their last self-check", len(files))
	}
}

// Filesystem names the filesystem root is on as the mount table does
// ("ceph", "fuse.ceph-fuse", "nfs4"), else by its magic number; "" if it
// can't be looked at. A fence needs to know whether it is CephFS.
func Filesystem(root string) string {
	name, _ := filesystemOf(root, "", nil)
	return name
}

// filesystemOf names the root's filesystem type and warns when a shared
// root sits on one that is local to this node.
func filesystemOf(root, backend string, warnings []string) (string, []string) {
	var sfs unix.Statfs_t
	if err := unix.Statfs(root, &sfs); err != nil {
		return "", append(warnings, fmt.Sprintf("statfs %s: %v", root, err))
	}
	name, network := fsName(int64(sfs.Type))
	if t := mountType(root); t != "" {
		// The magic number says only "fuse"; the mount table says which.
		name = t
	}
	if backend == BackendSharedPOSIX && !network {
		warnings = append(warnings, fmt.Sprintf("the root is on %s, a filesystem local to this node: other nodes see it only if it is exported to them", name))
	}
	return name, warnings
}

// mountType is the filesystem type /proc/self/mountinfo gives the mount
// root is on ("fuse.ceph-fuse", "nfs4"), or "" if it can't be told.
func mountType(root string) string {
	var st unix.Stat_t
	if err := unix.Stat(root, &st); err != nil {
		return ""
	}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	return mountTypeOf(string(b), unix.Major(st.Dev), unix.Minor(st.Dev))
}

// MountPoints lists where the mount root is on is mounted (the mount
// and its bind mounts), as /proc/self/mountinfo says.
func MountPoints(root string) []string {
	var st unix.Stat_t
	if err := unix.Stat(root, &st); err != nil {
		return nil
	}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	return mountPointsOf(string(b), unix.Major(st.Dev), unix.Minor(st.Dev))
}

// mountPointsOf lists the mount points of device major:minor in the text
// of a mountinfo file, unescaped ("\040" is a space).
func mountPointsOf(mountinfo string, major, minor uint32) []string {
	dev := fmt.Sprintf("%d:%d", major, minor)
	var points []string
	for _, line := range strings.Split(mountinfo, "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || f[2] != dev {
			continue
		}
		p, err := strconv.Unquote(`"` + strings.ReplaceAll(f[4], `"`, `\"`) + `"`)
		if err != nil {
			p = f[4]
		}
		points = append(points, p)
	}
	return points
}

// mountTypeOf finds the filesystem type of device major:minor in the text
// of a mountinfo file: "36 35 98:0 /mnt1 /mnt/parent rw - ext3 /dev/root rw".
func mountTypeOf(mountinfo string, major, minor uint32) string {
	dev := fmt.Sprintf("%d:%d", major, minor)
	typ := ""
	for _, line := range strings.Split(mountinfo, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || f[2] != dev {
			continue
		}
		for i, x := range f {
			if x == "-" && i+1 < len(f) {
				typ = f[i+1] // the last such mount is the one on top
				break
			}
		}
	}
	return typ
}

func fsName(magic int64) (name string, network bool) {
	switch magic {
	case unix.NFS_SUPER_MAGIC:
		return "nfs", true
	case unix.CEPH_SUPER_MAGIC:
		return "ceph", true
	case unix.SMB2_SUPER_MAGIC, unix.CIFS_SUPER_MAGIC:
		return "smb", true
	case unix.FUSE_SUPER_MAGIC:
		return "fuse", true // could be either; not refused
	case unix.EXT4_SUPER_MAGIC:
		return "ext4", false
	case unix.XFS_SUPER_MAGIC:
		return "xfs", false
	case unix.BTRFS_SUPER_MAGIC:
		return "btrfs", false
	case unix.TMPFS_MAGIC:
		return "tmpfs", false
	case unix.OVERLAYFS_SUPER_MAGIC:
		return "overlay", false
	case 0x2fc12fc1: // ZFS_SUPER_MAGIC
		return "zfs", false
	}
	return fmt.Sprintf("unknown (0x%x)", magic), false
}

// probe does real file operations in a fresh namespace under
// .agentloom-locks and removes it; it reports whether the lock check
// passed.
func probe(ctx context.Context, r *CheckReport, root string, opts CheckOptions) (lockOK bool) {
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		r.add("probe_namespace", false, "open %s: %v", root, err)
		return false
	}
	defer unix.Close(rfd)
	madeLocks := unix.Mkdirat(rfd, LocksDir, 0o700) == nil
	lfd, err := openBeneath(rfd, LocksDir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		r.add("probe_namespace", false, "open %s: %v", LocksDir, err)
		if madeLocks {
			unix.Unlinkat(rfd, LocksDir, unix.AT_REMOVEDIR)
		}
		return false
	}
	defer unix.Close(lfd)
	var rnd [8]byte
	rand.Read(rnd[:])
	ns := "probe-" + hex.EncodeToString(rnd[:])
	if err := unix.Mkdirat(lfd, ns, 0o700); err != nil {
		r.add("probe_namespace", false, "mkdir %s/%s: %v", LocksDir, ns, err)
		if madeLocks {
			unix.Unlinkat(rfd, LocksDir, unix.AT_REMOVEDIR)
		}
		return false
	}
	where := LocksDir + "/" + ns
	nfd, err := openBeneath(lfd, ns, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		r.add("probe_namespace", false, "open %s: %v", where, err)
		unix.Unlinkat(lfd, ns, unix.AT_REMOVEDIR)
		return false
	}
	r.add("probe_namespace", true, "made %s", where)

	// Every name the probe may create, removed whatever happened.
	names := []string{"file", "renamed", "dir", "target", "target.tmp", "target.new", "created", "lock", "peer", "peer.tmp", "peer.lock"}
	defer func() {
		for _, n := range names {
			unix.Unlinkat(nfd, n, 0)
		}
		unix.Unlinkat(nfd, "dir", unix.AT_REMOVEDIR)
		unix.Close(nfd)
		if err := unix.Unlinkat(lfd, ns, unix.AT_REMOVEDIR); err != nil {
			r.add("probe_cleanup", false, "remove %s: %v", where, err)
			return
		}
		detail := "removed " + where
		if madeLocks {
			// Only if it is still empty: a real scope may have come meanwhile.
			if unix.Unlinkat(rfd, LocksDir, unix.AT_REMOVEDIR) == nil {
				detail += " and the " + LocksDir + " it made"
			}
		}
		// lfd may name a directory just removed: a filesystem without
		// negative caching (GlusterFS) answers ESTALE, which means gone too.
		var st unix.Stat_t
		switch err := unix.Fstatat(lfd, ns, &st, unix.AT_SYMLINK_NOFOLLOW); err {
		case unix.ENOENT, unix.ESTALE:
			r.add("probe_cleanup", true, "%s", detail)
		case nil:
			r.add("probe_cleanup", false, "%s is still there after its removal", where)
		default:
			r.add("probe_cleanup", false, "stat %s after its removal: %v", where, err)
		}
	}()

	if err := probeFiles(nfd); err != nil {
		r.add("probe_file_ops", false, "%v", err)
		return false
	}
	r.add("probe_file_ops", true, "created 0600, wrote, fsynced, read back, renamed, made and removed a 0700 directory, deleted")
	if ctx.Err() != nil {
		r.add("probe_atomic_replace", false, "cancelled")
		return false
	}
	detail, err := probeReplace(nfd)
	if err != nil {
		r.add("probe_atomic_replace", false, "%v", err)
		return false
	}
	r.add("probe_atomic_replace", true, "%s", detail)
	if err := probeLock(nfd); err != nil {
		r.add("probe_lock", false, "%v", err)
		return false
	}
	r.add("probe_lock", true, "an OFD write lock was taken, refused to a second open file description while held, and released (this node only)")
	if opts.Peer != "" {
		detail, err := probePeer(ctx, nfd, opts, where)
		r.add("probe_peer", err == nil, "%s", firstOf(err, detail))
	}
	return true
}

func firstOf(err error, detail string) string {
	if err != nil {
		return err.Error()
	}
	return detail
}

// The peer probe's replaces, and its locked increments per side: few, as
// on CephFS each handover of the lock between clients costs about a second.
const (
	peerRounds     = 20
	peerIncrements = 5
)

// probePeer checks the probe's namespace nfd through the peer path of the
// same volume: every replace made here is read there at once, a lock held
// here is refused there, and increments made under the lock from both
// sides at once lose nothing. A one-path probe can't see a client that
// serves a file's old content after another client's rename. The
// increments wait for the lock as loomfs does (package ofdlock), until
// ctx ends.
func probePeer(ctx context.Context, nfd int, opts CheckOptions, where string) (string, error) {
	peer, err := filepath.Abs(opts.Peer)
	if err != nil {
		return "", fmt.Errorf("peer: %w", err)
	}
	if opts.Backend == BackendSharedPOSIX {
		if err := CheckMarker(peer, opts.VolumeID); err != nil {
			return "", fmt.Errorf("peer %s: %w", peer, err)
		}
	}
	prfd, err := unix.Open(peer, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("peer: open %s: %w", peer, err)
	}
	defer unix.Close(prfd)
	pfd, err := openBeneath(prfd, where, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return "", fmt.Errorf("the peer %s does not see %s made through the root (%v): not the same volume, or its client caches lookups", peer, where, err)
	}
	defer unix.Close(pfd)

	// The first version is placed as loomfs places a new name (package
	// newname: on CephFS a rename onto a new name keeps the other client's
	// first lookup waiting seconds), every later one renamed over it.
	placed := false
	replace := func(dfd int, content string) error {
		fd, err := unix.Openat(dfd, "peer.tmp", unix.O_CREAT|unix.O_TRUNC|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return err
		}
		_, err = unix.Write(fd, []byte(content))
		if err == nil {
			err = unix.Fsync(fd)
		}
		unix.Close(fd)
		if err != nil {
			return err
		}
		if !placed {
			placed = true
			return newname.Place(dfd, "peer.tmp", "peer")
		}
		return unix.Renameat(dfd, "peer.tmp", dfd, "peer")
	}
	read := func(dfd int) (string, error) {
		fd, err := unix.Openat(dfd, "peer", unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return "", err
		}
		defer unix.Close(fd)
		buf := make([]byte, 64)
		n, err := unix.Read(fd, buf)
		if n < 0 {
			n = 0
		}
		return string(buf[:n]), err
	}
	start := time.Now()
	stale := 0
	for i := range peerRounds {
		want := fmt.Sprintf("round %d", i)
		if err := replace(nfd, want); err != nil {
			return "", fmt.Errorf("replace through the root: %w", err)
		}
		got, err := read(pfd)
		if err != nil {
			return "", fmt.Errorf("read through the peer: %w", err)
		}
		if got != want {
			stale++
		}
	}
	if stale > 0 {
		return "", fmt.Errorf("the peer read the old content after %d of %d replaces through the root: its client caches, and compare-and-swap would lose updates (see DEPLOY.md for the client options)", stale, peerRounds)
	}

	replaces := time.Since(start)
	lock := func(dfd int) (int, error) {
		return unix.Openat(dfd, "peer.lock", unix.O_CREAT|unix.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	}
	la, err := lock(nfd)
	if err != nil {
		return "", fmt.Errorf("lock file through the root: %w", err)
	}
	defer unix.Close(la)
	lb, err := lock(pfd)
	if err != nil {
		return "", fmt.Errorf("lock file through the peer: %w", err)
	}
	defer unix.Close(lb)
	wr, un := unix.Flock_t{Type: unix.F_WRLCK}, unix.Flock_t{Type: unix.F_UNLCK}
	if err := unix.FcntlFlock(uintptr(la), unix.F_OFD_SETLK, &wr); err != nil {
		return "", fmt.Errorf("lock through the root: %w", err)
	}
	try := wr
	switch err := unix.FcntlFlock(uintptr(lb), unix.F_OFD_SETLK, &try); err {
	case unix.EAGAIN, unix.EACCES:
	case nil:
		return "", fmt.Errorf("the peer got the lock while the root held it: locks don't exclude between these clients")
	default:
		return "", fmt.Errorf("lock through the peer: %w", err)
	}
	unix.FcntlFlock(uintptr(la), unix.F_OFD_SETLK, &un)

	// Both sides at once: lock, read, replace with one more, unlock.
	if err := replace(nfd, "0"); err != nil {
		return "", fmt.Errorf("replace through the root: %w", err)
	}
	start = time.Now()
	errs := make(chan error, 2)
	for _, side := range [][2]int{{nfd, la}, {pfd, lb}} {
		go func() {
			errs <- func() error {
				for range peerIncrements {
					if err := ofdlock.Wait(ctx, uintptr(side[1]), wr, scopeLockBackoff); err != nil {
						return err
					}
					got, err := read(side[0])
					if err == nil {
						v, _ := strconv.Atoi(got)
						err = replace(side[0], strconv.Itoa(v+1))
					}
					u := un
					unix.FcntlFlock(uintptr(side[1]), unix.F_OFD_SETLK, &u)
					if err != nil {
						return err
					}
				}
				return nil
			}()
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			return "", fmt.Errorf("increment race: %w", err)
		}
	}
	got, _ := read(pfd)
	if got != strconv.Itoa(2*peerIncrements) {
		return "", fmt.Errorf("%d increments under the lock from the root and the peer at once left %q: updates were lost", 2*peerIncrements, got)
	}
	return fmt.Sprintf("through the peer %s: read each of %d replaces at once (%v in all), refused the lock the root held, and %d locked increments from both at once lost nothing (%v)",
		peer, peerRounds, replaces.Round(time.Millisecond), 2*peerIncrements, time.Since(start).Round(time.Millisecond)), nil
}

func probeFiles(dfd int) error {
	var rnd [16]byte
	rand.Read(rnd[:])
	want := []byte("loomfs probe " + hex.EncodeToString(rnd[:]) + "\n")
	fd, err := unix.Openat(dfd, "file", unix.O_CREAT|unix.O_EXCL|unix.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	defer unix.Close(fd)
	if _, err := unix.Write(fd, want); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if err := unix.Fsync(fd); err != nil {
		return fmt.Errorf("fsync: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("fstat: %w", err)
	}
	if st.Mode&0o077 != 0 || st.Nlink != 1 || st.Size != int64(len(want)) {
		return fmt.Errorf("new file has mode %o, %d links, %d bytes; want 0600 or narrower, 1 link, %d bytes", st.Mode&0o7777, st.Nlink, st.Size, len(want))
	}
	got := make([]byte, len(want)+1)
	n, err := unix.Pread(fd, got, 0)
	if err != nil || !bytes.Equal(got[:n], want) {
		return fmt.Errorf("read back %q (%v); wrote %q", got[:n], err, want)
	}
	if err := unix.Renameat(dfd, "file", dfd, "renamed"); err != nil {
		return fmt.Errorf("rename: %w", err)
	}
	if err := unix.Fstatat(dfd, "renamed", &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("stat after rename: %w", err)
	}
	if err := unix.Mkdirat(dfd, "dir", 0o700); err != nil {
		return fmt.Errorf("mkdir: %w", err)
	}
	if err := unix.Unlinkat(dfd, "dir", unix.AT_REMOVEDIR); err != nil {
		return fmt.Errorf("rmdir: %w", err)
	}
	if err := unix.Unlinkat(dfd, "renamed", 0); err != nil {
		return fmt.Errorf("unlink: %w", err)
	}
	if err := unix.Fstatat(dfd, "renamed", &st, unix.AT_SYMLINK_NOFOLLOW); err != unix.ENOENT {
		return fmt.Errorf("deleted file still there: %v", err)
	}
	return nil
}

// probeReplace replaces a file the way workspace writes do: a temporary
// file in the same directory, fsync, rename over the target, fsync the
// directory. It also says whether RENAME_NOREPLACE works here.
func probeReplace(dfd int) (string, error) {
	write := func(name, content string) error {
		fd, err := unix.Openat(dfd, name, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return fmt.Errorf("create %s: %w", name, err)
		}
		defer unix.Close(fd)
		if _, err := unix.Write(fd, []byte(content)); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
		return unix.Fsync(fd)
	}
	if err := write("target", "old"); err != nil {
		return "", err
	}
	if err := write("target.tmp", "new"); err != nil {
		return "", err
	}
	if err := unix.Renameat(dfd, "target.tmp", dfd, "target"); err != nil {
		return "", fmt.Errorf("rename over the target: %w", err)
	}
	unix.Fsync(dfd)
	fd, err := unix.Openat(dfd, "target", unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("open the target: %w", err)
	}
	buf := make([]byte, 16)
	n, _ := unix.Read(fd, buf)
	unix.Close(fd)
	if string(buf[:n]) != "new" {
		return "", fmt.Errorf("after the replace the target holds %q, want %q", buf[:n], "new")
	}
	var st unix.Stat_t
	if unix.Fstatat(dfd, "target.tmp", &st, unix.AT_SYMLINK_NOFOLLOW) != unix.ENOENT {
		return "", fmt.Errorf("the temporary file is still there after the rename")
	}
	detail := "wrote a temporary file, fsynced, renamed it over the target, read the new content back"
	// RENAME_NOREPLACE onto a new name: onto an existing one the kernel
	// answers EEXIST from its own cache without asking the filesystem.
	if err := write("target.new", "x"); err != nil {
		return "", err
	}
	switch err := newname.RenameNoReplace(dfd, "target.new", "created"); err {
	case nil:
		detail += "; RENAME_NOREPLACE works"
		unix.Unlinkat(dfd, "created", 0)
	case unix.EINVAL, unix.ENOSYS:
		detail += "; no RENAME_NOREPLACE here (exclusive creates hard-link instead)"
		unix.Unlinkat(dfd, "target.new", 0)
	default:
		return "", fmt.Errorf("rename with RENAME_NOREPLACE onto a new name: %w", err)
	}
	// The exclusive create loomfs uses, whichever way it goes here.
	if err := write("target.new", "x"); err != nil {
		return "", err
	}
	if err := newname.Place(dfd, "target.new", "created"); err != nil {
		return "", fmt.Errorf("exclusive create of a new name: %w", err)
	}
	if err := write("target.new", "y"); err != nil {
		return "", err
	}
	switch err := newname.Place(dfd, "target.new", "created"); err {
	case unix.EEXIST:
	case nil:
		return "", fmt.Errorf("an exclusive create replaced an existing file")
	default:
		return "", fmt.Errorf("exclusive create onto an existing name: %w", err)
	}
	detail += "; an exclusive create made a new name and refused an existing one"
	return detail, nil
}

// probeLock takes an OFD write lock, checks that a second open file
// description of the same file is refused it while held, releases it and
// checks the second one gets it then.
func probeLock(dfd int) error {
	open := func() (int, error) {
		return unix.Openat(dfd, "lock", unix.O_CREAT|unix.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	}
	a, err := open()
	if err != nil {
		return fmt.Errorf("open lock file: %w", err)
	}
	defer unix.Close(a)
	b, err := open()
	if err != nil {
		return fmt.Errorf("open lock file again: %w", err)
	}
	defer unix.Close(b)
	wr := unix.Flock_t{Type: unix.F_WRLCK}
	un := unix.Flock_t{Type: unix.F_UNLCK}
	if err := unix.FcntlFlock(uintptr(a), unix.F_OFD_SETLK, &wr); err != nil {
		return fmt.Errorf("take an OFD lock: %w (the filesystem may not support POSIX locks; NFS needs the lock mount option)", err)
	}
	second := wr
	switch err := unix.FcntlFlock(uintptr(b), unix.F_OFD_SETLK, &second); err {
	case unix.EAGAIN, unix.EACCES:
	case nil:
		return fmt.Errorf("a second open file description got the lock while it was held: locks don't exclude here")
	default:
		return fmt.Errorf("second lock attempt: %w", err)
	}
	query := wr
	if err := unix.FcntlFlock(uintptr(b), unix.F_OFD_GETLK, &query); err != nil {
		return fmt.Errorf("query the lock: %w", err)
	}
	if query.Type == unix.F_UNLCK {
		return fmt.Errorf("F_OFD_GETLK does not see the lock held")
	}
	if err := unix.FcntlFlock(uintptr(a), unix.F_OFD_SETLK, &un); err != nil {
		return fmt.Errorf("release: %w", err)
	}
	second = wr
	if err := unix.FcntlFlock(uintptr(b), unix.F_OFD_SETLK, &second); err != nil {
		return fmt.Errorf("the lock was not free after its release: %w", err)
	}
	unix.FcntlFlock(uintptr(b), unix.F_OFD_SETLK, &un)
	return nil
}
