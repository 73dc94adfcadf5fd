package store

import "golang.org/x/sys/unix"

// renameNoReplace is renameat2(RENAME_NOREPLACE) within one directory; a
// test swaps it for one that refuses the flag as CephFS does.
var renameNoReplace = func(dfd int, tmp, name string) error {
	return unix.Renameat2(dfd, tmp, dfd, name, unix.RENAME_NOREPLACE)
}

// PlaceNew gives the fully written temporary file tmp in directory dfd the
// name name, which must not exist: an existing name answers EEXIST, and a
// reader sees no file or the whole one. It is the one exclusive create of
// loomfs. Where the filesystem refuses RENAME_NOREPLACE (ceph-fuse,
// GlusterFS and older NFS answer EINVAL) it hard-links tmp to name, which
// refuses an existing name just as well, and removes tmp. On success tmp
// is gone; on an error it may remain, for the caller to remove.
func PlaceNew(dfd int, tmp, name string) error {
	err := renameNoReplace(dfd, tmp, name)
	if err != unix.EINVAL && err != unix.ENOSYS {
		return err
	}
	if err := unix.Linkat(dfd, tmp, dfd, name, 0); err != nil {
		return err
	}
	unix.Unlinkat(dfd, tmp, 0)
	return nil
}
