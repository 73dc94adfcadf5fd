package fusefs

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
	"github.com/agentloom/loomfs/throttle"
)

// fsys is what every node of one mount shares: the workspace, its policy,
// the audit sink and the options.
type fsys struct {
	ws        *store.Workspace
	pol       *policy.Policy
	opts      Options
	uid, gid  uint32
	dev       uint64 // the scope directory's device; no other is served
	mnt       uint64 // and its mount id: no other mount is served
	sink      audit.Sink
	actor     audit.Actor
	scopeHash string
	root      *node
	gate      quarantineGate
	// timeout is how long the kernel may cache an entry or attributes;
	// the mount leaves go-fuse no default, so each reply sets its own.
	timeout time.Duration
	// limit holds the scope to its policy's I/O rates; nil for none.
	limit *throttle.Limiter
	// call is the call served since Mounted.Serve, nil before; first is
	// the one Options named, served until then.
	call  atomic.Pointer[servedCall]
	first *servedCall
	// coherent: the mount follows the change journals (follow.go), so
	// the kernel may keep failed lookups, listings and pages too.
	coherent bool
	// changedStat is the statx flag that describes an object just
	// created or changed through an fd (statChanged).
	changedStat int

	// open holds the file handles the kernel has not released yet, so an
	// unmount can still summarise them (the kernel sends RELEASE
	// asynchronously, and drops what is pending when the mount goes).
	open sync.Map // *handle → struct{}

	// locked holds the files with POSIX locks held through the mount, so
	// an unmount can release them; flushes the lock owner of each FLUSH
	// being served (lock.go). flushCount counts FLUSH requests; tests use
	// it.
	locked     sync.Map // *nodeLocks → struct{}
	flushes    sync.Map // request's cancel channel → lock owner
	flushCount atomic.Int64

	// dirOpens counts the backing directories opened for open directories
	// (OpendirHandle), and opendirs the OPENDIRs the kernel sent where it
	// keeps listings (openlessDirs); tests use them.
	dirOpens atomic.Int64
	opendirs atomic.Int64
	// drops counts the follower's drops (a line of another writer each,
	// or all at once), before the kernel is told: what the mount knows of
	// the directories it made holds only while it stands still
	// (newdir.go); tests use it too.
	drops atomic.Int64
	// kept is the directories the mount made and keeps open
	// (newdir.go).
	kept keptDirs
	// readers is the files the mount keeps open for reading (reader.go);
	// readerOpens counts the opens served from them (tests use it).
	readers     *keptReaders
	readerOpens atomic.Int64
	// absentLookups counts the lookups answered from what the mount knows
	// of a directory it made (newdir.go); tests use it.
	absentLookups atomic.Int64

	// staleReads tells the kernel's retry of a read after ESTALE
	// (stale.go).
	staleReads staleReads

	// readySince is when the last health probe passed (UnixNano), 0 while
	// the mount is not known healthy: then policy.ReadyFile is absent.
	readySince atomic.Int64
	// probing is the name of the health probe's file while a probe is
	// under way: loomfs's own, so never listed.
	probing atomic.Pointer[string]

	// daemonReads counts read requests the daemon served (not the
	// kernel through passthrough); tests use it.
	daemonReads atomic.Int64
	// releasing counts the releases being served: a handle leaves open
	// before its release has noted its end and written its record, and
	// a test that waits for every release waits for these too.
	releasing atomic.Int64
}

