package fusefs

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// Mounted is a scope served at a mountpoint by this process.
type Mounted struct {
	fsys     *fsys
	server   *fuse.Server
	dir      string
	follower *follower     // nil under "cache: strict"
	ended    chan struct{} // closed when the session is over

	once   sync.Once
	err    error
	unheld func() // ends the mount's part in counts of the scope

	// probeSlot lets one health probe run at a time: the daemon admits
	// the one probe file it is told of (fsys.probing), so a second
	// probe's create, a self-check's beside a start's, was refused.
	probeSlot chan struct{}
}

// ErrDetached is returned by Unmount when the mount was still in use: the
// session was aborted (its users get ENOTCONN from then on) and the mount
// taken out of the namespace.
var ErrDetached = errors.New("mount was busy; its session was aborted and the mount detached")

// Mount serves ws at mountpoint until Unmount. The mountpoint must be an
// existing directory outside the scope; a stale mount left there by a dead
// daemon is cleared first. The mount is nosuid and nodev, and is open to
// other users only with Options.AllowOther (see there).
func Mount(ctx context.Context, ws *store.Workspace, mountpoint string, opts Options) (*Mounted, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	dir, err := prepareMountpoint(ws, mountpoint, opts.AllowOther)
	if err != nil {
		return nil, err
	}
	f, rootStat, err := newFsys(ws, opts)
	if err != nil {
		return nil, err
	}
	rootAttr := stableAttr(rootStat)
	mo := fuse.MountOptions{
		FsName: "loomfs",
		Name:   "loomfs",
		// default_permissions is added below when the kernel opens
		// directories itself; otherwise permissions are checked here
		// alone (fsys.access).
		Options:     []string{"nosuid", "nodev"},
		AllowOther:  opts.AllowOther,
		DirectMount: true,
		// No xattrs: ENOSYS once, and the kernel stops asking.
		DisableXAttrs: !opts.UserXattrs,
		EnableLocks:   true,
		// An emulated link's target never changes (no door writes through
		// a link; a new link is a new file): the kernel may keep it.
		EnableSymlinkCaching: ws.Policy().EmulatesLinks() && !opts.NoFollowLinks,
		MaxWrite:             1 << 20,
		// Reads answer with the bytes read (handle.Read), never with an
		// fd to splice from; go-fuse would still write each reply's
		// header into a pipe, find nothing to splice and drain it: three
		// system calls per read for nothing.
		DisableSplice: true,
		Debug:         opts.Debug,
	}
	if opts.ReadOnly {
		mo.DirectMountFlags = syscall.MS_NOSUID | syscall.MS_NODEV | syscall.MS_RDONLY
	}
	if !opts.Passthrough {
		mo.DisabledCapabilities = fuse.CAP_PASSTHROUGH
	}
	kernelDirs := f.dirCache() != 0 && ws.Policy().KernelOpensDirs()
	if kernelDirs {
		// The kernel opens directories without asking (openlessDirs),
		// so it must check the owner bits the mount shows, as on any
		// disk: an unreadable directory then fails at opendir.
		mo.Options = append(mo.Options, "default_permissions")
	}
	var negative *time.Duration
	if f.coherent {
		// A failed lookup is kept as long as an entry: a create
		// anywhere else comes with a journal line that drops it.
		negative = &f.timeout
	}
	raw := fs.NewNodeFS(f.root, &fs.Options{
		NegativeTimeout: negative,
		MountOptions:    mo,
		// No EntryTimeout or AttrTimeout: every reply sets its own
		// (fsys.setEntry), since go-fuse would replace a zero one.
		NullPermissions: true,
		RootStableAttr:  &rootAttr,
	})
	var served fuse.RawFileSystem = flushOwners{RawFileSystem: raw, f: f}
	var dirs *openlessDirs
	if kernelDirs {
		dirs = &openlessDirs{RawFileSystem: served, f: f}
		served = dirs
	}
	if f.limit != nil {
		served = throttledOps{RawFileSystem: served, limit: f.limit}
	}
	if opts.Requests != nil {
		served = timedOps{RawFileSystem: served, observe: opts.Requests}
	}
	server, err := fuse.NewServer(served, dir, &mo)
	if err != nil {
		return nil, fmt.Errorf("mount %s at %s: %w", ws.Scope(), dir, err)
	}
	if dirs != nil {
		dirs.server = server
	}
	go server.Serve()
	if err := server.WaitMount(); err != nil {
		return nil, fmt.Errorf("mount %s at %s: %w", ws.Scope(), dir, err)
	}
	if err := fuseCloseOnExec(); err != nil {
		server.Unmount()
		return nil, fmt.Errorf("mount %s at %s: %w", ws.Scope(), dir, err)
	}
	// A count of the scope (the quota's reconcile) sees what files open
	// here hold with no name left.
	unheld := ws.CountHeld(f.heldOpen)
	m := &Mounted{fsys: f, server: server, dir: dir, unheld: unheld, ended: make(chan struct{}), probeSlot: make(chan struct{}, 1)}
	go func() { server.Wait(); close(m.ended) }()
	if f.coherent {
		m.follower = newFollower(f, opts.journalPoll())
		m.follower.start()
	}
	return m, nil
}

