package store

import "golang.org/x/sys/unix"

// syncDir makes the entries of directory dfd durable (a rename or link
// into it). The store holds directories as O_PATH fds, which fsync(2)
// refuses with EBADF: the directory is then opened for the fsync.
func syncDir(dfd int) error {
	err := unix.Fsync(dfd)
	if err != unix.EBADF {
		return err
	}
	fd, err := unix.Openat(dfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Fsync(fd)
}
