package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/callrec"
	"github.com/agentloom/loomfs/policy"
)

// Workspace is one open scope. Its directory is pinned by fd; every access
// resolves a cleaned path beneath that fd (openBeneath) and then works on
// the fds it got. Methods take paths already cleaned by policy.
type Workspace struct {
	vol   *Volume
	scope Scope
	pol   *policy.Policy
	dir   *os.File // O_PATH fd of the scope directory
	state *os.File // O_PATH fd of .agentloom-locks/<hash>
	dev   uint64
	mnt   uint64 // mount id of dir: nothing on another mount is used

	quota *scopeQuota // the scope's shared quota accounts (usage.go, subtree.go)

	journal *journal        // changes for snapshots (journal.go); nil on read-only views
	settled settledJournals // journal files their writers ended, as read (settled.go)
	calls   callrec.Log     // call records (calls.go)

	look      stateLook                // the state directory as last found clear (statelook.go)
	clearHeld atomic.Bool              // the scope lock is held and its look found the scope clear
	idleLock  atomic.Pointer[lockFile] // the lock file last unlocked, kept open (lock.go)

	layoutMade []string       // layout directories Open made (layout.go)
	late       sync.WaitGroup // lock waits that outlived their caller's budget (budget.go)
}

// Scope returns the workspace's scope.
func (w *Workspace) Scope() Scope { return w.scope }

// Policy returns the policy in force for this scope.
func (w *Workspace) Policy() *policy.Policy { return w.pol }

// Volume returns the volume the workspace lives on.
func (w *Workspace) Volume() *Volume { return w.vol }

// DirFD returns the pinned scope directory fd. Callers must not close it.
func (w *Workspace) DirFD() int { return int(w.dir.Fd()) }

// Close releases the pinned fds, once no lock wait that outlived its
// caller's budget still uses them.
func (w *Workspace) Close() error {
	w.late.Wait()
	w.closeIdleLock()
	err := w.closeAccount()
	w.closeJournal()
	w.calls.Close()
	w.state.Close()
	return errors.Join(err, w.dir.Close())
}

// Resolve opens the cleaned path rel beneath the scope with flags (always
// O_NOFOLLOW, never leaving the scope). It does not check the object.
func (w *Workspace) Resolve(rel string, flags int, mode uint32) (*os.File, error) {
	fd, err := openBeneath(w.DirFD(), rel, flags, mode)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), rel), nil
}

// Dir is a directory fd held for a few *at calls. It is lighter than an
// *os.File (no fcntl, no finalizer), which matters on the filesystem's hot
// path; its user closes it.
type Dir struct{ fd int }

// Fd returns the directory's file descriptor.
func (d *Dir) Fd() uintptr { return uintptr(d.fd) }

// Close releases the fd.
func (d *Dir) Close() error { return unix.Close(d.fd) }

// Parent opens the directory holding rel and returns it with rel's last
// name, so the caller can make one *at call on it. rel must not be ".".
func (w *Workspace) Parent(rel string) (*Dir, string, error) {
	dir, name := policy.Split(rel)
	if err := checkEntry(rel, name); err != nil {
		return nil, "", err
	}
	fd, err := openBeneath(w.DirFD(), dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		if err == unix.ENOTDIR && dir != "." {
			// O_DIRECTORY|O_NOFOLLOW on a symlink answers ENOTDIR, not
			// ELOOP: when the parent itself is a symlinked directory (or an
			// emulated link, never followed here either), say so
			// (symlink_refused), not "not a directory".
			if info, lerr := w.Lstat(dir); lerr == nil && (info.Kind == policy.KindSymlink || info.Kind == policy.KindLink) {
				err = unix.ELOOP
			}
		}
		return nil, "", policy.FromErrno(err, "open", dir)
	}
	return &Dir{fd}, name, nil
}

// ParentIn is Parent for a caller that holds the directory of rel open
// already, as dirFD (a mount keeps the directories it made open): it
// checks rel's last name as Parent does and takes dirFD over, which the
// Dir then closes.
func (w *Workspace) ParentIn(dirFD int, rel string) (*Dir, string, error) {
	_, name := policy.Split(rel)
	if err := checkEntry(rel, name); err != nil {
		unix.Close(dirFD)
		return nil, "", err
	}
	return &Dir{dirFD}, name, nil
}

// checkEntry refuses a last name that is not one entry of its directory.
// Cleaned paths never have one, but the store is the last line: without
// this, ".." (or "a/../..") would open the scope's parent directory, and
// a name with a "/" would be resolved by a plain openat.
func checkEntry(rel, name string) error {
	if name == ".." || strings.Contains(name, "/") {
		return policy.Errorf(policy.InvalidPath, "invalid path %q: \"..\" components are refused; paths stay inside the workspace", strings.ToValidUTF8(rel, "?"))
	}
	return nil
}

