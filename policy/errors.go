package policy

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"syscall"
)

// Code is a stable, machine-readable reason for a refusal (SPEC §3.4).
// Clients and tests match on it; never rename one.
type Code string

const (
	InvalidPath Code = "invalid_path"
	// NameTooLong is a name over MaxNameBytes or a path over MaxPathBytes:
	// a path the tools could not address.
	NameTooLong     Code = "name_too_long"
	NotFound        Code = "not_found"
	Exists          Code = "exists"
	IsDir           Code = "is_dir"
	NotDir          Code = "not_dir"
	NotEmpty        Code = "not_empty"
	SymlinkRefused  Code = "symlink_refused"
	HardlinkRefused Code = "hardlink_refused"
	// LinkUnsupported answers a new hard link: the workspace never makes
	// one, and programs that get EXDEV copy instead.
	LinkUnsupported    Code = "link_unsupported"
	SpecialFileRefused Code = "special_file_refused"
	PermissionDenied   Code = "permission_denied"
	NotPermitted       Code = "not_permitted"
	ReadOnly           Code = "read_only"
	TooLarge           Code = "too_large"
	QuotaExceeded      Code = "quota_exceeded"
	// NoSpace answers a change the storage itself refused for want of
	// room: the volume is full (bytes or inodes, ENOSPC) or the host
	// filesystem's own quota for the service is spent (EDQUOT from the
	// backing store). QuotaExceeded is the policy's limit; this is the
	// operator's volume. Reads go on working.
	NoSpace Code = "no_space"
	// VolumeReserved answers growth of a scope whose priority class is
	// below its watermark on a volume near full (seed 001 §5.3): the
	// volume keeps its last room for higher-priority work. Reads, deletes
	// and truncations go on working.
	VolumeReserved Code = "volume_reserved"
	// DeniedByHook answers a call a tool.before hook of the platform
	// denied, or one whose hook failed (it fails closed); the message
	// gives the hook's reason.
	DeniedByHook       Code = "denied_by_hook"
	Conflict           Code = "conflict"
	AmbiguousEdit      Code = "ambiguous_edit"
	NoMatch            Code = "no_match"
	NoChange           Code = "no_change"
	Timeout            Code = "timeout"
	Quarantined        Code = "quarantined"
	VolumeUnavailable  Code = "volume_unavailable"
	UnknownOutcome     Code = "unknown_outcome"
	InvalidInput       Code = "invalid_input"
	Unsupported        Code = "unsupported"
	SandboxUnavailable Code = "sandbox_unavailable"
	// SandboxStartFailed: the engine created the container but its runtime
	// could not start it; the message carries the runtime's reason.
	SandboxStartFailed Code = "sandbox_start_failed"
	AuditUnavailable   Code = "audit_unavailable"
	Cancelled          Code = "cancelled"
	Internal           Code = "internal"
	// ConfirmationRequired answers the first call of an operation the
	// policy marks for two-step confirmation (seed 001 §6.3); Token
	// carries the one-time token that performs it.
	ConfirmationRequired Code = "confirmation_required"
	// PatchFailed answers a patch a hunk of which does not apply to the
	// file as it is; the message names the file, the hunk and the
	// closest lines found. Nothing was written.
	PatchFailed Code = "patch_failed"
	// InvalidPatch answers patch text that can't be parsed; the message
	// names the line.
	InvalidPatch Code = "invalid_patch"
	// InvalidCursor answers a change-feed cursor the feed did not give.
	InvalidCursor Code = "invalid_cursor"
	// NotAnImage answers an image read of a file that is not a PNG,
	// JPEG, GIF or WebP image (or is a damaged one).
	NotAnImage Code = "not_an_image"
	// ProcessOnOtherNode answers a call for a process that another node
	// owns (SPEC §5.1); the message names that node.
	ProcessOnOtherNode Code = "process_on_other_node"
	// ProcessServiceUnavailable: no node service (loomfs serve) answers,
	// so processes can't be started or reached.
	ProcessServiceUnavailable Code = "process_service_unavailable"
	// SessionExhausted: the session sandbox's pids limit, memory or /tmp
	// is spent; the message names the limit and the processes that hold
	// it, and what frees it.
	SessionExhausted Code = "session_exhausted"
)

