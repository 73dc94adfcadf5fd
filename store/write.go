package store

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/newname"
	"github.com/agentloom/loomfs/policy"
)

// WriteResult is what an atomic write did.
type WriteResult struct {
	Bytes   int64  `json:"bytes"`
	SHA256  string `json:"sha256"`
	Created bool   `json:"created"`
}

// Precondition is an optional expected_sha256: nil means none, a pointer to
// "" means the file must not exist.
type Precondition = *string

// WriteFile atomically replaces the file at rel with data: a temporary file
// in the same directory is written, fsynced, renamed over rel, and the
// directory fsynced. A crash leaves the old content or the new, never a torn
// file. If expected is set, the current content must still hash to it.
// Callers serialise writers with the scope lock (Lock).
func (w *Workspace) WriteFile(ctx context.Context, rel string, data []byte, expected Precondition) (WriteResult, error) {
	if err := w.checkWritable(policy.OpWrite, rel); err != nil {
		return WriteResult{}, err
	}
	if err := w.pol.Limits.CheckText(rel, int64(len(data))); err != nil {
		return WriteResult{}, err
	}
	parent, name, err := w.Parent(rel)
	if err != nil {
		return WriteResult{}, err
	}
	defer parent.Close()
	cur, info, exists, err := w.current(parent, rel, name, expected != nil)
	if err != nil {
		return WriteResult{}, err
	}
	if expected != nil && (*expected == "" && exists || *expected != "" && *expected != cur) {
		return WriteResult{}, w.conflict(rel, cur)
	}
	if !exists {
		if err := w.pol.Check(policy.OpCreate, rel); err != nil {
			return WriteResult{}, err
		}
	}
	var addFiles int64
	if !exists {
		addFiles = 1
	}
	// ReserveAt, not Reserve: the cap of a subtree (tmp/) counts too.
	if err := w.ReserveAt(ctx, rel, int64(len(data))-info.Size, addFiles); err != nil {
		return WriteResult{}, err
	}
	if err := ctx.Err(); err != nil {
		w.AdjustAt(rel, info.Size-int64(len(data)), -addFiles)
		return WriteResult{}, policy.Errorf(policy.Cancelled, "write %s cancelled before it started", rel)
	}
	perm := uint32(policy.FilePerm)
	if exists {
		// A replace keeps the mode of the file it replaces (an
		// executable stays one), within what policy.OwnerPerm allows.
		perm = policy.OwnerPerm(info.Perm)
	}
	op := OpWrite
	if !exists {
		op = OpCreate
	}
	if err := w.replace(parent, name, rel, data, perm, !exists, changeBy(ctx, op)); err != nil {
		w.AdjustAt(rel, info.Size-int64(len(data)), -addFiles)
		return WriteResult{}, err
	}
	return WriteResult{Bytes: int64(len(data)), SHA256: hashBytes(data), Created: !exists}, nil
}

// replace writes data to a temporary file of mode perm in parent and
// renames it to name. With mustCreate it refuses to replace an object that
// appeared meanwhile (newname.Place).
func (w *Workspace) replace(parent *Dir, name, rel string, data []byte, perm uint32, mustCreate bool, by Change) error {
	return w.replaceFrom(parent, name, rel, bytes.NewReader(data), perm, mustCreate, by)
}

// replaceFrom is replace with the content read from r; an error of r
// leaves nothing behind.
func (w *Workspace) replaceFrom(parent *Dir, name, rel string, r io.Reader, perm uint32, mustCreate bool, by Change) error {
	if err := w.ReadyToChange(); err != nil {
		return err
	}
	pfd := int(parent.Fd())
	tmp, tmpName, err := w.vol.createTemp(pfd, perm)
	if err != nil {
		return policy.FromErrno(err, "write", rel)
	}
	cleanup := func() {
		tmp.Close()
		if tmpName != "" {
			unix.Unlinkat(pfd, tmpName, 0)
		}
	}
	if _, err := io.Copy(tmp, r); err != nil {
		cleanup()
		return policy.FromErrno(err, "write", rel)
	}
	if err := tmp.Sync(); err != nil {
		cleanup()
		return policy.FromErrno(err, "fsync", rel)
	}
	if tmpName == "" {
		// An O_TMPFILE has no name until now: the window in which a crash
		// leaves a (hidden, reserved) temp name is this link and the rename.
		tmpName = tempName()
		if err := linkTemp(tmp, pfd, tmpName); err != nil {
			tmpName = ""
			cleanup()
			return policy.FromErrno(err, "write", rel)
		}
	}
	if mustCreate {
		err = newname.Place(pfd, tmpName, name)
	} else {
		err = unix.Renameat(pfd, tmpName, pfd, name)
	}
	if err != nil {
		cleanup()
		if err == unix.EEXIST {
			return w.conflict(rel, "")
		}
		return policy.FromErrno(err, "rename", rel)
	}
	tmp.Close()
	w.NoteChangeBy(rel, false, by)
	if err := syncDir(pfd); err != nil && err != unix.EINVAL {
		// The new content is in place, but not known to be durable: not
		// a refusal ("nothing was written"), nor a success.
		return &policy.Error{Code: policy.UnknownOutcome, Message: fmt.Sprintf("%s was written, but the storage could not confirm it durable (its directory's fsync failed), so it may not survive a crash of the node; re-read %s to see what it holds", rel, rel), Err: err}
	}
	return nil
}

