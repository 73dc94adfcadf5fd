package store

import (
	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
)

// OpenPath opens the existing object at rel with O_PATH, for a change of
// its mode or times (fchmodat2 and utimensat with AT_EMPTY_PATH), and
// returns the fd and what statx says of it. An O_PATH open neither reads
// nor writes nor opens a device or FIFO, so unlike Open it needs no check
// before it: the object is checked for op on the fd, which pins it. The
// caller closes the fd.
func (w *Workspace) OpenPath(op policy.Op, rel string) (int, unix.Statx_t, error) {
	var sx unix.Statx_t
	dirfd, name := w.DirFD(), "."
	if rel != "." {
		parent, base, err := w.Parent(rel)
		if err != nil {
			return -1, sx, err
		}
		defer parent.Close()
		dirfd, name = parent.fd, base
	}
	fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, sx, policy.FromErrno(err, op.String(), rel)
	}
	sx, err = StatxAt(fd, "", StatxMask)
	if err != nil {
		unix.Close(fd)
		return -1, sx, policy.FromErrno(err, op.String(), rel)
	}
	var st unix.Stat_t
	st.Mode, st.Nlink, st.Size = uint32(sx.Mode), uint64(sx.Nlink), int64(sx.Size)
	st.Dev = unix.Mkdev(sx.Dev_major, sx.Dev_minor)
	if err := policy.CheckObject(op, rel, w.infoOf(name, &st, sx.Mnt_id).Object()); err != nil {
		unix.Close(fd)
		return -1, sx, err
	}
	return fd, sx, nil
}
