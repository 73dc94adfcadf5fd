package store

import (
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/callrec"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/quota"
)

// SnapshotsDir holds each scope's snapshots under the volume root, beside
// the locks and the audit log and outside every scope (SPEC §6).
const SnapshotsDir = ".agentloom-snapshots"

// Area opens the directory rel under the volume root for loomfs's own
// records (snapshots, for one), creating it when create is set. Its first
// component must be one of loomfs's own names (".agentloom-…"), so no area
// is ever inside a scope. The directory is opened O_RDONLY, never
// following a symlink.
func (v *Volume) Area(rel string, create bool) (*os.File, error) {
	if err := v.recheck(); err != nil {
		return nil, err
	}
	if !strings.HasPrefix(rel, policy.InternalPrefix) || strings.Contains(rel, "..") || strings.Contains(rel, "//") {
		return nil, fmt.Errorf("area %q: not one of loomfs's own directories", rel)
	}
	var fd int
	var err error
	if create {
		var pfd int
		if pfd, err = mkdirAll(int(v.root.Fd()), rel); err != nil {
			return nil, fmt.Errorf("create %s: %w", rel, err)
		}
		fd, err = unix.Openat(pfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		unix.Close(pfd)
	} else {
		fd, err = openBeneath(int(v.root.Fd()), rel, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	}
	if err != nil {
		return nil, policy.FromErrno(err, "open", rel)
	}
	return os.NewFile(uintptr(fd), rel), nil
}

// ScopeState opens scope s's state directory (.agentloom-locks/<hash>),
// creating it, without creating the scope itself. Retention keeps its pins
// there.
func (v *Volume) ScopeState(s Scope) (*os.File, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return v.Area(LocksDir+"/"+s.Hash(), true)
}

// TryLock takes scope s's lock if it is free, without waiting and without
// creating the scope; ok is false when someone holds it.
func (v *Volume) TryLock(s Scope) (unlock func(), ok bool, err error) {
	st, err := v.ScopeState(s)
	if err != nil {
		return nil, false, err
	}
	defer st.Close()
	return tryLockState(int(st.Fd()), s)
}

// CheckIdle refuses when a command runs in scope s or s is quarantined,
// without opening or creating the scope.
func (v *Volume) CheckIdle(s Scope) error {
	st, err := v.ScopeState(s)
	if err != nil {
		return err
	}
	defer st.Close()
	w := &Workspace{vol: v, scope: s, state: st}
	return w.CheckIdle()
}

// Session is one session directory on the volume: its main scope and the
// child instances of its runs.
type Session struct {
	Main     Scope
	Children []Scope
}

// Scopes returns the session's main scope and its children.
func (s Session) Scopes() []Scope {
	return append([]Scope{s.Main}, s.Children...)
}

// Dir is the session's directory relative to the volume root.
func (s Session) Dir() string {
	return SpacesDir + "/" + s.Main.Space + "/agents/" + s.Main.Agent + "/sessions/" + s.Main.Session
}

// Sessions lists every session directory on the volume, in name order.
// Directories whose names are not valid ids are not loomfs's and are left
// out.
func (v *Volume) Sessions(ctx context.Context) ([]Session, error) {
	if err := v.recheck(); err != nil {
		return nil, err
	}
	var out []Session
	spaces, err := v.subdirs(SpacesDir)
	if err != nil {
		return nil, err
	}
	for _, sp := range spaces {
		agents, err := v.subdirs(SpacesDir + "/" + sp + "/agents")
		if err != nil {
			return nil, err
		}
		for _, ag := range agents {
			sessions, err := v.subdirs(SpacesDir + "/" + sp + "/agents/" + ag + "/sessions")
			if err != nil {
				return nil, err
			}
			for _, se := range sessions {
				if ctx.Err() != nil {
					return nil, policy.Errorf(policy.Cancelled, "listing sessions cancelled")
				}
				s := Session{Main: Scope{Space: sp, Agent: ag, Session: se}}
				if s.Main.Validate() != nil {
					continue
				}
				runs, err := v.subdirs(s.Dir() + "/runs")
				if err != nil {
					return nil, err
				}
				for _, run := range runs {
					insts, err := v.subdirs(s.Dir() + "/runs/" + run + "/children")
					if err != nil {
						return nil, err
					}
					for _, in := range insts {
						c := Scope{Space: sp, Agent: ag, Session: se, Run: run, Instance: in}
						if c.Validate() == nil {
							s.Children = append(s.Children, c)
						}
					}
				}
				out = append(out, s)
			}
		}
	}
	return out, nil
}

// subdirs lists the directories in rel (a trusted path under the root), in
// name order; a missing rel has none.
func (v *Volume) subdirs(rel string) ([]string, error) {
	fd, err := openBeneath(int(v.root.Fd()), rel, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err == unix.ENOENT || err == unix.ENOTDIR {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", rel, err)
	}
	d := os.NewFile(uintptr(fd), rel)
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil && err != io.EOF {
		return nil, fmt.Errorf("read %s: %w", rel, err)
	}
	var out []string
	for _, n := range names {
		var st unix.Stat_t
		if unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out, nil
}

// LastChange returns the newest change time (ctime) of anything in the
// session's directory tree and in its scopes' call records: when it was
// last written to. Reads leave no trace, so they don't count. visit, if
// set, is called with the number of entries seen so far, for progress.
func (v *Volume) LastChange(ctx context.Context, s Session, visit func(n int)) (time.Time, error) {
	var newest int64
	n := 0
	note := func(_ int, _ string, st *unix.Stat_t) {
		if t := st.Ctim.Nano(); t > newest {
			newest = t
		}
		n++
		if visit != nil && n%10000 == 0 {
			visit(n)
		}
	}
	fd, err := openBeneath(int(v.root.Fd()), s.Dir(), unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return time.Time{}, fmt.Errorf("open %s: %w", s.Dir(), err)
	}
	var root unix.Stat_t
	unix.Fstat(fd, &root)
	note(fd, ".", &root)
	err = walkStat(ctx, fd, root.Dev, note)
	unix.Close(fd)
	if err != nil {
		return time.Time{}, err
	}
	for _, sc := range s.Scopes() {
		cfd, err := openBeneath(int(v.root.Fd()), LocksDir+"/"+sc.Hash()+"/"+callrec.Dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			continue
		}
		var st unix.Stat_t
		unix.Fstat(cfd, &st)
		note(cfd, ".", &st)
		err = walkStat(ctx, cfd, st.Dev, note)
		unix.Close(cfd)
		if err != nil {
			return time.Time{}, err
		}
	}
	return time.Unix(0, newest), nil
}

// walkStat calls note with the lstat of every entry under dirfd (and the
// fd of the directory holding it, valid during the call), never following
// a symlink or leaving the filesystem dev.
func walkStat(ctx context.Context, dirfd int, dev uint64, note func(dirfd int, name string, st *unix.Stat_t)) error {
	dup, err := unix.Openat(dirfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	d := os.NewFile(uintptr(dup), ".")
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil && err != io.EOF {
		return err
	}
	for _, name := range names {
		if ctx.Err() != nil {
			return policy.Errorf(policy.Cancelled, "walk cancelled")
		}
		var st unix.Stat_t
		if unix.Fstatat(dup, name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
			continue
		}
		note(dup, name, &st)
		if st.Mode&unix.S_IFMT != unix.S_IFDIR || st.Dev != dev {
			continue
		}
		fd, err := unix.Openat(dup, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		if !sameMount(dup, fd) {
			unix.Close(fd)
			continue
		}
		err = walkStat(ctx, fd, dev, note)
		unix.Close(fd)
		if err != nil {
			return err
		}
	}
	return nil
}

// SweepTemporaries removes, from the session's directory tree, the
// temporary files of atomic writes (policy.InternalPrefix + "tmp-") last
// changed before cutoff: leftovers of a writer that died between creating
// and renaming one (on filesystems without O_TMPFILE, such as NFS, for
// the whole write), and the files of health probes killed halfway
// (policy.ProbePrefix). They are hidden and uncounted, so nothing else would
// ever remove them. With dryRun it only counts them. A session a scope of
// which has a change set pending (intent.go) is left alone: its staged
// files are what the next lock take puts in place.
func (v *Volume) SweepTemporaries(ctx context.Context, s Session, cutoff time.Time, dryRun bool) (n int, bytes int64, err error) {
	for _, sc := range s.Scopes() {
		st, err := v.ScopeState(sc)
		if err != nil {
			return 0, 0, err
		}
		pending := (&Workspace{state: st}).ChangeSetPending()
		st.Close()
		if pending {
			return 0, 0, nil
		}
	}
	fd, err := openBeneath(int(v.root.Fd()), s.Dir(), unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return 0, 0, fmt.Errorf("open %s: %w", s.Dir(), err)
	}
	defer unix.Close(fd)
	var root unix.Stat_t
	if err := unix.Fstat(fd, &root); err != nil {
		return 0, 0, err
	}
	prefix := policy.InternalPrefix + "tmp-"
	err = walkStat(ctx, fd, root.Dev, func(dirfd int, name string, st *unix.Stat_t) {
		leftover := strings.HasPrefix(name, prefix) || strings.HasPrefix(name, policy.ProbePrefix)
		if st.Mode&unix.S_IFMT != unix.S_IFREG || !leftover || st.Ctim.Nano() >= cutoff.UnixNano() {
			return
		}
		if !dryRun && unix.Unlinkat(dirfd, name, 0) != nil {
			return
		}
		n++
		bytes += st.Size
	})
	return n, bytes, err
}

// RemoveSession removes the session's directory tree and its scopes' call
// records, confirmation tokens, change journals and quota accounts (a
// session made again under the same name starts from an empty account,
// not the old one's figures). An account some process still holds is
// left: it would go on counting in a directory no newcomer sees. Lock
// files and pins stay, so a late opener still contends on the same lock.
// The caller holds every scope's lock and has checked that none is busy
// or quarantined.
func (v *Volume) RemoveSession(ctx context.Context, s Session) (policy.Usage, error) {
	if err := v.recheck(); err != nil {
		return policy.Usage{}, err
	}
	parent, name := policy.Split(s.Dir())
	pfd, err := openBeneath(int(v.root.Fd()), parent, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return policy.Usage{}, fmt.Errorf("open %s: %w", parent, err)
	}
	defer unix.Close(pfd)
	var u policy.Usage
	fd, err := unix.Openat(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return u, fmt.Errorf("open %s: %w", s.Dir(), err)
	}
	var st unix.Stat_t
	unix.Fstat(fd, &st)
	err = removeContents(ctx, fd, st.Dev, s.Dir(), &u)
	unix.Close(fd)
	if err != nil {
		return u, err
	}
	if err := unix.Unlinkat(pfd, name, unix.AT_REMOVEDIR); err != nil {
		return u, fmt.Errorf("remove %s: %w", s.Dir(), err)
	}
	u.Files++
	for _, sc := range s.Scopes() {
		st, err := v.Area(LocksDir+"/"+sc.Hash(), false)
		if err != nil {
			continue
		}
		for _, d := range []string{callrec.Dir, TokensDir, JournalDir, QuotaDir} {
			if dfd, err := unix.Openat(int(st.Fd()), d, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err == nil {
				if d == QuotaDir {
					if q, err := quota.Inspect(dfd); err != nil || q.Holders > 0 {
						unix.Close(dfd)
						continue
					}
				}
				var ignored policy.Usage
				var dst unix.Stat_t
				unix.Fstat(dfd, &dst)
				removeContents(ctx, dfd, dst.Dev, d, &ignored)
				unix.Close(dfd)
				unix.Unlinkat(int(st.Fd()), d, unix.AT_REMOVEDIR)
			}
		}
		st.Close()
	}
	return u, nil
}

// RemoveArea removes the directory rel under the volume root and all it
// holds, never following a symlink; rel must be one of loomfs's own
// directories (see Area). It returns the bytes of regular files removed.
func (v *Volume) RemoveArea(ctx context.Context, rel string) (int64, error) {
	if !strings.HasPrefix(rel, policy.InternalPrefix) || !strings.Contains(rel, "/") || strings.Contains(rel, "..") {
		return 0, fmt.Errorf("area %q: not a directory inside one of loomfs's own", rel)
	}
	if err := v.recheck(); err != nil {
		return 0, err
	}
	parent, name := policy.Split(rel)
	pfd, err := openBeneath(int(v.root.Fd()), parent, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return 0, policy.FromErrno(err, "open", parent)
	}
	defer unix.Close(pfd)
	fd, err := unix.Openat(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, policy.FromErrno(err, "open", rel)
	}
	var st unix.Stat_t
	unix.Fstat(fd, &st)
	var u policy.Usage
	err = removeContents(ctx, fd, st.Dev, rel, &u)
	unix.Close(fd)
	if err != nil {
		return u.Bytes, err
	}
	if err := unix.Unlinkat(pfd, name, unix.AT_REMOVEDIR); err != nil {
		return u.Bytes, fmt.Errorf("remove %s: %w", rel, err)
	}
	return u.Bytes, nil
}