// createTemp creates an unnamed file of mode perm in dirfd (O_TMPFILE) or,
// where the filesystem lacks it, a named one under the reserved prefix.
// The mode is perm whatever the umask: perm holds owner bits only, so it
// is set again (one more round trip on a shared filesystem) only when the
// umask takes owner bits away. Once the volume's filesystem has
// answered that it lacks O_TMPFILE (ceph-fuse, NFS), it is not asked
// again: the try costs an open and a close of the directory, round trips
// to a shared filesystem's server.
func (v *Volume) createTemp(dirfd int, perm uint32) (*os.File, string, error) {
	if !v.noTmpfile.Load() {
		// O_PATH fds can't be used for O_TMPFILE; reopen the directory itself.
		dfd, err := unix.Openat(dirfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		if err == nil {
			fd, terr := unix.Openat(dfd, ".", unix.O_TMPFILE|unix.O_WRONLY|unix.O_CLOEXEC, perm)
			unix.Close(dfd)
			if terr == nil {
				if v.umaskOwner {
					unix.Fchmod(fd, perm)
				}
				return os.NewFile(uintptr(fd), "tmpfile"), "", nil
			}
			// Unsupported (EISDIR from a kernel without it); any other
			// refusal may be this directory's alone.
			if terr == unix.EOPNOTSUPP || terr == unix.EISDIR {
				v.noTmpfile.Store(true)
			}
		}
	}
	name := tempName()
	fd, err := unix.Openat(dirfd, name, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, perm)
	if err != nil {
		return nil, "", err
	}
	if v.umaskOwner {
		unix.Fchmod(fd, perm)
	}
	return os.NewFile(uintptr(fd), name), name, nil
}

// umaskNarrowsOwner tells whether the process's umask clears any of the
// owner's bits, or can't be read. Linux shows it in /proc/self/status;
// setting it to learn it would race with other goroutines' creates.
func umaskNarrowsOwner() bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return true
	}
	_, rest, ok := bytes.Cut(b, []byte("\nUmask:\t"))
	if !ok {
		return true
	}
	line, _, _ := bytes.Cut(rest, []byte("\n"))
	mask, err := strconv.ParseUint(string(line), 8, 32)
	return err != nil || mask&0o700 != 0
}

func linkTemp(f *os.File, dirfd int, name string) error {
	err := unix.Linkat(int(f.Fd()), "", dirfd, name, unix.AT_EMPTY_PATH)
	if err == nil {
		return nil
	}
	return unix.Linkat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(int(f.Fd())), dirfd, name, unix.AT_SYMLINK_FOLLOW)
}

func tempName() string {
	var b [8]byte
	rand.Read(b[:])
	return policy.InternalPrefix + "tmp-" + hex.EncodeToString(b[:])
}

// checkWritable refuses a change to a quarantined scope or a volume that
// is not ours, and checks the path's mode. Under a scope lock whose look
// found the scope clear (statelook.go) the first two were done just now,
// after the lock was taken, and are not asked again.
func (w *Workspace) checkWritable(op policy.Op, rel string) error {
	if !w.clearHeld.Load() {
		if err := w.vol.recheck(); err != nil {
			return err
		}
		if err := w.CheckQuarantine(); err != nil {
			return err
		}
	}
	return w.pol.Check(op, rel)
}