// Error is the one error type every door returns. Message is written for a
// model to act on; SHA256 carries the current hash on a conflict.
type Error struct {
	Code    Code   `json:"code"`
	Message string `json:"message"`
	SHA256  string `json:"current_sha256,omitempty"`
	Count   int    `json:"count,omitempty"`
	// Token is the one-time token a ConfirmationRequired refusal carries.
	Token string `json:"confirm_token,omitempty"`
	Err   error  `json:"-"` // underlying cause, kept for logs
}

func (e *Error) Error() string { return e.Message }
func (e *Error) Unwrap() error { return e.Err }

// Errorf returns an *Error with the given code and message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// WaitEnded is the refusal of a wait for something busy (a lock another
// process or node holds) that ctx ended, its message saying what was busy:
// timeout when ctx's deadline passed (a tool call's budget), cancelled when
// ctx was cancelled. A FUSE request is cancelled when the kernel interrupts
// it because its caller got a signal; cancelled answers EINTR, which
// programs retry (Go's and Python's I/O do it themselves), where a
// timeout would fail their write.
func WaitEnded(ctx context.Context, format string, args ...any) *Error {
	if errors.Is(ctx.Err(), context.Canceled) {
		return Errorf(Cancelled, "interrupted while waiting: "+format, args...)
	}
	return Errorf(Timeout, format, args...)
}

// FencedMessage is what every caller on a node that was fenced reads
// (SPEC: loomfs fence). Its storage client answers ESHUTDOWN to every
// operation once evicted and blocklisted (Ceph's EBLOCKLISTED is
// ESHUTDOWN on Linux): nothing this node writes lands any more, and no
// retry here can succeed.
const FencedMessage = "this node was fenced: it was shut out of the storage volume so that another node could take over its work, and nothing it writes lands any more; the call was refused. Retrying on this node can't succeed: the work continues on another node, and an administrator must re-admit this one"

// fenced is the refusal of a call that met ESHUTDOWN from the volume.
func fenced(err error) *Error {
	return &Error{Code: VolumeUnavailable, Message: FencedMessage, Err: err}
}

// Fenced is the refusal of a call on a node the volume records as fenced
// (its fence record, until an administrator re-admits it); err says why,
// for the operator.
func Fenced(err error) *Error { return fenced(err) }

// IsFenced reports whether err is a fenced node's refusal: the volume
// answered ESHUTDOWN or records this node as fenced.
func IsFenced(err error) bool {
	var pe *Error
	return errors.As(err, &pe) && pe.Message == FencedMessage || errors.Is(err, syscall.ESHUTDOWN)
}

// Unavailable is the refusal of a call because something loomfs keeps on
// the volume (named by what: "the quota account", "the audit log") can't
// be opened or written. A full volume or the backing store's own quota is
// NoSpace, a message a model can act on; anything else is code
// (VolumeUnavailable, AuditUnavailable), whose detail only the operator's
// log shows.
func Unavailable(code Code, what string, err error) *Error {
	switch {
	case errors.Is(err, syscall.ESHUTDOWN):
		return fenced(err)
	case errors.Is(err, syscall.ENOSPC):
		return &Error{Code: NoSpace, Message: what + " can't be written: the storage volume is full (no space or no inodes left), so the call was refused and nothing was written; deleting files this workspace no longer needs may make room, otherwise the operator must free space", Err: err}
	case errors.Is(err, syscall.EDQUOT):
		return &Error{Code: NoSpace, Message: what + " can't be written: the storage volume's own quota for this service is spent (not this workspace's quota), so the call was refused and nothing was written; deleting files this workspace no longer needs may make room, otherwise the operator must raise it", Err: err}
	}
	return &Error{Code: code, Message: fmt.Sprintf("%s can't be written, so nothing is done: %v", what, err), Err: err}
}