// fuseCloseOnExec marks every /dev/fuse fd of the process close-on-exec.
// go-fuse opens the device without O_CLOEXEC, so a program this process
// starts would inherit the session, and could read the kernel's requests
// and answer them in the daemon's place.
func fuseCloseOnExec() error {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return fmt.Errorf("list open files: %w", err)
	}
	for _, e := range ents {
		if t, err := os.Readlink("/proc/self/fd/" + e.Name()); err != nil || t != "/dev/fuse" {
			continue
		}
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC); err != nil && err != unix.EBADF {
			return fmt.Errorf("close-on-exec for the FUSE device: %w", err)
		}
	}
	return nil
}

// Dir returns the mountpoint (absolute, symlinks resolved).
func (m *Mounted) Dir() string { return m.dir }

// Unmount ends the mount. When it returns, the daemon no longer touches the
// workspace, which the caller may then close. A mount still in use is
// aborted and detached, and ErrDetached returned. A mount already
// unmounted from outside is only cleaned up after.
func (m *Mounted) Unmount() error {
	m.once.Do(func() {
		defer m.fsys.kept.closeAll()
		defer m.fsys.readers.closeAll()
		defer m.unheld()
		defer m.releaseOpen()
		if m.follower != nil {
			// Halted first, waited for once the session is over: a
			// drop under way can wait for a read or write the session
			// is serving (follower), which ends only with the session
			// when the backing store is slow to answer it.
			m.follower.halt()
			defer m.follower.close()
		}
		if m.over() {
			m.err = m.removeDead()
			return
		}
		m.err = m.unmount()
	})
	return m.err
}

// removeDead takes a mount whose session ended from outside out of the
// namespace: unmounted, it is gone already; aborted (a sandbox cutting off
// the holders of a projection aborts its connection), it is still there,
// dead, answering ENOTCONN, and is detached. A mount at the same place that
// answers is someone else's and is left alone.
func (m *Mounted) removeDead() error {
	var st unix.Statfs_t
	if err := unix.Statfs(m.dir, &st); err != unix.ENOTCONN {
		return nil
	}
	if err := unix.Unmount(m.dir, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
		return fmt.Errorf("unmount %s: %w", m.dir, err)
	}
	return nil
}

// over reports whether the session has ended.
func (m *Mounted) over() bool {
	select {
	case <-m.ended:
		return true
	default:
		return false
	}
}

// unmount ends the session: unmounted if nothing uses the mount, else
// aborted and detached.
func (m *Mounted) unmount() error {
	if err := m.server.Unmount(); err == nil {
		return nil
	}
	// Busy: its users are cut off.
	if err := m.Detach(); err != nil {
		return err
	}
	select {
	case <-m.ended:
		return ErrDetached
	case <-time.After(10 * time.Second):
		return fmt.Errorf("unmount %s: detached, but the session did not end", m.dir)
	}
}

// Detach aborts the session and takes the mount out of the namespace at
// once, waiting for nothing: its users get ENOTCONN, and requests the
// daemon is still serving are answered to no one. It is for a process that
// must exit now (see loomfs mount --stop-timeout); Unmount is the way to
// end a mount.
func (m *Mounted) Detach() error {
	if m.over() {
		return m.removeDead()
	}
	// A forced unmount makes FUSE abort the session: pending and later
	// requests fail, and the serve loop ends. Then the mount is taken out
	// of the namespace if it is still there.
	unix.Unmount(m.dir, unix.MNT_FORCE)
	if err := unix.Unmount(m.dir, unix.MNT_DETACH); err != nil && err != unix.EINVAL {
		return fmt.Errorf("unmount %s: %w", m.dir, err)
	}
	return nil
}