// Lstat describes the object at rel without following it.
func (w *Workspace) Lstat(rel string) (Info, error) {
	if rel == "." {
		st, mnt, err := lstatAt(w.DirFD(), "")
		if err != nil {
			return Info{}, policy.FromErrno(err, "stat", rel)
		}
		return w.infoOf(".", &st, mnt), nil
	}
	parent, name, err := w.Parent(rel)
	if err != nil {
		return Info{}, err
	}
	defer parent.Close()
	st, mnt, err := lstatAt(int(parent.Fd()), name)
	if err != nil {
		return Info{}, policy.FromErrno(err, "stat", rel)
	}
	return w.infoOf(name, &st, mnt), nil
}

// Open opens the existing object at rel for op with open flags. The object
// is checked before the open (so a FIFO or device is never opened by a
// refused call) and again on the fd after it (so a swap in between is
// caught). The file is returned with its Info.
func (w *Workspace) Open(op policy.Op, rel string, flags int) (*os.File, Info, error) {
	o, err := w.OpenFD(op, rel, flags)
	return asFile(rel, o, err)
}

// Opened is a file OpenFD opened: its bare descriptor, which the caller
// closes, and what the descriptor's statx said once it was open.
type Opened struct {
	FD   int
	Info Info
	// Statx carries the birth time too (where the filesystem reports one),
	// which Info's Stat has no room for.
	Statx unix.Statx_t
}

// OpenFD is Open for a caller that keeps the bare descriptor: the FUSE
// door opens a backing file for every open(2) it serves, and an *os.File
// would add an allocation, a cleanup and an fcntl of its own to each, and
// the caller's own statx of what was opened another call.
func (w *Workspace) OpenFD(op policy.Op, rel string, flags int) (Opened, error) {
	if rel == "." {
		return w.openChecked(op, rel, flags, nil, ".")
	}
	parent, name, err := w.Parent(rel)
	if err != nil {
		return Opened{}, err
	}
	defer parent.Close()
	return w.openChecked(op, rel, flags, parent, name)
}

// RecheckFD describes again what fd, a file OpenFD opened for op at rel,
// is now, and checks it for op as OpenFD did: a caller that keeps such a
// descriptor to serve later opens (the FUSE door's kept readers) asks this
// instead of opening the path again, so the same rules refuse a file
// someone since hard-linked, or unlinked (no link left), behind loomfs's
// back.
func (w *Workspace) RecheckFD(op policy.Op, rel string, fd int) (unix.Statx_t, error) {
	sx, err := StatxAt(fd, "", StatxMask)
	if err != nil {
		return sx, policy.FromErrno(err, op.String(), rel)
	}
	if sx.Nlink == 0 {
		return sx, policy.Errorf(policy.NotFound, "%s: no such file", rel)
	}
	st := statOf(&sx)
	info := w.infoOf(path.Base(rel), &st, sx.Mnt_id)
	return sx, policy.CheckObject(op, rel, info.Object())
}

// openFile is Open for a caller that holds the parent directory.
func (w *Workspace) openFile(op policy.Op, rel string, flags int, parent *Dir, name string) (*os.File, Info, error) {
	o, err := w.openChecked(op, rel, flags, parent, name)
	return asFile(rel, o, err)
}

// asFile wraps what openChecked opened as an *os.File.
func asFile(rel string, o Opened, err error) (*os.File, Info, error) {
	if err != nil {
		return nil, Info{}, err
	}
	return os.NewFile(uintptr(o.FD), rel), o.Info, nil
}

// openChecked opens name in parent (the scope itself when parent is nil)
// after checking what is there for op, and checks again what it opened:
// the object may have been replaced in between. The open does not block
// (a FIFO swapped in would hold the caller forever), and a regular file
// is put back into blocking mode for ordinary reads and writes.
func (w *Workspace) openChecked(op policy.Op, rel string, flags int, parent *Dir, name string) (Opened, error) {
	dirfd := w.DirFD()
	if parent != nil {
		if err := checkEntry(rel, name); err != nil {
			return Opened{}, err
		}
		dirfd = int(parent.Fd())
		if _, err := w.lstatChecked(op, rel, dirfd, name); err != nil {
			return Opened{}, err
		}
	}
	fd, err := unix.Openat(dirfd, name, flags|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return Opened{}, policy.FromErrno(err, op.String(), rel)
	}
	sx, err := StatxAt(fd, "", StatxMask)
	if err != nil {
		unix.Close(fd)
		return Opened{}, policy.FromErrno(err, op.String(), rel)
	}
	st := statOf(&sx)
	info := w.infoOf(name, &st, sx.Mnt_id)
	if err := policy.CheckObject(op, rel, info.Object()); err != nil {
		unix.Close(fd)
		return Opened{}, err
	}
	if info.Kind == policy.KindRegular {
		// F_SETFL sets only the status flags (O_APPEND, O_DIRECT,
		// O_NOATIME, O_ASYNC, O_NONBLOCK), so the caller's, without
		// O_NONBLOCK, are all it needs: no F_GETFL first.
		unix.FcntlInt(uintptr(fd), unix.F_SETFL, flags&^unix.O_NONBLOCK)
	}
	return Opened{FD: fd, Info: info, Statx: sx}, nil
}

