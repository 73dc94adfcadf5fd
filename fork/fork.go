package fork

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/snapshot"
	"github.com/agentloom/loomfs/store"
)

// Options say what a fork copies.
type Options struct {
	// Snapshot is the source's snapshot to fork; "" takes one first.
	Snapshot string
	// NoClone copies file data by reads and writes even where the
	// filesystem could share it (to compare the two).
	NoClone bool
}

// Result says what a fork made and what it cost.
type Result struct {
	From     string             `json:"from"`
	To       string             `json:"to"`
	Snapshot string             `json:"snapshot"`
	Files    int                `json:"files"`
	Dirs     int                `json:"dirs"`
	Bytes    int64              `json:"bytes"`
	Cloned   int                `json:"cloned"` // files whose data is shared with the blob (FICLONE)
	Copied   int                `json:"copied"`
	Clone    string             `json:"clone"` // "reflink" when every file was cloned, else "copy"
	Skipped  []snapshot.Skipped `json:"skipped,omitempty"`
	// Seconds: taking the snapshot (0 when one was named); building the
	// tree (FillS), of which moving file data (clone or copy) is DataS and
	// the rest the metadata walk (directories, creates, modes, times);
	// writing the base record (RecordS); and the whole fork, whose rest
	// is the syncfs of the new tree, the swap and removing the old one.
	SnapshotS float64 `json:"snapshot_s"`
	FillS     float64 `json:"fill_s"`
	DataS     float64 `json:"data_s"`
	RecordS   float64 `json:"record_s"`
	Duration  float64 `json:"duration_s"`
	// Existing says the destination was a fork of the source already (a
	// retried start of a child): the figures are its record's, and
	// nothing was copied now.
	Existing bool `json:"existing,omitempty"`
}

