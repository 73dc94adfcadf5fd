package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
)

// Backends (SPEC §2.2).
const (
	BackendLocal       = "local"
	BackendSharedPOSIX = "shared_posix"
)

// Names on the volume root, outside every scope (SPEC §2.1).
const (
	VolumeMarker = ".agentloom-volume"
	LocksDir     = ".agentloom-locks"
	AuditDir     = ".agentloom-audit"
	RunsDir      = ".agentloom-runs"
	SpacesDir    = "spaces"
)

// Config says where the volume is. It is read from explicit flags and
// environment only.
type Config struct {
	Backend  string // local (default) or shared_posix
	Root     string // the volume root; for local, defaults to DataDir/workspaces
	VolumeID string // shared_posix: what the root's marker must hold
	DataDir  string // local: AGENT_LOOM_DATA, default ./data
	// IgnoreFence opens a shared volume that records this node as fenced
	// (refused otherwise): for re-admitting the node, nothing else.
	IgnoreFence bool
}

// RootPath returns the volume root the configuration names.
func (c Config) RootPath() string {
	if c.Root != "" {
		return c.Root
	}
	data := c.DataDir
	if data == "" {
		data = "./data"
	}
	return filepath.Join(data, "workspaces")
}

// Volume is an open workspace root. It pins the root directory by fd; every
// scope is reached from that fd.
type Volume struct {
	cfg  Config
	path string
	root *os.File
	late sync.WaitGroup // opens that outlived their caller's budget

	mu        sync.Mutex
	marker    stamp       // the marker as last read and found to hold the volume id
	noTmpfile atomic.Bool // its filesystem answered that it lacks O_TMPFILE

	// umaskOwner: the process's umask, as read when the volume was
	// opened, takes bits from the owner (createTemp).
	umaskOwner bool
	// freshDirStats: a directory's stat sees other clients' changes at
	// once (dirStatsFresh), so a lock holder's look may be kept
	// (statelook.go).
	freshDirStats bool

	fencedMarks fencedMarks // the fenced nodes' marks, as last read (fencemarks.go)
}

// OpenVolume opens the configured root. The local backend creates it; the
// shared_posix backend requires the administrator's root and marker and
// never falls back to a local directory. A root whose storage does not
// answer before ctx is done is refused with timeout.
func OpenVolume(ctx context.Context, cfg Config) (*Volume, error) {
	var late sync.WaitGroup // nothing to close under it yet
	v, err := within(ctx, &late, func() (*Volume, error) { return openVolume(cfg) }, func(v *Volume) { v.Close() })
	if overBudget(err) {
		return nil, storageTimeout("open the volume", err)
	}
	return v, err
}

func openVolume(cfg Config) (*Volume, error) {
	if cfg.Backend == "" {
		cfg.Backend = BackendLocal
	}
	path, err := filepath.Abs(cfg.RootPath())
	if err != nil {
		return nil, fmt.Errorf("volume root: %w", err)
	}
	switch cfg.Backend {
	case BackendLocal:
		if err := os.MkdirAll(path, policy.DirPerm); err != nil {
			return nil, fmt.Errorf("create local root %s: %w", path, err)
		}
	case BackendSharedPOSIX:
		if err := CheckMarker(path, cfg.VolumeID); err != nil {
			return nil, err
		}
		if !cfg.IgnoreFence {
			if err := refuseFenced(path); err != nil {
				return nil, err
			}
		}
	default:
		return nil, policy.Errorf(policy.InvalidInput, "backend %q: want %s or %s", cfg.Backend, BackendLocal, BackendSharedPOSIX)
	}
	fd, err := unix.Open(path, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open volume root %s: %w", path, err)
	}
	v := &Volume{cfg: cfg, path: path, root: os.NewFile(uintptr(fd), path), umaskOwner: umaskNarrowsOwner()}
	v.freshDirStats = dirStatsFresh(fd, path)
	return v, nil
}

// dirStatsFresh tells whether a directory's stat on the filesystem of the
// root fd shows the other clients' changes at once, as a lookup of a name
// does: on a local filesystem loomfs knows, and on CephFS, whose clients
// give up a directory's cached attributes before another client changes
// it (the kernel client, and ceph-fuse). An NFS client serves a
// directory's stat from its attribute cache (actimeo) while it asks the
// server again for a name it did not find (lookupcache=positive); another
// FUSE daemon, or a filesystem not named here, may cache either way.
func dirStatsFresh(rootfd int, path string) bool {
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(rootfd, &sfs); err != nil {
		return false
	}
	switch sfs.Type {
	case unix.CEPH_SUPER_MAGIC:
		return true
	case unix.FUSE_SUPER_MAGIC:
		return mountType(path) == "fuse.ceph-fuse"
	}
	name, network := fsName(sfs.Type)
	return !network && !strings.HasPrefix(name, "unknown")
}