// Refused reports whether err is the policy refusing an object for what
// it is or where it is (a link, a special file, a mode, a name), as
// opposed to the storage failing: a walk that meets the one passes the
// object over, one that meets the other must not say it saw everything.
func Refused(err error) bool {
	switch CodeOf(err) {
	case SymlinkRefused, HardlinkRefused, SpecialFileRefused, PermissionDenied, InvalidPath, NameTooLong:
		return true
	}
	return false
}

// CodeOf returns the code of err, or Internal for an error of another kind.
func CodeOf(err error) Code {
	if err == nil {
		return ""
	}
	var pe *Error
	if errors.As(err, &pe) {
		return pe.Code
	}
	if errors.Is(err, syscall.ENOENT) {
		return NotFound
	}
	return Internal
}

// AsError converts any error to an *Error, keeping an existing one. A
// full volume is never internal: an error that carries ENOSPC or EDQUOT
// from wherever it came is NoSpace (Unavailable), and one that carries
// ESHUTDOWN is the node's fence.
func AsError(err error) *Error {
	var pe *Error
	if errors.As(err, &pe) {
		return pe
	}
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) || errors.Is(err, syscall.ESHUTDOWN) {
		return Unavailable(Internal, "the change", err)
	}
	return &Error{Code: Internal, Message: "internal error: " + err.Error(), Err: err}
}

// operatorTrouble holds the codes of failures a model can't fix, each with
// the message a model reads instead of the failure's own text: that text
// comes from the system (a write error, an engine's answer) and names host
// paths, devices and sockets no model or container may see.
var operatorTrouble = map[Code]string{
	Internal:           "loomfs hit an internal error on this call; re-read what it concerns before retrying, and tell the operator if it persists (the detail is in loomfs's log)",
	AuditUnavailable:   "the audit log can't be written (the volume may be full), so the call was refused; retry later, and tell the operator if it persists",
	VolumeUnavailable:  "the workspace's storage volume is unavailable, so the call was refused; retry later, and tell the operator if it persists",
	SandboxUnavailable: "commands can't run: no sandbox is available to this workspace; use the file tools, or retry later and tell the operator if it persists",
}

// Public returns err as a model may see it: the boundary every door's
// answer passes. A refusal loomfs wrote for a model is returned as it is;
// operator trouble (internal errors, an unwritable audit log or volume, a
// missing sandbox) gets a fixed message that says what to do, and the
// original, with its detail, is kept in Err for the operator's log.
func Public(err error) *Error {
	pe := AsError(err)
	msg, ok := operatorTrouble[pe.Code]
	if !ok || pe.Message == msg || pe.Message == FencedMessage {
		return pe
	}
	return &Error{Code: pe.Code, Message: msg, SHA256: pe.SHA256, Count: pe.Count, Token: pe.Token, Err: pe}
}

var hostPath = regexp.MustCompile(`(^|[\s"'(=\[])/[^\s"'():,\]]*`)

// MaskHostPaths replaces every absolute path in msg by "<path>", for a
// message that must keep its words (a container runtime's own, naming the
// engine's state directories) but may not show a model or a container a
// host path. Public replaces the messages that need nothing of their words.
func MaskHostPaths(msg string) string {
	return hostPath.ReplaceAllString(msg, "${1}<path>")
}

// errnos maps each code to what the filesystem answers. It is the only such
// table: the FUSE door calls Errno and never picks an errno of its own.
// Refusing a name is EPERM, never EINVAL: "rm -f" takes EINVAL for a
// missing file and exits 0 with the file still there.
var errnos = map[Code]syscall.Errno{
	InvalidPath:        syscall.EPERM,
	NameTooLong:        syscall.ENAMETOOLONG,
	NotFound:           syscall.ENOENT,
	Exists:             syscall.EEXIST,
	IsDir:              syscall.EISDIR,
	NotDir:             syscall.ENOTDIR,
	NotEmpty:           syscall.ENOTEMPTY,
	SymlinkRefused:     syscall.EPERM,
	HardlinkRefused:    syscall.EPERM,
	LinkUnsupported:    syscall.EXDEV,
	SpecialFileRefused: syscall.EPERM,
	PermissionDenied:   syscall.EACCES,
	NotPermitted:       syscall.EPERM,
	ReadOnly:           syscall.EROFS,
	TooLarge:           syscall.EFBIG,
	QuotaExceeded:      syscall.EDQUOT,
	VolumeReserved:     syscall.ENOSPC,
	Conflict:           syscall.EBUSY,
	Timeout:            syscall.ETIMEDOUT,
	Quarantined:        syscall.EROFS,
	VolumeUnavailable:  syscall.EIO,
	Unsupported:        syscall.EOPNOTSUPP,
	AuditUnavailable:   syscall.EIO,
	Cancelled:          syscall.EINTR,
	InvalidInput:       syscall.EINVAL,
	// The filesystem can't ask twice: a marked operation is refused there.
	ConfirmationRequired: syscall.EPERM,
}