// releaseOpen closes and records the opens the kernel never released: a
// file closed just before the unmount still gets its summary record.
func (m *Mounted) releaseOpen() {
	m.fsys.open.Range(func(k, _ any) bool {
		if _, ok := m.fsys.open.LoadAndDelete(k); ok {
			k.(*handle).release(context.Background(), "unmount")
		}
		return true
	})
	m.fsys.locked.Range(func(k, _ any) bool {
		k.(*nodeLocks).dropAll()
		return true
	})
}

// Wait returns when the mount has ended: unmounted here, or by someone else.
func (m *Mounted) Wait() { <-m.ended }

// Invalidate tells the kernel that the object at the cleaned path rel
// changed outside the mount (through the tool door), so that the next
// access through the mount looks it up and reads it afresh. It is cheap
// when the kernel does not know the path.
func (m *Mounted) Invalidate(rel string) {
	rel, err := policy.CleanPath(rel, false)
	if err != nil {
		return
	}
	root := m.fsys.root.EmbeddedInode()
	if rel == "." {
		root.NotifyContent(0, 0)
		return
	}
	parent := root
	names := strings.Split(rel, "/")
	for _, name := range names[:len(names)-1] {
		if parent = parent.GetChild(name); parent == nil {
			return
		}
	}
	name := names[len(names)-1]
	if child := parent.GetChild(name); child != nil {
		child.NotifyContent(0, 0)
	}
	parent.NotifyEntry(name)
	parent.NotifyContent(0, 0)
}

// JournalRead is when the mount last read the scope's change journals to
// keep the kernel's caches coherent; ok is false for a mount that does not
// follow them (cache: strict) or has not read them yet. A time further
// back than the journal poll means the follower is stuck: other doors'
// changes are not being dropped from the caches.
func (m *Mounted) JournalRead() (t time.Time, ok bool) {
	if m.follower == nil {
		return time.Time{}, false
	}
	ns := m.follower.read.Load()
	return time.Unix(0, ns), ns != 0
}

// Probe writes a file through the mount, reads it back and removes it: the
// health check of the path the agent uses (SPEC §6). The probe's name is
// one loomfs keeps for itself (policy.ProbePrefix): a probe killed halfway
// leaves nothing an agent meets.
func (m *Mounted) Probe(ctx context.Context) error {
	select {
	case m.probeSlot <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("probe through %s: another probe of this mount was still under way: %w", m.dir, ctx.Err())
	}
	var b [8]byte
	rand.Read(b[:])
	name := policy.ProbePrefix + hex.EncodeToString(b[:])
	path := filepath.Join(m.dir, name)
	want := []byte("loomfs probe " + hex.EncodeToString(b[:]) + "\n")
	done := make(chan error, 1)
	if m.fsys.opts.ReadOnly {
		// Nothing can be written: a read-only mount is checked by reading.
		go func() {
			_, err := os.ReadDir(m.dir)
			<-m.probeSlot
			done <- err
		}()
	} else {
		// Not listed while it exists: loomfs's own file.
		m.fsys.probing.Store(&name)
		go func() {
			err := probeInChild(ctx, path, want)
			if err != nil {
				// A child that failed or was killed between its create
				// and its unlink leaves the file: it goes while it is
				// still hidden.
				m.dropProbe(name)
			}
			m.fsys.probing.CompareAndSwap(&name, nil)
			<-m.probeSlot
			if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
				// The volume is full: the projection answered as it
				// should, and serves reads (and deletes) until room
				// comes back.
				_, err = os.ReadDir(m.dir)
			}
			done <- err
		}()
	}
	select {
	case err := <-done:
		m.fsys.setReady(err == nil)
		if err != nil {
			return fmt.Errorf("probe through %s: %w", m.dir, err)
		}
		return nil
	case <-ctx.Done():
		m.fsys.setReady(false)
		return fmt.Errorf("probe through %s: %w", m.dir, ctx.Err())
	}
}

// dropProbe removes a probe's file the probe left, from the backing store:
// a daemon thread never waits on its own mount (probe.go).
func (m *Mounted) dropProbe(name string) {
	f := m.fsys
	var st unix.Stat_t
	if err := unix.Fstatat(f.ws.DirFD(), name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return
	}
	if err := unix.Unlinkat(f.ws.DirFD(), name, 0); err != nil {
		return
	}
	f.ws.AdjustAt(name, -st.Size, -1)
	f.ws.NoteChangeBy(name, false, store.Change{Op: store.OpDelete, Source: store.SourceLoomfs})
	m.Invalidate(name)
}

