package store

import (
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
)

// noOpenat2 is set once the kernel answered ENOSYS to openat2; from then on
// paths are walked one O_NOFOLLOW component at a time.
var noOpenat2 atomic.Bool

const resolveFlags = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// openBeneath opens the cleaned path rel beneath dirfd without following
// any symlink and without leaving dirfd's mount. It is the one place paths
// are resolved; every other access is an *at call on an fd it returned.
func openBeneath(dirfd int, rel string, flags int, mode uint32) (int, error) {
	flags |= unix.O_NOFOLLOW | unix.O_CLOEXEC
	if !noOpenat2.Load() {
		how := unix.OpenHow{Flags: uint64(flags), Mode: uint64(mode), Resolve: resolveFlags}
		for tries := 0; ; tries++ {
			fd, err := unix.Openat2(dirfd, rel, &how)
			switch {
			case err == nil:
				return fd, nil
			case err == unix.ENOSYS:
				noOpenat2.Store(true)
			case (err == unix.EAGAIN || err == unix.EINTR) && tries < 64:
				// A concurrent rename raced the lookup; the kernel asks us to retry.
				if tries > 8 {
					time.Sleep(time.Millisecond)
				}
				continue
			default:
				return -1, err
			}
			break
		}
	}
	return walkNoFollow(dirfd, rel, flags, mode)
}

// walkNoFollow is the fallback for kernels without openat2: each component
// is opened with O_NOFOLLOW from the previous fd, and must stay on the same
// device and mount as dirfd.
func walkNoFollow(dirfd int, rel string, flags int, mode uint32) (int, error) {
	var root unix.Stat_t
	if err := unix.Fstat(dirfd, &root); err != nil {
		return -1, err
	}
	if rel == "." {
		return unix.Openat(dirfd, ".", flags, mode)
	}
	parts := strings.Split(rel, "/")
	cur := dirfd
	closeCur := func() {
		if cur != dirfd {
			unix.Close(cur)
		}
	}
	defer closeCur()
	for _, c := range parts[:len(parts)-1] {
		if c == ".." || c == "." || c == "" {
			return -1, unix.EXDEV
		}
		next, err := unix.Openat(cur, c, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			if err == unix.ENOTDIR {
				// ENOTDIR also answers a symlink opened with O_NOFOLLOW|O_DIRECTORY.
				var st unix.Stat_t
				if unix.Fstatat(cur, c, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
					err = unix.ELOOP
				}
			}
			return -1, err
		}
		var st unix.Stat_t
		if err := unix.Fstat(next, &st); err != nil {
			unix.Close(next)
			return -1, err
		}
		if st.Dev != root.Dev || !sameMount(dirfd, next) {
			unix.Close(next)
			return -1, unix.EXDEV
		}
		closeCur()
		cur = next
	}
	last := parts[len(parts)-1]
	if last == ".." || last == "" {
		return -1, unix.EXDEV
	}
	fd, err := unix.Openat(cur, last, flags, mode)
	if err != nil {
		return -1, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Dev != root.Dev || !sameMount(dirfd, fd) {
		unix.Close(fd)
		if err == nil {
			err = unix.EXDEV
		}
		return -1, err
	}
	return fd, nil
}

// Info describes an object found in a scope.
type Info struct {
	Name    string
	Kind    policy.Kind
	Size    int64
	Perm    uint32
	Nlink   uint64
	ModTime time.Time
	Stat    unix.Stat_t
	// OtherMount is set for an object on another mount than the scope's
	// (a bind mount of the same filesystem has the same device number).
	OtherMount bool
}

// Object returns what policy.CheckObject needs.
func (i Info) Object() policy.Object {
	return policy.Object{Kind: i.Kind, Perm: i.Perm, Nlink: i.Nlink, Size: i.Size, OtherMount: i.OtherMount}
}

// infoOf describes an object of the scope whose stat is st and whose
// mount id is mnt.
func (w *Workspace) infoOf(name string, st *unix.Stat_t, mnt uint64) Info {
	o := policy.ObjectOf(st)
	return Info{
		Name:       name,
		Kind:       o.Kind,
		Size:       st.Size,
		Perm:       o.Perm,
		Nlink:      o.Nlink,
		ModTime:    time.Unix(st.Mtim.Unix()),
		Stat:       *st,
		OtherMount: mnt != w.mnt || st.Dev != w.dev,
	}
}

// lstatAt is fstatat(dirfd, name, AT_SYMLINK_NOFOLLOW) that also returns
// the id of the mount the object is on; an empty name describes dirfd.
// Only the mount id tells a bind mount of the same filesystem apart.
func lstatAt(dirfd int, name string) (unix.Stat_t, uint64, error) {
	sx, err := StatxAt(dirfd, name, unix.STATX_BASIC_STATS|unix.STATX_MNT_ID)
	if err != nil {
		return unix.Stat_t{}, 0, err
	}
	return statOf(&sx), sx.Mnt_id, nil
}

// StatxMask is the fields an open's statx holds (Opened.Statx): the
// basic ones, the birth time where the filesystem reports one, and the
// mount id.
const StatxMask = unix.STATX_BASIC_STATS | unix.STATX_BTIME | unix.STATX_MNT_ID

// StatxAt is statx(2) of name in dirfd without following it, for the
// fields of mask; an empty name describes dirfd itself.
func StatxAt(dirfd int, name string, mask int) (unix.Statx_t, error) {
	var sx unix.Statx_t
	flags := unix.AT_SYMLINK_NOFOLLOW | unix.AT_STATX_SYNC_AS_STAT
	if name == "" {
		flags |= unix.AT_EMPTY_PATH
	}
	err := unix.Statx(dirfd, name, flags, mask, &sx)
	return sx, err
}

// statOf is the stat(2) view of sx.
func statOf(sx *unix.Statx_t) unix.Stat_t {
	var st unix.Stat_t
	st.Dev = unix.Mkdev(sx.Dev_major, sx.Dev_minor)
	st.Ino = sx.Ino
	st.Nlink = uint64(sx.Nlink)
	st.Mode = uint32(sx.Mode)
	st.Uid, st.Gid = sx.Uid, sx.Gid
	st.Rdev = unix.Mkdev(sx.Rdev_major, sx.Rdev_minor)
	st.Size = int64(sx.Size)
	st.Blksize = int64(sx.Blksize)
	st.Blocks = int64(sx.Blocks)
	st.Atim = unix.Timespec{Sec: sx.Atime.Sec, Nsec: int64(sx.Atime.Nsec)}
	st.Mtim = unix.Timespec{Sec: sx.Mtime.Sec, Nsec: int64(sx.Mtime.Nsec)}
	st.Ctim = unix.Timespec{Sec: sx.Ctime.Sec, Nsec: int64(sx.Ctime.Nsec)}
	return st
}

// mountID returns the id of the mount fd is on.
func mountID(fd int) (uint64, error) {
	_, mnt, err := lstatAt(fd, "")
	return mnt, err
}

// sameMount reports whether fd is on the mount of dirfd.
func sameMount(dirfd, fd int) bool {
	a, err := mountID(dirfd)
	if err != nil {
		return false
	}
	b, err := mountID(fd)
	return err == nil && a == b
}
