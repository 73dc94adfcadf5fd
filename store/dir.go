package store

import (
	"context"
	"errors"
	"io"
	"os"
	"sort"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
)

// ReadDir lists the directory at rel: every entry the policy shows, with
// what lstat says of it, sorted by name. Objects that can't be used
// (symlinks, FIFOs…) are listed for what they are.
func (w *Workspace) ReadDir(ctx context.Context, rel string) ([]Info, error) {
	f, _, err := w.Open(policy.OpList, rel, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return w.readDirFD(ctx, f, rel)
}

func (w *Workspace) readDirFD(ctx context.Context, f *os.File, rel string) ([]Info, error) {
	names, err := f.Readdirnames(-1)
	if err != nil && err != io.EOF {
		return nil, policy.FromErrno(err, "list", rel)
	}
	sort.Strings(names)
	out := make([]Info, 0, len(names))
	for _, name := range names {
		if ctx.Err() != nil {
			return nil, policy.Errorf(policy.Cancelled, "list %s cancelled", rel)
		}
		if !w.pol.Listed(policy.Join(rel, name)) {
			continue
		}
		var st unix.Stat_t
		var mnt uint64
		var err error = unix.EINTR
		for err == unix.EINTR {
			st, mnt, err = lstatAt(int(f.Fd()), name)
		}
		if goneMeanwhile(err) {
			continue
		}
		if err != nil {
			return nil, policy.FromErrno(err, "list", policy.Join(rel, name))
		}
		out = append(out, w.infoOf(name, &st, mnt))
	}
	return out, nil
}

// goneMeanwhile reports whether err, from a stat or an open of an entry a
// listing just named, means it was removed or replaced since. A walk
// passes over those, but not over a fault of the storage (EIO, EMFILE…):
// a walk that skipped what it could not read would hand a snapshot, a
// quota count or a search a tree with a directory missing, and call it
// whole.
func goneMeanwhile(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ESTALE)
}

// WalkFunc is called for every entry Walk visits, with its cleaned path.
// Returning SkipDir skips a directory's contents; any other error stops.
type WalkFunc func(rel string, info Info) error

// SkipDir is returned by a WalkFunc to skip a directory.
var SkipDir = io.EOF

// Walk visits the tree at rel depth first in name order. It descends one
// component at a time from directory fds with O_NOFOLLOW, never through a
// symlink and never onto another mount; the root of the walk itself
// is not passed to fn.
func (w *Workspace) Walk(ctx context.Context, rel string, fn WalkFunc) error {
	f, _, err := w.Open(policy.OpList, rel, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer f.Close()
	return w.walkFD(ctx, f, rel, fn)
}

func (w *Workspace) walkFD(ctx context.Context, dir *os.File, rel string, fn WalkFunc) error {
	entries, err := w.readDirFD(ctx, dir, rel)
	if err != nil {
		return err
	}
	for _, e := range entries {
		p := policy.Join(rel, e.Name)
		if err := fn(p, e); err != nil {
			if err == SkipDir {
				continue
			}
			return err
		}
		if e.Kind != policy.KindDir || e.OtherMount {
			continue
		}
		fd, err := -1, error(unix.EINTR)
		for err == unix.EINTR {
			fd, err = unix.Openat(int(dir.Fd()), e.Name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		}
		switch {
		case goneMeanwhile(err), errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
			// Not followed: replaced by a link or a file, removed, or
			// made unreadable by its owner (as a walk of any disk
			// passes over what it may not read).
			continue
		case err != nil:
			return policy.FromErrno(err, "list", p)
		}
		sub := os.NewFile(uintptr(fd), p)
		err = w.walkFD(ctx, sub, p, fn)
		sub.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// OpenInDir opens the entry name of an open directory for reading, with the
// same checks as Open. Walkers use it to avoid resolving paths again.
func (w *Workspace) OpenInDir(op policy.Op, dir *os.File, rel, name string) (*os.File, Info, error) {
	return w.openFile(op, rel, unix.O_RDONLY, &Dir{int(dir.Fd())}, name) // borrowed, not closed here
}