// SelfCheck probes the mount every interval until ctx is done (SPEC §6),
// hiding policy.ReadyFile while it fails and handing every outcome, and
// how long the probe took, to report, which keeps it where operators look.
func (m *Mounted) SelfCheck(ctx context.Context, every time.Duration, report func(err error, took time.Duration)) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, every)
		start := time.Now()
		err := m.Probe(pctx)
		took := time.Since(start)
		cancel()
		if ctx.Err() != nil {
			return
		}
		report(err, took)
	}
}

func probe(path string, want []byte) (err error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if rerr := os.Remove(path); err == nil {
			err = rerr
		}
	}()
	_, err = f.Write(want)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	// The daemon runs on the host: were the probe's name replaced by a
	// link meanwhile, it must not be followed to a host file.
	r, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	got, err := io.ReadAll(io.LimitReader(r, int64(len(want))+1))
	r.Close()
	if err != nil {
		return err
	}
	if !bytes.Equal(got, want) {
		return fmt.Errorf("read back %d bytes that differ from the %d written", len(got), len(want))
	}
	return nil
}

// RecoverStale clears a mount left at mountpoint by a daemon that died, by
// detaching it, and reports whether it did. A dead daemon's mount answers
// ENOTCONN to every request the kernel sends; statfs always sends one
// (stat may be answered from the attribute cache). A mountpoint that does
// not answer at all is reported as an error.
func RecoverStale(mountpoint string) (bool, error) {
	answer := make(chan error, 1)
	go func() {
		var st unix.Statfs_t
		answer <- unix.Statfs(mountpoint, &st)
	}()
	var err error
	select {
	case err = <-answer:
	case <-time.After(5 * time.Second):
		return false, fmt.Errorf("mountpoint %s does not answer: a daemon serving it is alive but stuck", mountpoint)
	}
	if err != unix.ENOTCONN && err != unix.ECONNABORTED {
		return false, nil
	}
	if err := unix.Unmount(mountpoint, unix.MNT_DETACH); err != nil {
		return false, fmt.Errorf("clear stale mount at %s: %w", mountpoint, err)
	}
	return true, nil
}

// prepareMountpoint checks the mountpoint and returns its real path: an
// existing directory with nothing mounted on it, outside the scope it
// would serve, and for allowOther inside a directory only root can enter.
func prepareMountpoint(ws *store.Workspace, mountpoint string, allowOther bool) (string, error) {
	abs, err := filepath.Abs(mountpoint)
	if err != nil {
		return "", fmt.Errorf("mountpoint %s: %w", mountpoint, err)
	}
	if _, err := RecoverStale(abs); err != nil {
		return "", err
	}
	dir, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return "", fmt.Errorf("mountpoint %s: %w", mountpoint, err)
	}
	var st, pst unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return "", fmt.Errorf("mountpoint %s: %w", dir, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return "", fmt.Errorf("mountpoint %s is not a directory", dir)
	}
	parent := filepath.Dir(dir)
	if err := unix.Stat(parent, &pst); err != nil {
		return "", fmt.Errorf("mountpoint %s: %w", parent, err)
	}
	if dir != "/" && st.Dev != pst.Dev {
		return "", fmt.Errorf("mountpoint %s: something is already mounted there", dir)
	}
	var scope unix.Stat_t
	if err := unix.Fstat(ws.DirFD(), &scope); err != nil {
		return "", fmt.Errorf("stat scope directory: %w", err)
	}
	for p := dir; ; p = filepath.Dir(p) {
		var a unix.Stat_t
		if err := unix.Stat(p, &a); err == nil && a.Dev == scope.Dev && a.Ino == scope.Ino {
			return "", fmt.Errorf("mountpoint %s lies inside the scope it would serve", dir)
		}
		if p == "/" || p == "." {
			break
		}
	}
	if allowOther && (pst.Uid != 0 || pst.Mode&0o077 != 0) {
		return "", fmt.Errorf("allow_other refused: the mountpoint's parent %s must be owned by root with mode 0700 (it is uid %d, mode %#o), so that only the sandbox's own bind mount reaches the projection", parent, pst.Uid, pst.Mode&0o7777)
	}
	return dir, nil
}