// Fork makes the scope dst a copy of the scope src as of a snapshot (taken
// first unless opt names one), and records the fork's base in dst's state
// directory. dst must hold no file yet (the directories its layout makes
// are fine); its policy, modes and quotas apply: a fork over its quota is
// refused whole, with the figures, and an entry hidden or write-only in
// src is copied only where dst's policy hides it too (or keeps it
// write-only). The tree is built beside dst and swapped in
// (store.Workspace.ReplaceTree) under dst's scope lock.
func Fork(ctx context.Context, src, dst *store.Workspace, opt Options) (*Result, error) {
	start := time.Now()
	if src.Scope() == dst.Scope() {
		return nil, policy.Errorf(policy.InvalidInput, "a scope can't be forked onto itself: name another --to")
	}
	if src.Volume().Path() != dst.Volume().Path() {
		return nil, policy.Errorf(policy.InvalidInput, "a fork stays on its volume: open both scopes on one")
	}
	res := &Result{From: src.Scope().String(), To: dst.Scope().String()}
	id := opt.Snapshot
	if id == "" {
		m, err := snapshot.Create(ctx, src, snapshot.Options{Label: "fork to " + dst.Scope().String()})
		if err != nil {
			return nil, fmt.Errorf("snapshot %s to fork it: %w", src.Scope(), err)
		}
		id = m.ID
		res.SnapshotS = time.Since(start).Seconds()
	}
	res.Snapshot = id
	repo, err := snapshot.OpenRepo(src.Volume(), src.Scope(), false)
	if err != nil {
		return nil, err
	}
	defer repo.Close()
	all, err := repo.Entries(id)
	if err != nil {
		return nil, err
	}
	entries, skipped := keep(all, src.Policy(), dst.Policy())
	res.Skipped = skipped
	for _, e := range entries {
		if e.Type == "dir" {
			res.Dirs++
		} else {
			res.Files++
			res.Bytes += e.Size
		}
	}

	unlock, err := dst.Lock(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := checkEmpty(ctx, dst); err != nil {
		return nil, err
	}
	// The destination holds at most its layout's directories, which the
	// fork's tree replaces: the quota is checked against the tree alone.
	if err := checkLimits(dst.Policy(), entries, res.Bytes); err != nil {
		return nil, fmt.Errorf("fork of %s (%d files, %d directories) refused whole: %w", src.Scope(), res.Files, res.Dirs, err)
	}

	rec := &Record{Version: recordVersion, From: src.Scope(), Snapshot: id, Created: start.UTC(), Skipped: skipped}
	f := filler{repo: repo, clone: !opt.NoClone, plain: opt.NoClone}
	err = dst.ReplaceTree(ctx, func(dir *os.File) error {
		t := time.Now()
		base, err := f.fill(ctx, dir, entries)
		if err != nil {
			return err
		}
		res.FillS = time.Since(t).Seconds()
		t = time.Now()
		defer func() { res.RecordS = time.Since(t).Seconds() }()
		rec.Entries = base
		rec.Clone = "copy"
		if f.cloned > 0 && f.copied == 0 {
			rec.Clone = "reflink"
		}
		// The record goes first: a crash after the swap leaves a fork
		// that knows its base.
		return writeRecord(dst.Volume(), dst.Scope(), rec)
	})
	if err != nil {
		removeRecord(dst.Volume(), dst.Scope())
		return nil, err
	}
	if err := noteFork(src.Volume(), src.Scope(), dst.Scope()); err != nil {
		return nil, fmt.Errorf("the fork was made, but %s could not note it among its forks: %w", src.Scope(), err)
	}
	res.Cloned, res.Copied, res.Clone = f.cloned, f.copied, rec.Clone
	res.DataS = f.data.Seconds()
	res.Duration = time.Since(start).Seconds()
	return res, nil
}

// keep drops the entries a fork must not copy: those hidden in the source
// unless the destination hides them too, and those write-only in the
// source unless the destination keeps them unreadable.
func keep(all []snapshot.Entry, from, to *policy.Policy) ([]snapshot.Entry, []snapshot.Skipped) {
	var kept []snapshot.Entry
	var skipped []snapshot.Skipped
	var under string // a skipped directory: what it holds goes with it
	for _, e := range all {
		if under != "" && len(e.Path) > len(under) && e.Path[:len(under)] == under && e.Path[len(under)] == '/' {
			continue
		}
		under = ""
		src, dst := from.ModeOf(e.Path), to.ModeOf(e.Path)
		var reason string
		switch {
		case src == policy.ModeHidden && dst != policy.ModeHidden:
			reason = "hidden in the source, visible in the fork"
		case src == policy.ModeWO && dst != policy.ModeWO && dst != policy.ModeHidden:
			reason = "write-only in the source, readable in the fork"
		}
		if reason != "" {
			skipped = append(skipped, snapshot.Skipped{Path: e.Path, Reason: reason})
			if e.Type == "dir" {
				under = e.Path
			}
			continue
		}
		kept = append(kept, e)
	}
	return kept, skipped
}

// checkLimits refuses a tree the destination's limits don't take: its
// quota, its per-file size and each capped subtree's cap.
func checkLimits(pol *policy.Policy, entries []snapshot.Entry, bytes int64) error {
	if err := pol.Limits.CheckQuota(policy.Usage{}, bytes, int64(len(entries))); err != nil {
		return err
	}
	caps := map[string]*policy.Usage{}
	for _, e := range entries {
		if e.Type == "file" {
			if err := pol.Limits.CheckFileSize(e.Path, e.Size); err != nil {
				return err
			}
		}
		for _, c := range pol.Caps(e.Path) {
			u := caps[c.Prefix]
			if u == nil {
				u = &policy.Usage{}
				caps[c.Prefix] = u
			}
			u.Files++
			if e.Type != "dir" {
				u.Bytes += e.Size
			}
		}
	}
	for _, c := range pol.Subtrees {
		if u := caps[c.Prefix]; u != nil && c.Capped() {
			if err := c.CheckCap(policy.Usage{}, u.Bytes, u.Files); err != nil {
				return err
			}
		}
	}
	return nil
}

// errFile stops checkEmpty's walk at the first file.
var errFile = errors.New("a file")

// checkEmpty refuses a destination that holds any file: a fork replaces
// the whole tree, and must never lose work.
func checkEmpty(ctx context.Context, ws *store.Workspace) error {
	var found string
	err := ws.Unfiltered().Walk(ctx, ".", func(rel string, info store.Info) error {
		if info.Kind != policy.KindDir && rel != policy.ReadmeFile {
			found = rel
			return errFile
		}
		return nil
	})
	if err == errFile {
		return policy.Errorf(policy.Exists, "scope %s already holds files (%s): a fork is made only into an empty scope", ws.Scope(), found)
	}
	return err
}

type openDir struct {
	rel string
	fd  int
}

// filler builds a fork's tree from the blobs.
type filler struct {
	repo           *snapshot.Repo
	clone          bool
	plain          bool // copy by read and write, never sharing extents
	cloned, copied int
	data           time.Duration
}

// fill builds entries in dir, every directory before what it holds (walk
// order), and returns the base record of each.
func (f *filler) fill(ctx context.Context, dir *os.File, entries []snapshot.Entry) ([]Entry, error) {
	base := make([]Entry, 0, len(entries))
	stack := []openDir{{".", int(dir.Fd())}}
	defer func() {
		for _, d := range stack[1:] {
			unix.Close(d.fd)
		}
	}()
	for _, e := range entries {
		if ctx.Err() != nil {
			return nil, policy.Errorf(policy.Cancelled, "fork cancelled before the swap; the destination is unchanged")
		}
		parent, name := policy.Split(e.Path)
		for len(stack) > 1 && stack[len(stack)-1].rel != parent {
			unix.Close(stack[len(stack)-1].fd)
			stack = stack[:len(stack)-1]
		}
		top := stack[len(stack)-1]
		if top.rel != parent {
			return nil, fmt.Errorf("snapshot entries out of order at %s", e.Path)
		}
		be := Entry{Entry: e}
		switch e.Type {
		case "dir":
			if err := unix.Mkdirat(top.fd, name, policy.DirPerm); err != nil {
				return nil, fmt.Errorf("fork %s: %w", e.Path, err)
			}
			fd, err := unix.Openat(top.fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return nil, fmt.Errorf("fork %s: %w", e.Path, err)
			}
			stack = append(stack, openDir{e.Path, fd})
		case "file", "symlink":
			st, err := f.file(top.fd, name, e)
			if err != nil {
				return nil, err
			}
			be.setStat(&st)
		default:
			return nil, fmt.Errorf("snapshot entry %s has unknown type %q", e.Path, e.Type)
		}
		base = append(base, be)
	}
	return base, nil
}

// file makes name in dirfd with e's content, mode and modification time.
func (f *filler) file(dirfd int, name string, e snapshot.Entry) (unix.Stat_t, error) {
	var st unix.Stat_t
	src, err := f.repo.OpenBlob(e.SHA256)
	if err != nil {
		return st, fmt.Errorf("fork %s: %w", e.Path, err)
	}
	defer src.Close()
	if err := unix.Fstat(int(src.Fd()), &st); err != nil || st.Size != e.Size {
		return st, fmt.Errorf("fork %s: the stored content %.12s… is damaged (size %d, want %d); nothing was changed", e.Path, e.SHA256, st.Size, e.Size)
	}
	fd, err := unix.Openat(dirfd, name, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, policy.FilePerm)
	if err != nil {
		return st, fmt.Errorf("fork %s: %w", e.Path, err)
	}
	dst := os.NewFile(uintptr(fd), name)
	defer dst.Close()
	t := time.Now()
	if e.Size > 0 {
		if err := f.copyData(dst, src); err != nil {
			return st, fmt.Errorf("fork %s: %w", e.Path, err)
		}
	}
	f.data += time.Since(t)
	perm := e.Perm & 0o700
	if e.Type == "symlink" {
		// Only a manifest loomfs wrote can ask for the link's marker.
		perm = policy.LinkPerm
	}
	// The file was made 0600; only another mode needs a chmod.
	if perm != policy.FilePerm {
		if err := unix.Fchmod(fd, perm); err != nil {
			return st, fmt.Errorf("fork %s: %w", e.Path, err)
		}
	}
	ts := []unix.Timespec{unix.NsecToTimespec(e.MTime), unix.NsecToTimespec(e.MTime)}
	if err := unix.UtimesNanoAt(dirfd, name, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return st, fmt.Errorf("fork %s: %w", e.Path, err)
	}
	if err := unix.Fstat(fd, &st); err != nil {
		return st, fmt.Errorf("fork %s: %w", e.Path, err)
	}
	return st, nil
}

// copyData shares src's extents with dst where the filesystem can
// (FICLONE), and copies them otherwise; after the first refusal it stops
// asking.
func (f *filler) copyData(dst, src *os.File) error {
	if f.clone {
		err := unix.IoctlFileClone(int(dst.Fd()), int(src.Fd()))
		if err == nil {
			f.cloned++
			return nil
		}
		if !cloneUnsupported(err) {
			return fmt.Errorf("clone: %w", err)
		}
		f.clone = false
	}
	var err error
	if f.plain {
		// Plain reads and writes: copy_file_range shares extents on XFS
		// and btrfs, which NoClone asks not to.
		_, err = io.Copy(struct{ io.Writer }{dst}, struct{ io.Reader }{src})
	} else {
		_, err = io.Copy(dst, src)
	}
	if err != nil {
		return fmt.Errorf("copy: %w", err)
	}
	f.copied++
	return nil
}

// cloneUnsupported reports whether FICLONE's error means the filesystem
// (or this pair of files) can't share extents, rather than a failure.
func cloneUnsupported(err error) bool {
	switch err {
	case unix.EOPNOTSUPP, unix.ENOTTY, unix.EINVAL, unix.EXDEV, unix.ENOSYS, unix.EPERM:
		return true
	}
	return false
}
