package fusefs

import (
	"syscall"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/agentloom/loomfs/audit"
)

// Owner shown for every object when Options leaves it unset: the sandbox
// containers' non-root user (SPEC §5).
const (
	DefaultUID = 1000
	DefaultGID = 1000
)

// DefaultCacheTimeout is how long the kernel may trust an entry, an
// attribute or a failed lookup it got from the mount while the change
// journals keep it coherent (see the package doc): only a change made
// behind loomfs's back waits that long to be seen.
const DefaultCacheTimeout = 5 * time.Minute

// StrictCacheTimeout is the entry and attribute lifetime under the policy's
// "cache: strict", the libfuse default.
const StrictCacheTimeout = time.Second

// DefaultJournalPoll is how often a mount reads the change journals when
// nothing woke it: the bound on how late it sees a change made on another
// node, whose journal lines raise no inotify event here.
const DefaultJournalPoll = 500 * time.Millisecond

// Options configure a mount. The zero value mounts the scope read-write for
// uid:gid 1000:1000, visible to the mounting user only.
type Options struct {
	// UID and GID own every object the mount shows; 0 means DefaultUID and
	// DefaultGID. The daemon does the real I/O as itself.
	UID, GID uint32

	// AllowOther lets users other than the mounting one (the sandbox
	// container's) use the mount. It is accepted only for a mountpoint
	// whose parent directory is owned by root and closed to everyone else
	// (mode 0700 or narrower).
	AllowOther bool

	// ReadOnly refuses every change with EROFS and mounts read-only.
	ReadOnly bool

	// UserXattrs serves extended attributes in the "user." namespace.
	// Every other namespace is refused whatever this says; without it the
	// mount has no extended attributes at all.
	UserXattrs bool

	// Passthrough lets the kernel read files opened read-only straight
	// from the backing file (Linux 6.9+, CAP_SYS_ADMIN). Writes always go
	// through the daemon.
	Passthrough bool

	// NoFollowLinks shows emulated symbolic links but answers readlink
	// with EPERM, so no path walked through the mount is sent elsewhere by
	// a link. A mount on the host wants it: there a link to /etc/passwd,
	// followed by a host process, names the host's own file. A sandbox's
	// mount does not: inside the container a link resolves against the
	// container's own view.
	NoFollowLinks bool

	// CacheTimeout is the kernel's entry and attribute cache lifetime;
	// 0 means DefaultCacheTimeout (StrictCacheTimeout under "cache:
	// strict"), negative means no caching.
	CacheTimeout time.Duration

	// JournalPoll is how often the mount reads the change journals
	// without an inotify event; 0 means DefaultJournalPoll.
	JournalPoll time.Duration

	// Audit receives a record of every change and every refusal; nil
	// means audit.Discard.
	Audit audit.Sink
	// Actor is recorded with every event. Unset fields are filled from the
	// workspace's scope.
	Actor audit.Actor
	// TraceID and CallID are recorded with every event: the trace and the
	// tool call (a sandbox command) the mount serves.
	TraceID, CallID string
	// Trace is that call's span, as in Call.
	Trace trace.SpanContext

	// Refused, if set, is told of every request the mount refuses, as it
	// refuses it (from the request's goroutine: it must not block), so
	// that a command's result can explain what the policy refused it.
	Refused func(Refusal)

	// Requests, if set, is told of every FUSE request the mount answers:
	// its opcode, the errno it was answered (0 for success) and how long
	// it took, from the request's goroutine (it must not block). Nil
	// costs nothing: the requests are not timed.
	Requests func(op string, errno syscall.Errno, took time.Duration)

	// Debug logs every FUSE request and reply to stderr.
	Debug bool
}

func (o Options) owner() (uid, gid uint32) {
	uid, gid = o.UID, o.GID
	if uid == 0 {
		uid = DefaultUID
	}
	if gid == 0 {
		gid = DefaultGID
	}
	return uid, gid
}

func (o Options) cacheTimeout(strict bool) time.Duration {
	switch {
	case o.CacheTimeout == 0 && strict:
		return StrictCacheTimeout
	case o.CacheTimeout == 0:
		return DefaultCacheTimeout
	case o.CacheTimeout < 0:
		return 0
	}
	return o.CacheTimeout
}

func (o Options) journalPoll() time.Duration {
	if o.JournalPoll <= 0 {
		return DefaultJournalPoll
	}
	return o.JournalPoll
}