func newFsys(ws *store.Workspace, opts Options) (*fsys, *unix.Statx_t, error) {
	var root unix.Statx_t
	if err := unix.Statx(ws.DirFD(), "", unix.AT_EMPTY_PATH|unix.AT_STATX_SYNC_AS_STAT, statxMask, &root); err != nil {
		return nil, nil, fmt.Errorf("stat scope directory: %w", err)
	}
	uid, gid := opts.owner()
	sc := ws.Scope()
	actor := opts.Actor
	if actor.Space == "" && actor.Agent == "" && actor.Session == "" {
		actor.Space, actor.Agent, actor.Session = sc.Space, sc.Agent, sc.Session
		actor.Run, actor.Instance = sc.Run, sc.Instance
	}
	sink := opts.Audit
	if sink == nil {
		sink = audit.Discard
	}
	first := newServedCall(Call{TraceID: opts.TraceID, CallID: opts.CallID, Refused: opts.Refused, Trace: opts.Trace}, actor)
	f := &fsys{
		ws:        ws,
		pol:       ws.Policy(),
		opts:      opts,
		uid:       uid,
		gid:       gid,
		dev:       devOf(&root),
		mnt:       root.Mnt_id,
		sink:      sink,
		first:     first,
		actor:     actor,
		scopeHash: sc.Hash(),
		gate:      quarantineGate{ws: ws},
		timeout:   opts.cacheTimeout(ws.Policy().StrictCache()),
		coherent:  !ws.Policy().StrictCache() && opts.CacheTimeout >= 0,
		limit:     ws.Limiter(),

		changedStat: unix.AT_STATX_SYNC_AS_STAT,
	}
	if root.Mask&unix.STATX_BTIME == 0 {
		// See statChanged.
		f.changedStat = unix.AT_STATX_DONT_SYNC
	}
	f.readers = &keptReaders{}
	if f.coherent && !opts.Passthrough {
		f.readers = newKeptReaders(ws.DirFD())
	}
	f.sink = tracedSink{Sink: sink, f: f}
	f.root = &node{fsys: f}
	f.root.perm.Store(uint32(root.Mode) & 0o7777)
	return f, &root, nil
}

// admit asks the policy whether op may be made at the cleaned path rel
// and, for a change, whether the mount and the scope take changes now.
func (f *fsys) admit(op policy.Op, rel string) error {
	if op == policy.OpCreate && f.probingName(rel) {
		// The probe's file is loomfs's own, under a name no door may
		// create; the rest of the policy holds for it.
		op = policy.OpWrite
	}
	if err := f.pol.Check(op, rel); err != nil {
		return err
	}
	if op.Mutates() {
		return f.writable()
	}
	return nil
}

// access asks the policy whether the process that made the request in ctx
// may have want on obj at rel. The mount has no default_permissions (the
// kernel's checks cost a round trip after every change to a directory), so
// this is where the sandbox user's permissions are enforced. A request that
// names no caller is refused.
func (f *fsys) access(ctx context.Context, rel string, obj policy.Object, want policy.Access) error {
	c, ok := fuse.FromContext(ctx)
	if !ok {
		return policy.Errorf(policy.PermissionDenied, "%s: permission denied: the request names no caller", rel)
	}
	return policy.CheckAccess(rel, c.Uid, f.uid, obj, want)
}

// writable refuses every change to a read-only mount or a quarantined
// scope.
func (f *fsys) writable() error {
	if f.opts.ReadOnly {
		return policy.Errorf(policy.ReadOnly, "the workspace is mounted read-only")
	}
	return f.gate.check()
}

// quarantineGate answers Workspace.CheckQuarantine, asking the store at
// most once a second: it is on the path of every write(2).
type quarantineGate struct {
	ws    *store.Workspace
	state atomic.Pointer[gateState]
}

type gateState struct {
	until time.Time
	err   error
}

const quarantineRecheck = time.Second

func (g *quarantineGate) check() error {
	now := time.Now()
	if s := g.state.Load(); s != nil && now.Before(s.until) {
		return s.err
	}
	err := g.ws.CheckQuarantine()
	g.state.Store(&gateState{until: now.Add(quarantineRecheck), err: err})
	return err
}

// refusal reports whether a store error is the policy refusing the object
// found (a symlink, a hard link, a special file, a setuid file, another
// filesystem) rather than a plain failure.
func refusal(err error) bool { return policy.Refused(err) }

// Audit.

func (f *fsys) event(ctx context.Context, op, rel string) audit.Event {
	traceID, callID, actor, _ := f.served()
	e := audit.Event{
		TraceID: traceID,
		CallID:  callID,
		Actor:   actor,
		Scope:   f.scopeHash,
		Source:  audit.SourceFUSE,
		Op:      op,
		Path:    rel,
	}
	if c, ok := fuse.FromContext(ctx); ok && c.Pid != 0 {
		e.Detail = map[string]any{"pid": c.Pid, "uid": c.Uid}
	}
	return e
}

func detail(e *audit.Event, key string, v any) {
	if e.Detail == nil {
		e.Detail = map[string]any{}
	}
	e.Detail[key] = v
}

