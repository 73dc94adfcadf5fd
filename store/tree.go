package store

import (
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
)

// Whole-tree operations for snapshots and retention. Doors never use them:
// they work on a scope as the runtime sees it, not as a model does.

// Unfiltered returns a view of w that walks and opens every entry of the
// scope whatever the path modes say (hidden subtrees included), with the
// same object checks: no symlinks, hard links or special files are ever
// followed or opened, and loomfs's own ".agentloom-*" names stay unseen.
// The view shares w's fds: never Close it, nor use it after w is closed.
func (w *Workspace) Unfiltered() *Workspace {
	return &Workspace{
		vol:     w.vol,
		scope:   w.scope,
		pol:     policy.Default().WithScope(w.scope.Main()),
		dir:     w.dir,
		state:   w.state,
		dev:     w.dev,
		mnt:     w.mnt,
		journal: w.journal,
		quota:   w.quota,
	}
}

// CheckIdle refuses when a command is running in the scope (its execution
// marker is present) or the scope is quarantined. It takes no lock and
// never quarantines: whoever needs the scope still must hold its lock.
func (w *Workspace) CheckIdle() error {
	if err := w.CheckQuarantine(); err != nil {
		return err
	}
	m, err := w.readState(ExecMarker)
	if err != nil {
		return err
	}
	if m != nil {
		return policy.Errorf(policy.Conflict, "a command is running in scope %s (container %s, node %s, since %s); retry when it has ended", w.scope, m.Container, m.Node, m.Time.UTC().Format("2006-01-02T15:04:05Z"))
	}
	if m, err = w.readState(SessionMarker); err != nil {
		return err
	}
	if m != nil {
		return policy.Errorf(policy.Conflict, "a session sandbox is running in scope %s (container %s, node %s, since %s); retry when it has ended (loomfs processes stop)", w.scope, m.Container, m.Node, m.Time.UTC().Format("2006-01-02T15:04:05Z"))
	}
	return nil
}

// TryLock takes the scope lock if it is free, without waiting; ok is false
// when someone holds it. Unlike Lock it does not quarantine a scope whose
// marker it finds: retention leaves such a scope alone.
func (w *Workspace) TryLock() (unlock func(), ok bool, err error) {
	return tryLockState(int(w.state.Fd()), w.scope)
}

func tryLockState(statefd int, s Scope) (unlock func(), ok bool, err error) {
	return tryLockFile(statefd, LockFile, s.String())
}

// tryLockFile takes an OFD write lock on the file name of directory dfd
// (created if missing) without waiting: ok false means another holder has
// it. what names the lock in errors.
func tryLockFile(dfd int, name, what string) (unlock func(), ok bool, err error) {
	fd, err := unix.Openat(dfd, name, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, policy.FilePerm)
	if err != nil {
		return nil, false, policy.FromErrno(err, "open lock", name)
	}
	lk := unix.Flock_t{Type: unix.F_WRLCK}
	for {
		err = unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLK, &lk)
		if err != unix.EINTR {
			break
		}
	}
	if err == unix.EAGAIN || err == unix.EACCES {
		unix.Close(fd)
		return nil, false, nil
	}
	if err != nil {
		unix.Close(fd)
		return nil, false, policy.FromErrno(err, "lock", what)
	}
	return func() {
		un := unix.Flock_t{Type: unix.F_UNLCK}
		unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLK, &un)
		unix.Close(fd)
	}, true, nil
}

// ClearDir removes everything inside the directory at the cleaned path rel
// and keeps the directory; a missing rel is already clear. Nothing is
// followed: a symlink is removed as a name, a directory on another
// filesystem is left and reported. The caller holds the scope lock; the
// kept usage is forgotten and counted again on next use.
func (w *Workspace) ClearDir(ctx context.Context, rel string) (policy.Usage, error) {
	f, _, err := w.Open(policy.OpList, rel, unix.O_RDONLY|unix.O_DIRECTORY)
	if policy.CodeOf(err) == policy.NotFound {
		return policy.Usage{}, nil
	}
	if err != nil {
		return policy.Usage{}, err
	}
	defer f.Close()
	if err := w.ReadyToChange(); err != nil {
		return policy.Usage{}, err
	}
	var u policy.Usage
	err = removeContents(ctx, int(f.Fd()), w.dev, rel, &u)
	w.NoteChangeBy(rel, true, changeBy(ctx, OpTree))
	w.RefreshUsage(ctx)
	return u, err
}