// ReadFile reads the whole regular file at rel, refusing one over the text
// limit, and returns its bytes and sha256.
func (w *Workspace) ReadFile(ctx context.Context, rel string) ([]byte, string, error) {
	f, info, err := w.Open(policy.OpRead, rel, unix.O_RDONLY)
	if err != nil {
		return nil, "", err
	}
	defer f.Close()
	if info.Kind == policy.KindDir {
		return nil, "", policy.Errorf(policy.IsDir, "%s is a directory; use workspace_list", rel)
	}
	if err := w.pol.Limits.CheckText(rel, info.Size); err != nil {
		return nil, "", err
	}
	// Read at most one byte past the limit so growth after fstat is caught.
	b, err := io.ReadAll(io.LimitReader(f, w.pol.Limits.TextBytes+1))
	if err != nil {
		return nil, "", policy.FromErrno(err, "read", rel)
	}
	if err := w.pol.Limits.CheckText(rel, int64(len(b))); err != nil {
		return nil, "", err
	}
	return b, hashBytes(b), ctx.Err()
}

// HashFile returns the sha256 of the regular file at rel, or "" when the
// file is over the text limit.
func (w *Workspace) HashFile(rel string) (string, error) {
	f, info, err := w.Open(policy.OpRead, rel, unix.O_RDONLY)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if info.Kind != policy.KindRegular || info.Size > w.pol.Limits.TextBytes {
		return "", nil
	}
	return hashReader(f)
}

// currentHash returns the sha256 of the file name in parent, or "" if it
// does not exist. Objects that may not be written are refused.
func (w *Workspace) currentHash(parent *Dir, rel, name string) (hash string, info Info, exists bool, err error) {
	return w.current(parent, rel, name, true)
}

// current is currentHash, reading the file for its hash only if hash is
// set: a write without expected_sha256 needs the old file's size and mode,
// not its content, which may be megabytes, read back over the network on
// a shared filesystem. Nor does it open the file then: the replace that
// follows renames over the name and never opens what is there, so a
// check of what the name holds (lstat) is all the open's own check would
// add, and on a shared filesystem the open, its statx and its close are
// each a round trip to the server.
func (w *Workspace) current(parent *Dir, rel, name string, hash bool) (sum string, info Info, exists bool, err error) {
	if !hash && parent != nil {
		return w.currentInfo(parent, rel, name)
	}
	f, info, err := w.openFile(policy.OpWrite, rel, unix.O_RDONLY, parent, name)
	if err != nil {
		if policy.CodeOf(err) == policy.NotFound {
			return "", Info{}, false, nil
		}
		return "", Info{}, false, err
	}
	defer f.Close()
	if info.Kind == policy.KindDir {
		return "", info, true, policy.Errorf(policy.IsDir, "%s is a directory", rel)
	}
	if !hash {
		return "", info, true, nil
	}
	h, err := hashReader(f)
	return h, info, true, err
}

// currentInfo is current without the hash, from what name in parent is.
func (w *Workspace) currentInfo(parent *Dir, rel, name string) (sum string, info Info, exists bool, err error) {
	if err := checkEntry(rel, name); err != nil {
		return "", Info{}, false, err
	}
	info, err = w.lstatChecked(policy.OpWrite, rel, int(parent.Fd()), name)
	if err != nil {
		if policy.CodeOf(err) == policy.NotFound {
			return "", Info{}, false, nil
		}
		return "", Info{}, false, err
	}
	if info.Kind == policy.KindDir {
		return "", info, true, policy.Errorf(policy.IsDir, "%s is a directory", rel)
	}
	return "", info, true, nil
}

// lstatChecked describes name in dirfd, refused if op may not use what
// is there (policy.CheckObject).
func (w *Workspace) lstatChecked(op policy.Op, rel string, dirfd int, name string) (Info, error) {
	st, mnt, err := lstatAt(dirfd, name)
	if err != nil {
		return Info{}, policy.FromErrno(err, op.String(), rel)
	}
	info := w.infoOf(name, &st, mnt)
	if err := policy.CheckObject(op, rel, info.Object()); err != nil {
		return Info{}, err
	}
	return info, nil
}

func hashBytes(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func hashReader(r io.Reader) (string, error) {
	h := sha256.New()
	if _, err := io.Copy(h, r); err != nil {
		return "", fmt.Errorf("hash: %w", err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// ConflictError is the error a stale expected_sha256 for rel gets when
// its hash is current ("" for no file), for a door that checks hashes
// itself.
func (w *Workspace) ConflictError(rel, current string) error { return w.conflict(rel, current) }

// conflict builds the error a stale expected_sha256 gets. The current hash
// of a file that can't be read back here (write-only) is not shown: it
// would tell its content.
func (w *Workspace) conflict(rel, current string) error {
	if current != "" && w.pol.Check(policy.OpRead, rel) != nil {
		return policy.Errorf(policy.Conflict, "%s does not match expected_sha256 (its hash is not shown: the file can't be read back here)", rel)
	}
	if current == "" {
		e := policy.Errorf(policy.Conflict, "%s does not exist but expected_sha256 names a version; re-read the workspace and retry", rel)
		return e
	}
	e := policy.Errorf(policy.Conflict, "%s changed since you read it (current sha256 %s); re-read the file and retry", rel, current)
	e.SHA256 = current
	return e
}
