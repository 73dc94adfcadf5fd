package store

import (
	"context"
	"io"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/newname"
	"github.com/agentloom/loomfs/policy"
)

// Emulated symbolic links (SPEC §3.2, policy.LinkMarker). The backing store
// never holds a symlink: a link is a regular file holding its target,
// marked with policy.LinkMarker, which no create or chmod through either
// door sets. Nothing on the host follows a regular file, so the link is
// inert there; only the projection shows it as a link, and the container's
// kernel then resolves it against the container's own view.

// Symlink makes the emulated link rel holding target. It is made whole
// before it gets its name (an O_TMPFILE, or a reserved temporary name),
// and never replaces anything: an existing rel answers exists, as
// symlink(2) does. It counts one file and len(target) bytes in the quota
// and is noted in the change journal.
func (w *Workspace) Symlink(ctx context.Context, rel, target string) (Info, error) {
	if err := w.checkWritable(policy.OpCreate, rel); err != nil {
		return Info{}, err
	}
	if err := w.pol.CheckSymlink(rel, target); err != nil {
		return Info{}, err
	}
	parent, name, err := w.Parent(rel)
	if err != nil {
		return Info{}, err
	}
	defer parent.Close()
	size := int64(len(target))
	if err := w.ReserveAt(ctx, rel, size, 1); err != nil {
		return Info{}, err
	}
	info, err := w.PlaceLink(parent, name, rel, target)
	if err != nil {
		w.AdjustAt(rel, -size, -1)
		return Info{}, err
	}
	w.NoteChangeBy(rel, false, changeBy(ctx, OpSymlink))
	return info, nil
}

// PlaceLink writes target to a new marked file and gives it the name name
// in parent, failing if the name is taken. It is Symlink for a door that
// has asked the policy and reserved the quota itself; the caller notes
// the change.
func (w *Workspace) PlaceLink(parent *Dir, name, rel, target string) (Info, error) {
	if err := w.ReadyToChange(); err != nil {
		return Info{}, err
	}
	pfd := int(parent.Fd())
	tmp, tmpName, err := w.vol.createTemp(pfd, policy.FilePerm)
	if err != nil {
		return Info{}, policy.FromErrno(err, "symlink", rel)
	}
	defer tmp.Close()
	cleanup := func() {
		if tmpName != "" {
			unix.Unlinkat(pfd, tmpName, 0)
		}
	}
	if _, err := io.WriteString(tmp, target); err != nil {
		cleanup()
		return Info{}, policy.FromErrno(err, "symlink", rel)
	}
	// The mark goes on last, on the fd, before the file has a name the
	// projection shows: nobody ever sees a half-written link.
	if err := unix.Fchmod(int(tmp.Fd()), policy.LinkPerm); err != nil {
		cleanup()
		return Info{}, policy.FromErrno(err, "symlink", rel)
	}
	if tmpName == "" {
		// linkat of an O_TMPFILE fails with EEXIST on a taken name.
		err = linkTemp(tmp, pfd, name)
	} else {
		// Where newname.Place falls back to link(2), the file has two links
		// until the temporary name goes, and is refused, never shown
		// half-made.
		err = newname.Place(pfd, tmpName, name)
	}
	if err != nil {
		cleanup()
		return Info{}, policy.FromErrno(err, "symlink", rel)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(tmp.Fd()), &st); err != nil {
		return Info{}, policy.FromErrno(err, "symlink", rel)
	}
	// Made in parent, a directory of the scope, so on the scope's mount.
	return w.infoOf(name, &st, w.mnt), nil
}

// ReadLink returns the target of the emulated link at rel. Anything else
// is refused: a real symlink (symlink_refused), a file with more than one
// link, or a plain file (invalid_input, as readlink(2) answers EINVAL).
func (w *Workspace) ReadLink(rel string) (string, Info, error) {
	parent, name, err := w.Parent(rel)
	if err != nil {
		return "", Info{}, err
	}
	defer parent.Close()
	return w.ReadLinkAt(parent, name, rel)
}

// ReadLinkAt is ReadLink for a caller that already holds the parent
// directory.
func (w *Workspace) ReadLinkAt(parent *Dir, name, rel string) (string, Info, error) {
	if err := checkEntry(rel, name); err != nil {
		return "", Info{}, err
	}
	pfd := int(parent.Fd())
	pre, preMnt, err := lstatAt(pfd, name)
	if err != nil {
		return "", Info{}, policy.FromErrno(err, "readlink", rel)
	}
	if err := checkLink(rel, w.infoOf(name, &pre, preMnt)); err != nil {
		return "", Info{}, err
	}
	fd, err := unix.Openat(pfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", Info{}, policy.FromErrno(err, "readlink", rel)
	}
	defer unix.Close(fd)
	st, mnt, err := lstatAt(fd, "")
	if err != nil {
		return "", Info{}, policy.FromErrno(err, "readlink", rel)
	}
	info := w.infoOf(name, &st, mnt)
	if err := checkLink(rel, info); err != nil {
		return "", Info{}, err
	}
	var buf [policy.MaxLinkTarget + 1]byte
	n, err := unix.Pread(fd, buf[:], 0)
	if err != nil {
		return "", Info{}, policy.FromErrno(err, "readlink", rel)
	}
	target := string(buf[:n])
	if err := policy.CheckLinkTarget(rel, target); err != nil {
		// Only a file marked on the host by someone else gets here.
		return "", Info{}, policy.Errorf(policy.SpecialFileRefused, "%s is marked as a symbolic link but holds no valid target", rel)
	}
	return target, info, nil
}

// checkLink refuses anything but an emulated link loomfs may read.
func checkLink(rel string, info Info) error {
	switch {
	case info.Kind == policy.KindSymlink, info.OtherMount, info.Kind == policy.KindLink && info.Nlink > 1:
		// A real symlink, anything on another mount (a bind mount of a
		// marked file included), a link with a second name: refused.
		return policy.CheckObject(policy.OpRead, rel, info.Object())
	case info.Kind != policy.KindLink:
		return policy.Errorf(policy.InvalidInput, "%s is not a symbolic link", rel)
	}
	return nil
}