// removeContents removes every entry of the open directory dirfd, depth
// first, counting what it removed in u. It goes on past an entry it can't
// remove and returns the first error.
func removeContents(ctx context.Context, dirfd int, dev uint64, rel string, u *policy.Usage) error {
	dup, err := unix.Openat(dirfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", rel, err)
	}
	d := os.NewFile(uintptr(dup), rel)
	defer d.Close()
	var first error
	keep := func(err error) {
		if first == nil {
			first = err
		}
	}
	for {
		names, rerr := d.Readdirnames(1024)
		if len(names) == 0 {
			if rerr != nil && rerr != io.EOF {
				keep(fmt.Errorf("read %s: %w", rel, rerr))
			}
			break
		}
		sort.Strings(names)
		for _, name := range names {
			if err := ctx.Err(); err != nil {
				return policy.Errorf(policy.Cancelled, "removing %s cancelled", rel)
			}
			p := policy.Join(rel, name)
			var st unix.Stat_t
			if err := unix.Fstatat(dup, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				if err != unix.ENOENT {
					keep(fmt.Errorf("stat %s: %w", p, err))
				}
				continue
			}
			if st.Mode&unix.S_IFMT == unix.S_IFDIR {
				if st.Dev != dev {
					keep(fmt.Errorf("%s is on another filesystem; left in place", p))
					continue
				}
				fd, err := unix.Openat(dup, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
				if err != nil {
					keep(fmt.Errorf("open %s: %w", p, err))
					continue
				}
				if !sameMount(dup, fd) {
					unix.Close(fd)
					keep(fmt.Errorf("%s is another mount; left in place", p))
					continue
				}
				err = removeContents(ctx, fd, dev, p, u)
				unix.Close(fd)
				if err != nil {
					if policy.CodeOf(err) == policy.Cancelled {
						return err
					}
					keep(err)
				}
				if err := unix.Unlinkat(dup, name, unix.AT_REMOVEDIR); err != nil {
					keep(fmt.Errorf("remove %s: %w", p, err))
					continue
				}
				u.Files++
				continue
			}
			if err := unix.Unlinkat(dup, name, 0); err != nil {
				if err != unix.ENOENT {
					keep(fmt.Errorf("remove %s: %w", p, err))
				}
				continue
			}
			u.Files++
			if st.Mode&unix.S_IFMT == unix.S_IFREG {
				u.Bytes += st.Size
			}
		}
		// Entries were removed under the directory stream: read it from
		// the start again rather than trust the offset.
		if _, err := d.Seek(0, io.SeekStart); err != nil {
			keep(fmt.Errorf("rewind %s: %w", rel, err))
			break
		}
	}
	return first
}

// RestorePrefix starts the name of the directory a restored tree is built
// in, beside the scope directory and outside every projection: the prefix,
// the scope's hash, "-" and a random part.
const RestorePrefix = policy.InternalPrefix + "restore-"

// sweepRestores removes the trees whose names in parent start with mine:
// what restores of one scope that were killed left beside its directory
// (a half-built tree before the swap, the old one after it). They are
// outside every scope and account, and nothing else would remove them.
// The caller holds that scope's lock.
func sweepRestores(pfd int, mine string, dev uint64) {
	d, err := unix.Openat(pfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	f := os.NewFile(uintptr(d), "parent")
	names, _ := f.Readdirnames(-1)
	f.Close()
	for _, name := range names {
		if !strings.HasPrefix(name, mine) {
			continue
		}
		fd, err := unix.Openat(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		var st unix.Stat_t
		var u policy.Usage
		if unix.Fstat(fd, &st) != nil || st.Dev != dev || removeContents(context.Background(), fd, dev, name, &u) != nil {
			unix.Close(fd)
			continue
		}
		unix.Close(fd)
		unix.Unlinkat(pfd, name, unix.AT_REMOVEDIR)
	}
}

// ReplaceTree replaces the whole content of the scope, as one atomic
// change: fill builds the new tree in a fresh directory beside the scope
// directory (same filesystem, outside every projection), which is then
// exchanged with the scope directory (renameat2 RENAME_EXCHANGE), and the
// old tree is removed.
//
// The caller holds the scope lock. ReplaceTree refuses while a command
// runs or the scope is quarantined. Resolving a path in the scope gives the
// old tree or the new, never a mix. This Workspace follows the exchange
// (its pinned directory fd is re-pointed, so a projection served by this
// process sees the new tree); another process that pinned the scope
// directory — a "loomfs mount" elsewhere — still holds the old, removed
// directory, and must be remounted.
//
// The scope's quota account is counted again after the swap, by a walk of
// the new tree; ReplaceTreeCounted spares that walk to a fill that knows
// what it made.
func (w *Workspace) ReplaceTree(ctx context.Context, fill func(dir *os.File) error) error {
	return w.replaceTree(ctx, func(dir *os.File) ([]TreeEntry, bool, error) { return nil, false, fill(dir) })
}

// TreeEntry is one entry a fill made for ReplaceTreeCounted: its cleaned
// path in the new tree, whether it is a directory, and the apparent size
// of anything else (a file's, an emulated link's).
type TreeEntry struct {
	Path string
	Dir  bool
	Size int64
}

// ReplaceTreeCounted is ReplaceTree for a fill that returns every entry it
// made below dir, each directory before what it holds: the scope's quota
// account is then counted from that list, as a walk of the new tree would
// count it (what the walking view's policy lists, and what this process
// holds open), instead of by that walk. Each capped subtree's account is
// still counted by a walk of the subtree alone. The list must be the
// tree: an entry left out, or one made after the fill returned, is
// counted only by the next reconcile.
func (w *Workspace) ReplaceTreeCounted(ctx context.Context, fill func(dir *os.File) ([]TreeEntry, error)) error {
	return w.replaceTree(ctx, func(dir *os.File) ([]TreeEntry, bool, error) {
		built, err := fill(dir)
		return built, true, err
	})
}

// replaceTree is ReplaceTree; fill says whether the list it returns is the
// new tree (counted) or the tree is to be walked.
func (w *Workspace) replaceTree(ctx context.Context, fill func(dir *os.File) ([]TreeEntry, bool, error)) error {
	if err := w.vol.recheck(); err != nil {
		return err
	}
	if err := w.CheckIdle(); err != nil {
		return err
	}
	if err := w.ReadyToChange(); err != nil {
		return err
	}
	parentRel, name := policy.Split(w.scope.Dir())
	pfd, err := openBeneath(int(w.vol.root.Fd()), parentRel, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return fmt.Errorf("open the scope's parent directory: %w", err)
	}
	defer unix.Close(pfd)
	// The scope directory must still be the one this Workspace pinned.
	var cur, pinned unix.Stat_t
	if err := unix.Fstatat(pfd, name, &cur, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("stat the scope directory: %w", err)
	}
	if err := unix.Fstat(w.DirFD(), &pinned); err != nil {
		return fmt.Errorf("stat the scope directory: %w", err)
	}
	if cur.Ino != pinned.Ino || cur.Dev != pinned.Dev {
		return policy.Errorf(policy.Conflict, "the directory of scope %s was replaced since it was opened; open it again", w.scope)
	}
	// Under the scope lock no other restore of this scope is under way: a
	// tree of this scope's found beside it is a killed restore's.
	mine := RestorePrefix + w.scope.Hash() + "-"
	sweepRestores(pfd, mine, w.dev)
	staging := mine + tempName()[len(policy.InternalPrefix+"tmp-"):]
	if err := unix.Mkdirat(pfd, staging, policy.DirPerm); err != nil {
		return fmt.Errorf("create %s: %w", staging, err)
	}
	sfd, err := unix.Openat(pfd, staging, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Unlinkat(pfd, staging, unix.AT_REMOVEDIR)
		return fmt.Errorf("open %s: %w", staging, err)
	}
	sdir := os.NewFile(uintptr(sfd), staging)
	discard := func() {
		var u policy.Usage
		removeContents(context.Background(), int(sdir.Fd()), w.dev, staging, &u)
		sdir.Close()
		unix.Unlinkat(pfd, staging, unix.AT_REMOVEDIR)
	}
	unix.Fchmod(sfd, policy.DirPerm)
	built, counted, err := fill(sdir)
	if err != nil {
		discard()
		return err
	}
	if err := ctx.Err(); err != nil {
		discard()
		return policy.Errorf(policy.Cancelled, "restore cancelled before the swap; the scope is unchanged")
	}
	// One syncfs makes the whole new tree durable before it becomes the
	// scope; fsyncing each file would cost a round trip per file on NFS.
	if err := unix.Syncfs(sfd); err != nil {
		discard()
		return fmt.Errorf("sync the restored tree: %w", err)
	}
	if err := unix.Renameat2(pfd, staging, pfd, name, unix.RENAME_EXCHANGE); err != nil {
		if err != unix.EINVAL && err != unix.ENOSYS {
			discard()
			return fmt.Errorf("swap in the restored tree: %w", err)
		}
		// No RENAME_EXCHANGE here (older NFS): two renames under the
		// scope lock. In between, the scope path does not exist; a tool
		// answers not_found and a command can't run (it needs the lock).
		old := staging + "-old"
		if err := unix.Renameat(pfd, name, pfd, old); err != nil {
			discard()
			return fmt.Errorf("move the old tree aside: %w", err)
		}
		if err := unix.Renameat(pfd, staging, pfd, name); err != nil {
			unix.Renameat(pfd, old, pfd, name)
			discard()
			return fmt.Errorf("swap in the restored tree: %w", err)
		}
		staging = old
	}
	w.NoteChangeBy(".", true, changeBy(ctx, OpTree))
	syncDir(pfd)
	// sdir followed its inode: it is the scope directory now. The old tree
	// is at the staging name.
	sdir.Close()
	// Re-point this Workspace's pinned fd at the new tree: dup3 replaces
	// the fd number in one step, so concurrent resolutions in this process
	// start from the old directory or the new, never a closed fd.
	nfd, err := unix.Openat(pfd, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err == nil {
		err = unix.Dup3(nfd, w.DirFD(), unix.O_CLOEXEC)
		unix.Close(nfd)
	}
	if counted {
		w.refreshUsageFrom(ctx, built)
	} else {
		w.RefreshUsage(ctx)
	}
	rerr := removeOld(pfd, staging, pinned, w.dev)
	if err != nil {
		return fmt.Errorf("the scope was restored, but this process could not follow it (reopen the scope): %w", err)
	}
	if rerr != nil {
		return fmt.Errorf("the scope was restored, but the old tree %s could not be removed: %w", staging, rerr)
	}
	return nil
}

// removeOld removes the tree at name in parent, which must be the old scope
// directory described by want.
func removeOld(pfd int, name string, want unix.Stat_t, dev uint64) error {
	fd, err := unix.Openat(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Ino != want.Ino || st.Dev != want.Dev {
		unix.Close(fd)
		return fmt.Errorf("%s is not the old scope directory; left in place", name)
	}
	var u policy.Usage
	err = removeContents(context.Background(), fd, dev, name, &u)
	unix.Close(fd)
	if err != nil {
		return err
	}
	return unix.Unlinkat(pfd, name, unix.AT_REMOVEDIR)
}
