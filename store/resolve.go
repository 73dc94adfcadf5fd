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
// device as dirfd.
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
		if st.Dev != root.Dev {
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
	if err := unix.Fstat(fd, &st); err != nil || st.Dev != root.Dev {
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
}

// Object returns what policy.CheckObject needs.
func (i Info) Object() policy.Object {
	return policy.Object{Kind: i.Kind, Perm: i.Perm, Nlink: i.Nlink, Size: i.Size}
}

func infoOf(name string, st *unix.Stat_t) Info {
	o := policy.ObjectOf(st)
	return Info{
		Name:    name,
		Kind:    o.Kind,
		Size:    st.Size,
		Perm:    o.Perm,
		Nlink:   o.Nlink,
		ModTime: time.Unix(st.Mtim.Unix()),
		Stat:    *st,
	}
}
