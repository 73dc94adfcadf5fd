package fork

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

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
	// the rest the metadata walk (directories, creates, modes, times) —
	// the files are made by several workers at once, so DataS is FillS
	// split by the share of the workers' time spent moving data;
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
// (store.Workspace.ReplaceTreeCounted) under dst's scope lock.
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
	f := filler{repo: repo, plain: opt.NoClone}
	// The tree is exactly entries: the destination's quota account is
	// counted from them, not by a walk of the tree after the swap.
	err = dst.ReplaceTreeCounted(ctx, func(dir *os.File) ([]store.TreeEntry, error) {
		t := time.Now()
		base, err := f.fill(ctx, dir, entries)
		if err != nil {
			return nil, err
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
		if err := writeRecord(dst.Volume(), dst.Scope(), rec); err != nil {
			return nil, err
		}
		return built(entries), nil
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

// built lists entries as the tree a fork builds from them holds them.
func built(entries []snapshot.Entry) []store.TreeEntry {
	out := make([]store.TreeEntry, len(entries))
	for i, e := range entries {
		out[i] = store.TreeEntry{Path: e.Path, Dir: e.Type == "dir", Size: e.Size}
	}
	return out
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

// workersPerCPU is how many files a fork builds at once per CPU: each
// file is a handful of syscalls that mostly wait on the filesystem (its
// journal, or a round trip each on NFS), so a few workers a CPU keep
// both the CPUs and the disk busy.
const workersPerCPU = 4

// maxWorkers bounds the workers however many CPUs there are, and with
// them the descriptors a fork holds open: two a worker, and a directory
// for each batch queued.
const maxWorkers = 64

// batchFiles is the most files of one directory a worker takes at once:
// enough that handing them over costs little, few enough that a large
// directory is shared among the workers.
const batchFiles = 32

// copyBuf is the buffer of a worker's plain copies (NoClone).
const copyBuf = 256 << 10

// workerCount is how many workers a fork of n files starts.
func workerCount(n int) int {
	w := min(runtime.GOMAXPROCS(0)*workersPerCPU, maxWorkers)
	return max(1, min(w, (n+batchFiles-1)/batchFiles))
}

// dirRef is a directory of the tree being built, open while the walk is
// in it and while a batch of its files waits or is being made; the last
// to let go closes it, so each directory is opened once and every file is
// made relative to it.
type dirRef struct {
	rel  string
	fd   int
	refs atomic.Int32
	root bool // the staging directory: its descriptor is the caller's
}

func newDirRef(rel string, fd int, root bool) *dirRef {
	d := &dirRef{rel: rel, fd: fd, root: root}
	d.refs.Store(1)
	return d
}

func (d *dirRef) hold() { d.refs.Add(1) }

func (d *dirRef) release() {
	if d.refs.Add(-1) == 0 && !d.root {
		unix.Close(d.fd)
	}
}

// batch is files of one directory for one worker (indexes into the
// entries); it holds a reference to the directory.
type batch struct {
	dir *dirRef
	idx []int
}

// filler builds a fork's tree from the blobs.
type filler struct {
	repo  *snapshot.Repo
	plain bool // copy by read and write, never sharing extents
	// noClone and noRange are set at the first refusal of FICLONE and
	// of copy_file_range, so no worker asks again.
	noClone, noRange atomic.Bool
	cloned, copied   int
	// data is the share of the fill's wall time spent moving file data:
	// the workers' time moving data over their busy time, times the wall
	// time (with several workers, their times add up to more than it).
	data time.Duration
}

// worker is one goroutine's counts, summed when the fill ends.
type worker struct {
	cloned, copied int
	data, busy     time.Duration
	buf            []byte
}

// fill builds entries in dir and returns the base record of each, in
// their order. The directories are made in walk order by this goroutine,
// each before what it holds; the files are made by bounded workers, a
// batch of one directory at a time. The first failure stops the rest.
func (f *filler) fill(ctx context.Context, dir *os.File, entries []snapshot.Entry) ([]Entry, error) {
	start := time.Now()
	base := make([]Entry, len(entries))
	wctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	workers := make([]worker, workerCount(len(entries)))
	jobs := make(chan batch, len(workers))
	var wg sync.WaitGroup
	for i := range workers {
		wg.Add(1)
		go func(w *worker) {
			defer wg.Done()
			f.work(wctx, stop, w, jobs, entries, base)
		}(&workers[i])
	}
	if err := f.walk(wctx, dir, entries, base, jobs); err != nil {
		stop(err)
	}
	close(jobs)
	wg.Wait()
	if err := context.Cause(wctx); err != nil {
		if ctx.Err() != nil {
			return nil, policy.Errorf(policy.Cancelled, "fork cancelled before the swap; the destination is unchanged")
		}
		return nil, err
	}
	var data, busy time.Duration
	for _, w := range workers {
		f.cloned += w.cloned
		f.copied += w.copied
		data += w.data
		busy += w.busy
	}
	if busy > 0 {
		f.data = time.Duration(float64(time.Since(start)) * float64(data) / float64(busy))
	}
	return base, nil
}

// walk makes the directories of entries in order and hands their files to
// the workers in batches. It stops early, with no error, when ctx is
// done (a worker failed, or the fork was cancelled).
func (f *filler) walk(ctx context.Context, dir *os.File, entries []snapshot.Entry, base []Entry, jobs chan<- batch) error {
	stack := []*dirRef{newDirRef(".", int(dir.Fd()), true)}
	var cur batch
	defer func() {
		if cur.dir != nil {
			cur.dir.release()
		}
		for _, d := range stack {
			d.release()
		}
	}()
	// send hands cur to a worker; false when the fill is stopping.
	send := func() bool {
		if cur.dir == nil {
			return true
		}
		select {
		case jobs <- cur:
			cur = batch{}
			return true
		case <-ctx.Done():
			return false
		}
	}
	for i := range entries {
		e := &entries[i]
		if ctx.Err() != nil {
			return nil
		}
		parent, name := policy.Split(e.Path)
		for len(stack) > 1 && stack[len(stack)-1].rel != parent {
			stack[len(stack)-1].release()
			stack = stack[:len(stack)-1]
		}
		top := stack[len(stack)-1]
		if top.rel != parent {
			return fmt.Errorf("snapshot entries out of order at %s", e.Path)
		}
		switch e.Type {
		case "dir":
			fd, err := mkdirOpen(top.fd, name)
			if err != nil {
				return fmt.Errorf("fork %s: %w", e.Path, err)
			}
			base[i] = Entry{Entry: *e}
			stack = append(stack, newDirRef(e.Path, fd, false))
		case "file", "symlink":
			if cur.dir != top || len(cur.idx) == batchFiles {
				if !send() {
					return nil
				}
				top.hold()
				cur = batch{dir: top, idx: make([]int, 0, batchFiles)}
			}
			cur.idx = append(cur.idx, i)
		default:
			return fmt.Errorf("snapshot entry %s has unknown type %q", e.Path, e.Type)
		}
	}
	send()
	return nil
}

// mkdirOpen makes the directory name in dirfd and opens it.
func mkdirOpen(dirfd int, name string) (int, error) {
	if err := unix.Mkdirat(dirfd, name, policy.DirPerm); err != nil {
		return -1, err
	}
	return unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
}

// work makes the files of each batch it is handed, until the walk ends;
// after a failure (its own or another's) it only lets the batches go.
func (f *filler) work(ctx context.Context, stop context.CancelCauseFunc, w *worker, jobs <-chan batch, entries []snapshot.Entry, base []Entry) {
	for b := range jobs {
		t := time.Now()
		for _, i := range b.idx {
			if ctx.Err() != nil {
				break
			}
			if err := f.file(w, b.dir.fd, &entries[i], &base[i]); err != nil {
				stop(err)
				break
			}
		}
		w.busy += time.Since(t)
		b.dir.release()
	}
}

// file makes e's file in dirfd with its content, mode and modification
// time, and sets be to e with what fstat then says of the copy. Per file
// that is the blob's open, the create, the clone or copy, the times and
// one fstat, with no path resolved beyond a name in an open directory.
func (f *filler) file(w *worker, dirfd int, e *snapshot.Entry, be *Entry) error {
	_, name := policy.Split(e.Path)
	src, err := f.repo.OpenBlob(e.SHA256)
	if err != nil {
		return fmt.Errorf("fork %s: %w", e.Path, err)
	}
	defer src.Close()
	fd, err := unix.Openat(dirfd, name, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, policy.FilePerm)
	if err != nil {
		return fmt.Errorf("fork %s: %w", e.Path, err)
	}
	defer unix.Close(fd)
	if e.Size > 0 {
		t := time.Now()
		err := f.copyData(w, fd, int(src.Fd()), e)
		w.data += time.Since(t)
		if err != nil {
			return fmt.Errorf("fork %s: %w", e.Path, err)
		}
	}
	perm := e.Perm & 0o700
	if e.Type == "symlink" {
		// Only a manifest loomfs wrote can ask for the link's marker.
		perm = policy.LinkPerm
	}
	// The file was made 0600; only another mode needs a chmod.
	if perm != policy.FilePerm {
		if err := unix.Fchmod(fd, perm); err != nil {
			return fmt.Errorf("fork %s: %w", e.Path, err)
		}
	}
	if err := futimens(fd, e.MTime); err != nil {
		return fmt.Errorf("fork %s: set its times: %w", e.Path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("fork %s: %w", e.Path, err)
	}
	// A clone takes the whole blob: the copy's size is the blob's.
	if st.Size != e.Size {
		return damaged(e, st.Size)
	}
	*be = Entry{Entry: *e}
	be.setStat(&st)
	return nil
}

// damaged is the error of a blob whose size is not its entry's.
func damaged(e *snapshot.Entry, size int64) error {
	return fmt.Errorf("fork %s: the stored content %.12s… is damaged (size %d, want %d); nothing was changed", e.Path, e.SHA256, size, e.Size)
}

// futimens sets the access and modification times of the open file fd to
// mtime (ns): utimensat with no path, so nothing is looked up again.
func futimens(fd int, mtime int64) error {
	ts := [2]unix.Timespec{unix.NsecToTimespec(mtime), unix.NsecToTimespec(mtime)}
	_, _, errno := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(fd), 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// copyData shares the blob's extents with dst where the filesystem can
// (FICLONE), and copies them otherwise; after the first refusal no worker
// asks again.
func (f *filler) copyData(w *worker, dst, src int, e *snapshot.Entry) error {
	if !f.plain && !f.noClone.Load() {
		err := unix.IoctlFileClone(dst, src)
		if err == nil {
			w.cloned++
			return nil
		}
		if !cloneUnsupported(err) {
			return fmt.Errorf("clone: %w", err)
		}
		f.noClone.Store(true)
	}
	// A copy reads no further than the entry's size: the blob's own size
	// is checked first, so a damaged one is never taken in part.
	var st unix.Stat_t
	if err := unix.Fstat(src, &st); err != nil {
		return fmt.Errorf("stat the stored content: %w", err)
	}
	if st.Size != e.Size {
		return damaged(e, st.Size)
	}
	if err := f.copyRange(w, dst, src, e.Size); err != nil {
		return fmt.Errorf("copy: %w", err)
	}
	w.copied++
	return nil
}

// copyRange copies size bytes from src to dst: by copy_file_range, which
// copies in the kernel (and shares extents on XFS and btrfs), unless
// NoClone asks for plain reads and writes or the kernel refuses it.
func (f *filler) copyRange(w *worker, dst, src int, size int64) error {
	var done int64
	for !f.plain && !f.noRange.Load() && done < size {
		n, err := unix.CopyFileRange(src, nil, dst, nil, int(size-done), 0)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EXDEV, err == unix.ENOSYS, err == unix.EOPNOTSUPP, err == unix.EINVAL:
			f.noRange.Store(true)
			continue
		case err != nil:
			return err
		case n == 0:
			return io.ErrUnexpectedEOF
		}
		done += int64(n)
	}
	if done == size {
		return nil
	}
	if w.buf == nil {
		w.buf = make([]byte, copyBuf)
	}
	for done < size {
		n, err := unix.Pread(src, w.buf[:min(int64(len(w.buf)), size-done)], done)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return io.ErrUnexpectedEOF
		}
		if err := pwriteAll(dst, w.buf[:n], done); err != nil {
			return err
		}
		done += int64(n)
	}
	return nil
}

// pwriteAll writes b to fd at off, however many writes it takes.
func pwriteAll(fd int, b []byte, off int64) error {
	for len(b) > 0 {
		n, err := unix.Pwrite(fd, b, off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		b, off = b[n:], off+int64(n)
	}
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