// CheckMarker verifies a shared root: it must exist and its marker must
// hold exactly volumeID. Nothing is created.
func CheckMarker(root, volumeID string) error {
	unavailable := func(format string, args ...any) error {
		return policy.Errorf(policy.VolumeUnavailable, "shared volume unavailable: "+format+"; loomfs never falls back to a local directory", args...)
	}
	if volumeID == "" {
		return unavailable("no volume id configured (AGENT_LOOM_WORKSPACE_VOLUME_ID)")
	}
	b, err := readMarker(filepath.Join(root, VolumeMarker))
	if errors.Is(err, errMarkerTooLong) {
		return unavailable("marker %s is longer than any volume id (%d bytes at most)", VolumeMarker, markerMax)
	}
	if errors.Is(err, unix.ESHUTDOWN) {
		return policy.AsError(err) // this node was fenced (loomfs fence)
	}
	if err != nil {
		if st, err := os.Stat(root); err != nil || !st.IsDir() {
			return unavailable("root %s does not exist or is not a directory", root)
		}
		return unavailable("marker %s is missing or unreadable", VolumeMarker)
	}
	got := string(bytes.TrimRight(b, "\r\n"))
	if got == "" {
		return unavailable("marker %s is empty", VolumeMarker)
	}
	if got != volumeID {
		return unavailable("marker %s holds %q, configured volume id is %q", VolumeMarker, strings.ToValidUTF8(got, "?"), volumeID)
	}
	return nil
}

// markerMax bounds a marker: far more than any volume id.
const markerMax = 4096

var errMarkerTooLong = errors.New("volume marker too long")