// Errno maps err to the errno the filesystem returns for it. A raw errno
// passes through unchanged.
func Errno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var pe *Error
	if errors.As(err, &pe) {
		if e, ok := errnos[pe.Code]; ok {
			return e
		}
		var en syscall.Errno
		if errors.As(pe.Err, &en) {
			return en
		}
		return syscall.EIO
	}
	var en syscall.Errno
	if errors.As(err, &en) {
		return en
	}
	return syscall.EIO
}

// FromErrno turns a syscall failure on path into an *Error with a code a
// model can act on.
func FromErrno(err error, op, path string) error {
	if err == nil {
		return nil
	}
	var pe *Error
	if errors.As(err, &pe) {
		return pe
	}
	var en syscall.Errno
	if !errors.As(err, &en) {
		return &Error{Code: Internal, Message: fmt.Sprintf("%s %s: %v", op, path, err), Err: err}
	}
	e := &Error{Err: err}
	switch en {
	case syscall.ESHUTDOWN:
		return fenced(err)
	case syscall.ENOENT:
		e.Code, e.Message = NotFound, fmt.Sprintf("%s: no such file or directory", path)
	case syscall.EEXIST:
		e.Code, e.Message = Exists, fmt.Sprintf("%s: already exists", path)
	case syscall.EISDIR:
		e.Code, e.Message = IsDir, fmt.Sprintf("%s: is a directory", path)
	case syscall.ENOTDIR:
		e.Code, e.Message = NotDir, fmt.Sprintf("%s: a path component is not a directory", path)
	case syscall.ENOTEMPTY:
		e.Code, e.Message = NotEmpty, fmt.Sprintf("%s: directory not empty; delete its entries first (deletes are never recursive)", path)
	case syscall.ELOOP:
		e.Code, e.Message = SymlinkRefused, fmt.Sprintf("%s: a symlink is on the path; loomfs never follows symlinks", path)
	case syscall.EXDEV:
		e.Code, e.Message = InvalidPath, fmt.Sprintf("%s: path leaves the workspace", path)
	case syscall.EACCES, syscall.EPERM:
		e.Code, e.Message = PermissionDenied, fmt.Sprintf("%s %s: permission denied", op, path)
	case syscall.EROFS:
		e.Code, e.Message = ReadOnly, fmt.Sprintf("%s %s: read-only file system", op, path)
	case syscall.ENOSPC:
		e.Code, e.Message = NoSpace, fmt.Sprintf("%s %s: the storage volume is full (no space or no inodes left), so nothing was written; deleting files this workspace no longer needs may make room, otherwise the operator must free space", op, path)
	case syscall.EDQUOT:
		e.Code, e.Message = NoSpace, fmt.Sprintf("%s %s: the storage volume's own quota for this service is spent (not this workspace's quota), so nothing was written; deleting files this workspace no longer needs may make room, otherwise the operator must raise it", op, path)
	case syscall.EFBIG:
		e.Code, e.Message = TooLarge, fmt.Sprintf("%s %s: file too large", op, path)
	case syscall.ENAMETOOLONG:
		e.Code, e.Message = NameTooLong, fmt.Sprintf("%s: name too long", path)
	default:
		e.Code, e.Message = Internal, fmt.Sprintf("%s %s: %v", op, path, en)
	}
	return e
}