// refused records a refusal, tells Options.Refused, and returns what the
// caller answers.
func (f *fsys) refused(ctx context.Context, e audit.Event, err error) syscall.Errno {
	e.Result, e.Code = "refused", string(policy.CodeOf(err))
	// The operation is refused whether or not this record is kept.
	_ = f.sink.Record(ctx, e)
	errno := policy.Errno(err)
	if _, _, _, tell := f.served(); tell != nil {
		pe := policy.AsError(err)
		tell(Refusal{Op: e.Op, Path: e.Path, Errno: errno, Code: pe.Code, Message: pe.Message})
	}
	return errno
}

// Refusal is one request the mount refused: what a program in the
// projection met, told the way the tools tell it.
type Refusal struct {
	Op      string        // the filesystem operation, as in the audit record: "write", "link", "open"
	Path    string        // cleaned, relative to the scope
	Errno   syscall.Errno // what the request was answered
	Code    policy.Code
	Message string // the policy's message, the one the tools give
}

// begin records a change about to be made; if the record can't be kept,
// or the change journal can't take it, the change is refused.
func (f *fsys) begin(ctx context.Context, e audit.Event) syscall.Errno {
	if err := f.ws.ReadyToChange(); err != nil {
		return f.refused(ctx, e, err)
	}
	e.Result = "ok"
	if err := f.sink.Record(ctx, e); err != nil {
		return policy.Errno(policy.Unavailable(policy.AuditUnavailable, "the audit log", err))
	}
	return 0
}

// failed records that a change failed in the store and returns what the
// caller answers.
func (f *fsys) failed(ctx context.Context, e audit.Event, err error) syscall.Errno {
	e.Result, e.Code = "error", string(policy.CodeOf(policy.FromErrno(err, e.Op, e.Path)))
	_ = f.sink.Record(ctx, e)
	return policy.Errno(err)
}

// Objects and attributes.

// statxMask is what the daemon asks statx for: the birth time with the
// rest, which a node's generation is taken from (store.StatxMask, what
// the store's opens describe, so an open and a lookup agree).
const statxMask = store.StatxMask

// statAt describes name in dirfd without following it; an empty name
// describes dirfd itself.
func statAt(dirfd int, name string) (unix.Statx_t, error) {
	return store.StatxAt(dirfd, name, statxMask)
}

// statChanged describes the object open as fd just after it was created
// or changed through fd (a create, a mkdir, a chmod, a truncate, times
// set). On a scope whose filesystem reports no birth time (a FUSE client
// such as ceph-fuse, which asks its server at every stat), the kernel's
// copy of the attributes is taken: the reply to the change just refreshed
// it, so asking the server again (a round trip, two per created file)
// learns nothing. Where birth times are reported (local filesystems, which
// answer stat at once anyway) it asks as statAt does, since a copy taken
// from a reply without a birth time would give the node another
// generation than its next lookup does.
func (f *fsys) statChanged(fd int) (unix.Statx_t, error) {
	var sx unix.Statx_t
	err := unix.Statx(fd, "", unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW|f.changedStat, statxMask, &sx)
	return sx, err
}

func devOf(sx *unix.Statx_t) uint64 { return unix.Mkdev(sx.Dev_major, sx.Dev_minor) }

// objectOf describes sx for the policy, through the same policy.ObjectOf
// the tools use.
func objectOf(sx *unix.Statx_t) policy.Object {
	var st unix.Stat_t
	st.Mode = uint32(sx.Mode)
	st.Size = int64(sx.Size)
	setUint(&st.Nlink, sx.Nlink)
	return policy.ObjectOf(&st)
}

func setUint[T ~uint32 | ~uint64](p *T, v uint32) { *p = T(v) }

// stableAttr is a node's identity: the backing inode number and, as the
// generation, its birth time, so a reused inode number is a new node.
func stableAttr(sx *unix.Statx_t) fs.StableAttr {
	sa := fs.StableAttr{Mode: typeOf(sx), Ino: sx.Ino}
	if sx.Mask&unix.STATX_BTIME != 0 {
		sa.Gen = uint64(sx.Btime.Sec)*1e9 + uint64(sx.Btime.Nsec)
	}
	if sa.Ino == ^uint64(0) { // reserved by go-fuse
		sa.Ino--
	}
	return sa
}