// readMarker reads the marker at path in four system calls (open, read,
// the read that finds its end, close), not the eight of os.ReadFile and a
// stat of the root: it is read at every opening of the volume and again
// whenever it changed, and on a shared filesystem each call is a round
// trip to its server.
func readMarker(path string) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	b := make([]byte, markerMax+1)
	n := 0
	for n < len(b) {
		m, err := unix.Read(fd, b[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if m == 0 {
			return b[:n], nil
		}
		n += m
	}
	return nil, errMarkerTooLong
}

// Path returns the root's absolute path (for logs and for the audit sink).
func (v *Volume) Path() string { return v.path }

// Config returns the configuration the volume was opened with.
func (v *Volume) Config() Config { return v.cfg }

// Close releases the root fd, once no open that outlived its caller's
// budget still uses it.
func (v *Volume) Close() error {
	v.late.Wait()
	var st unix.Stat_t
	if unix.Fstat(int(v.root.Fd()), &st) == nil {
		forgetSpace(st.Dev)
	}
	return v.root.Close()
}

// recheck re-verifies a shared volume's marker before an entry point
// touches it (SPEC §2.2). The marker is read again only when a stat of
// it by path differs from the one taken before it was last read and
// found good: another filesystem mounted at the root, or no filesystem,
// shows another device or no marker, and a marker rewritten in place a
// new change time. On a shared filesystem that is one round trip to its
// server, often none, instead of four.
func (v *Volume) recheck() error {
	if v.cfg.Backend != BackendSharedPOSIX {
		return nil
	}
	var st unix.Stat_t
	statErr := unix.Stat(filepath.Join(v.path, VolumeMarker), &st)
	if statErr == nil {
		v.mu.Lock()
		same := v.marker == stampOf(&st)
		v.mu.Unlock()
		if same {
			return nil
		}
	}
	if err := CheckMarker(v.path, v.cfg.VolumeID); err != nil {
		v.mu.Lock()
		v.marker = stamp{}
		v.mu.Unlock()
		return err
	}
	if statErr == nil {
		// The stat was taken before the read: a change after it shows at
		// the next stat.
		v.mu.Lock()
		v.marker = stampOf(&st)
		v.mu.Unlock()
	}
	return nil
}

// stamp is what a stat tells of a file or directory: which one it is, and
// whether it was written since (a directory's entries changed).
type stamp struct {
	dev, ino     uint64
	size         int64
	mtime, ctime unix.Timespec
}

func stampOf(st *unix.Stat_t) stamp {
	return stamp{dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim, ctime: st.Ctim}
}

// mkdirAll creates rel (cleaned, trusted) beneath dirfd, component by
// component, never following a symlink, and returns an O_PATH fd of it.
// A path that is all there already is opened in one resolution, without a
// mkdirat per component: on a shared filesystem each is a round trip to
// the metadata server that answers EEXIST.
func mkdirAll(dirfd int, rel string) (int, error) {
	fd, err := openBeneath(dirfd, rel, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err == nil {
		return fd, nil
	}
	if err != unix.ENOENT {
		return -1, fmt.Errorf("open %s: %w", rel, err)
	}
	cur, err := unix.Dup(dirfd)
	if err != nil {
		return -1, err
	}
	for _, c := range strings.Split(rel, "/") {
		if err := unix.Mkdirat(cur, c, policy.DirPerm); err != nil && err != unix.EEXIST {
			unix.Close(cur)
			return -1, fmt.Errorf("mkdir %s: %w", c, err)
		}
		next, err := openBeneath(cur, c, unix.O_PATH|unix.O_DIRECTORY, 0)
		unix.Close(cur)
		if err != nil {
			return -1, fmt.Errorf("open %s: %w", c, err)
		}
		cur = next
	}
	return cur, nil
}

// stateDir opens (creating) the scope's directory under .agentloom-locks.
func (v *Volume) stateDir(s Scope) (int, error) {
	return mkdirAll(int(v.root.Fd()), LocksDir+"/"+s.Hash())
}

// Open opens scope s with policy pol, creating its directory on demand,
// and the directories of the policy's layout that are missing
// (LayoutMade). The returned Workspace pins the scope directory by fd: no
// call on it resolves the scope's path again. A scope whose storage does
// not answer before ctx is done is refused with timeout.
func (v *Volume) Open(ctx context.Context, s Scope, pol *policy.Policy) (*Workspace, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	w, err := within(ctx, &v.late, func() (*Workspace, error) { return v.open(s, pol) }, func(w *Workspace) { w.Close() })
	if overBudget(err) {
		return nil, storageTimeout("open scope "+s.String(), err)
	}
	return w, err
}

func (v *Volume) open(s Scope, pol *policy.Policy) (*Workspace, error) {
	if err := v.recheck(); err != nil {
		return nil, err
	}
	if pol == nil {
		pol = policy.Default()
	}
	fd, err := mkdirAll(int(v.root.Fd()), s.Dir())
	if err != nil {
		return nil, policy.FromErrno(err, "open scope", s.String())
	}
	st, mnt, err := lstatAt(fd, "")
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("stat scope %s: %w", s, err)
	}
	sfd, err := v.stateDir(s)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("scope state dir: %w", err)
	}
	w := &Workspace{
		vol:     v,
		scope:   s,
		pol:     pol.ForPriority("").WithScope(s.Main()),
		dir:     os.NewFile(uintptr(fd), s.Dir()),
		state:   os.NewFile(uintptr(sfd), LocksDir+"/"+s.Hash()),
		dev:     st.Dev,
		mnt:     mnt,
		journal: &journal{},
		quota:   &scopeQuota{},
	}
	w.calls.Late = w.lateCallLine
	if w.pol.Readme {
		if err := w.keepReadme(); err != nil {
			w.Close()
			return nil, err
		}
	}
	if err := w.makeLayout(); err != nil {
		w.Close()
		return nil, err
	}
	return w, nil
}

// keepReadme writes the workspace README generated from the policy, if the
// one there differs. It is read-only to both doors (policy.ModeOf), so
// loomfs is its only writer.
func (w *Workspace) keepReadme() error {
	want := []byte(policy.WorkspaceReadme(w.pol))
	rel := policy.ReadmeFile
	if got, _, err := w.ReadFile(context.Background(), rel); err == nil && bytes.Equal(got, want) {
		return nil
	}
	parent, name, err := w.Parent(rel)
	if err != nil {
		return err
	}
	defer parent.Close()
	// The rename replaces whatever has the name (never following it);
	// usage is not known yet at open, so nothing to adjust.
	if err := w.replace(parent, name, rel, want, policy.FilePerm, false, Change{Op: OpWrite}); err != nil {
		return fmt.Errorf("workspace README: %w", err)
	}
	return nil
}
