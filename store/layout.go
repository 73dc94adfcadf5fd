package store

import (
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
)

// makeLayout makes the directories of the policy's layout that are
// missing (policy.LayoutDirs), 0700, with any missing parents, whatever
// their modes say: it is the platform laying out the workspace, before
// any door is open. An object already at a layout path is left as it is,
// whatever it is. What was made is noted in the change journal and kept
// for LayoutMade, for the opener to audit as the platform's.
func (w *Workspace) makeLayout() error {
	for _, rel := range w.pol.LayoutDirs() {
		parts := strings.Split(rel, "/")
		for i := range parts {
			made, stop, err := w.layoutDir(strings.Join(parts[:i+1], "/"))
			if err != nil {
				return err
			}
			if made != "" {
				w.layoutMade = append(w.layoutMade, made)
			}
			if stop {
				break
			}
		}
	}
	return nil
}

// layoutDir makes the directory rel if nothing is there. stop says that
// something other than a directory is there, so nothing beneath it is
// made.
func (w *Workspace) layoutDir(rel string) (made string, stop bool, err error) {
	pfd, name := w.DirFD(), rel
	if dir, base := policy.Split(rel); dir != "." {
		parent, _, err := w.Parent(rel)
		if err != nil {
			return "", true, nil // a parent that is not a plain directory
		}
		defer parent.Close()
		pfd, name = int(parent.Fd()), base
	}
	// Most opens find every directory there: one fstatat each.
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil {
		return "", st.Mode&unix.S_IFMT != unix.S_IFDIR, nil
	}
	if err := w.ReadyToChange(); err != nil {
		return "", true, err
	}
	if err := unix.Mkdirat(pfd, name, policy.DirPerm); err != nil {
		if err == unix.EEXIST {
			return "", false, nil // made by another opener meanwhile
		}
		return "", true, policy.FromErrno(err, "make layout directory", rel)
	}
	// The umask may have narrowed it; it is never widened past 0700.
	if fd, err := unix.Openat(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err == nil {
		unix.Fchmod(fd, policy.DirPerm)
		unix.Close(fd)
	}
	w.NoteChangeBy(rel, false, Change{Op: OpMkdir, Source: SourcePlatform})
	return rel, false, nil
}

// LayoutMade lists the layout directories this Open made, parents first:
// none when the scope had them all.
func (w *Workspace) LayoutMade() []string { return w.layoutMade }