// isLink reports whether sx describes an emulated symbolic link: a
// regular file carrying policy.LinkMarker (store/link.go).
func isLink(sx *unix.Statx_t) bool {
	return uint32(sx.Mode)&unix.S_IFMT == unix.S_IFREG && uint32(sx.Mode)&policy.LinkMarker != 0
}

// typeOf is the file type the mount shows for sx: S_IFLNK for an emulated
// link, the backing object's type otherwise.
func typeOf(sx *unix.Statx_t) uint32 {
	if isLink(sx) {
		return unix.S_IFLNK
	}
	return uint32(sx.Mode) & unix.S_IFMT
}

// sameObject reports whether sx still describes the object of identity sa.
func sameObject(sa fs.StableAttr, sx *unix.Statx_t) bool {
	return stableAttr(sx) == sa
}

// fillAttr shows sx as the mount shows it: owned by the sandbox user, with
// the owner bits of the backing object and never a group or other bit (the
// sandbox user's are the only ones that count), and special files with no
// permissions, so they can't be opened through the mount (the kernel would
// open them locally, not the backing object).
func (f *fsys) fillAttr(sx *unix.Statx_t, out *fuse.Attr) {
	out.Ino = sx.Ino
	out.Size = sx.Size
	out.Blocks = sx.Blocks
	out.Blksize = sx.Blksize
	out.Atime, out.Atimensec = uint64(sx.Atime.Sec), sx.Atime.Nsec
	out.Mtime, out.Mtimensec = uint64(sx.Mtime.Sec), sx.Mtime.Nsec
	out.Ctime, out.Ctimensec = uint64(sx.Ctime.Sec), sx.Ctime.Nsec
	out.Mode = uint32(sx.Mode) &^ 0o077
	if isLink(sx) {
		// An emulated link, shown as the symlink it stands for; its size
		// is its target's length, as a symlink's is.
		out.Mode = unix.S_IFLNK | 0o777
	}
	out.Nlink = sx.Nlink
	out.Uid, out.Gid = f.uid, f.gid
	out.Rdev = 0
	switch out.Mode & unix.S_IFMT {
	case unix.S_IFREG, unix.S_IFDIR, unix.S_IFLNK:
	default:
		out.Mode &= unix.S_IFMT
	}
}

// setEntry sets how long the kernel may cache the entry and attributes of
// an object described by sx. A FIFO's entry is never cached: the kernel
// opens a FIFO itself without asking the daemon, so every use of its name
// must come to Lookup, which refuses it to the sandbox user.
func (f *fsys) setEntry(sx *unix.Statx_t, out *fuse.EntryOut) {
	if sx.Mode&unix.S_IFMT == unix.S_IFIFO {
		return
	}
	out.SetEntryTimeout(f.timeout)
	out.SetAttrTimeout(f.timeout)
}

// crossMount refuses, by the policy's rule, an object sx at rel on another
// filesystem or another mount than the scope's: a bind mount of the same
// filesystem keeps the device number, only the mount id tells.
func (f *fsys) crossMount(rel string, sx *unix.Statx_t) error {
	if devOf(sx) != f.dev || sx.Mnt_id != f.mnt {
		return policy.CrossMount(rel)
	}
	return nil
}

// reserve checks and counts a change at rel of addBytes and addFiles
// against the scope quota and the caps of its subtrees. The health probe's
// file is counted but never refused: it is loomfs's own, a few bytes gone
// at once, and a workspace the agent filled must still pass its probe, so
// that a command can run to free space.
func (f *fsys) reserve(ctx context.Context, rel string, addBytes, addFiles int64) error {
	if p := f.probing.Load(); p != nil && *p == rel {
		f.ws.AdjustAt(rel, addBytes, addFiles)
		return nil
	}
	return f.ws.ReserveAt(ctx, rel, addBytes, addFiles)
}

// by says a change at rel is this projection's, made for its command's
// call, or loomfs's own (the health probe's file).
func (f *fsys) by(op, rel string) store.Change {
	if p := f.probing.Load(); p != nil && *p == rel {
		return store.Change{Op: op, Source: store.SourceLoomfs}
	}
	return store.Change{Op: op, Source: store.SourceProjection, Call: f.opts.CallID}
}