// Remove deletes the file or empty directory at rel; never recursive. With
// expected set, a file's content must still hash to it.
func (w *Workspace) Remove(ctx context.Context, rel string, expected Precondition) error {
	if rel == "." {
		return policy.Errorf(policy.PermissionDenied, "the workspace root can't be deleted")
	}
	if err := w.checkWritable(policy.OpDelete, rel); err != nil {
		return err
	}
	parent, name, err := w.Parent(rel)
	if err != nil {
		return err
	}
	defer parent.Close()
	pfd := int(parent.Fd())
	st, mnt, err := lstatAt(pfd, name)
	if err != nil {
		return policy.FromErrno(err, "delete", rel)
	}
	info := w.infoOf(name, &st, mnt)
	if err := policy.CheckObject(policy.OpDelete, rel, info.Object()); err != nil {
		return err
	}
	if info.Kind == policy.KindDir {
		if expected != nil && *expected != "" {
			return policy.Errorf(policy.IsDir, "%s is a directory; expected_sha256 applies to files", rel)
		}
		if err := w.ReadyToChange(); err != nil {
			return err
		}
		if err := unix.Unlinkat(pfd, name, unix.AT_REMOVEDIR); err != nil {
			return policy.FromErrno(err, "delete", rel)
		}
		w.AdjustAt(rel, 0, -1)
		w.NoteChangeBy(rel, false, changeBy(ctx, OpDelete))
		return nil
	}
	if expected != nil {
		cur, _, exists, err := w.currentHash(parent, rel, name)
		if err != nil {
			return err
		}
		if !exists || *expected != cur {
			return w.conflict(rel, cur)
		}
	}
	// Re-check on the fd we are about to remove: it must still be the file
	// we checked (same inode), not something swapped in.
	var again unix.Stat_t
	if err := unix.Fstatat(pfd, name, &again, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return policy.FromErrno(err, "delete", rel)
	}
	if again.Ino != st.Ino || again.Dev != st.Dev {
		return policy.Errorf(policy.Conflict, "%s changed while it was being deleted; re-read and retry", rel)
	}
	if err := w.ReadyToChange(); err != nil {
		return err
	}
	if err := unix.Unlinkat(pfd, name, 0); err != nil {
		return policy.FromErrno(err, "delete", rel)
	}
	w.AdjustAt(rel, -st.Size, -1)
	w.NoteChangeBy(rel, false, changeBy(ctx, OpDelete))
	return nil
}

// Mkdir creates the directory rel (mode 0700), and with parents any missing
// directories above it.
func (w *Workspace) Mkdir(ctx context.Context, rel string, parents bool) (created bool, err error) {
	if rel == "." {
		if parents {
			return false, nil
		}
		return false, policy.Errorf(policy.Exists, "the workspace root already exists")
	}
	if err := w.checkWritable(policy.OpCreate, rel); err != nil {
		return false, err
	}
	if parents {
		dir, _ := policy.Split(rel)
		if dir != "." {
			if info, err := w.Lstat(dir); err != nil {
				if policy.CodeOf(err) != policy.NotFound {
					return false, err
				}
				if _, err := w.Mkdir(ctx, dir, true); err != nil {
					return false, err
				}
			} else if info.Kind != policy.KindDir {
				if err := policy.CheckObject(policy.OpList, dir, info.Object()); err != nil {
					return false, err
				}
			}
		}
	}
	parent, name, err := w.Parent(rel)
	if err != nil {
		return false, err
	}
	defer parent.Close()
	if err := w.ReadyToChange(); err != nil {
		return false, err
	}
	if err := w.ReserveAt(ctx, rel, 0, 1); err != nil {
		return false, err
	}
	if err := unix.Mkdirat(int(parent.Fd()), name, policy.DirPerm); err != nil {
		w.AdjustAt(rel, 0, -1)
		if err == unix.EEXIST && parents {
			info, lerr := w.Lstat(rel)
			if lerr == nil && info.Kind == policy.KindDir {
				return false, nil
			}
			if lerr == nil {
				return false, policy.CheckObject(policy.OpList, rel, info.Object())
			}
		}
		return false, policy.FromErrno(err, "mkdir", rel)
	}
	// The umask may have narrowed it; it is never widened past 0700.
	if fd, err := unix.Openat(int(parent.Fd()), name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err == nil {
		unix.Fchmod(fd, policy.DirPerm)
		unix.Close(fd)
	}
	w.NoteChangeBy(rel, false, changeBy(ctx, OpMkdir))
	return true, nil
}
