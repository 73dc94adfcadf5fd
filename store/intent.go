package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
)

// A change set is several files changed all at once (workspace_apply_patch):
// every file is checked first, then the new contents are staged beside
// their files, and only then renamed into place, one by one. What makes
// it all or nothing across a crash is the intent record, IntentFile in the
// scope's state directory, written before the first staged file and
// removed after the last rename:
//
//	staging  the temporary files it names may exist; nothing is in place
//	commit   every staged file is complete and fsynced; the renames and
//	         deletes it lists are to be done, some may be
//
// Whoever takes the scope lock next (Lock) finds the record and finishes
// the job: a staging record is rolled back (its temporaries removed), a
// commit record rolled forward (each rename or delete not yet done is
// done), so no one ever sees a change set half applied after a crash.
// Directories a change set makes for new files are made before the record
// and are not rolled back: a crash may leave them, empty.

// IntentFile is the intent record of a change set being applied.
const IntentFile = "changeset.json"

// FileChange is one file of a change set.
type FileChange struct {
	Path string
	// Data is the file's new content; with Delete, the file is removed.
	Data   []byte
	Delete bool
	// Expected is the sha256 the file must have now, "" for a file that
	// must not exist yet: the caller's view of the file it computed the
	// change from.
	Expected string
	// Link, with Delete, removes an emulated link as Remove does: the
	// link itself, which has no content hash (it is never read as a
	// file); Expected is not used, and anything else there is a conflict.
	Link bool
}

type intentEntry struct {
	Path   string `json:"path"`
	Temp   string `json:"temp,omitempty"`
	Delete bool   `json:"delete,omitempty"`
	Op     string `json:"op"`
	// Of a delete, the file it removes, as checked: its inode number
	// and change time. A roll-forward removes only that file, never one
	// made again at the path since (an inode number may be reused; a
	// change time of a file made later differs).
	Ino   uint64 `json:"ino,omitempty"`
	Ctime int64  `json:"ctime_ns,omitempty"`
}

type intent struct {
	State   string        `json:"state"`
	Source  string        `json:"src,omitempty"`
	Call    string        `json:"call,omitempty"`
	Entries []intentEntry `json:"entries"`
}

const (
	intentStaging = "staging"
	intentCommit  = "commit"
)

// crashEnv, for tests only, names a count of files after which
// ApplyChanges kills its own process (SIGKILL), so a test can show what
// the next lock take makes of a change set cut midway.
const crashEnv = "LOOMFS_TEST_CRASH_AFTER_FILES"

// planned is one checked change, with what it needs to be applied.
type planned struct {
	FileChange
	parent *Dir
	name   string
	perm   uint32
	exists bool
	size   int64 // the current file's
	temp   string
}

// ApplyChanges makes every change of changes, or none: each file's path
// is checked against the policy as a write or a delete, its current
// content against Expected, and the quotas against the whole set, before
// anything is written; then the contents are staged and put in place
// under an intent record. Missing parent directories of new files are
// made. The caller holds the scope lock. The results are in the order of
// changes (a delete's is zero).
func (w *Workspace) ApplyChanges(ctx context.Context, changes []FileChange) ([]WriteResult, error) {
	if err := w.vol.recheck(); err != nil {
		return nil, err
	}
	if err := w.CheckQuarantine(); err != nil {
		return nil, err
	}
	var plan []*planned
	defer func() {
		for _, p := range plan {
			if p.parent != nil {
				p.parent.Close()
			}
		}
	}()
	seen := map[string]bool{}
	var mkdirs []string
	for _, c := range changes {
		if seen[c.Path] {
			return nil, policy.Errorf(policy.InvalidInput, "%s is changed twice in one change set", c.Path)
		}
		seen[c.Path] = true
		p, dirs, err := w.plan(c)
		if p != nil {
			plan = append(plan, p)
		}
		if err != nil {
			return nil, err
		}
		mkdirs = append(mkdirs, dirs...)
	}
	undo, err := w.reserve(ctx, plan)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		undo()
		return nil, policy.Errorf(policy.Cancelled, "the change set was cancelled before anything was written")
	}
	if err := w.ReadyToChange(); err != nil {
		undo()
		return nil, err
	}
	for _, dir := range mkdirs {
		if _, err := w.Mkdir(ctx, dir, true); err != nil {
			undo()
			return nil, err
		}
	}
	for _, p := range plan {
		if p.parent == nil {
			if p.parent, p.name, err = w.Parent(p.Path); err != nil {
				undo()
				return nil, err
			}
		}
	}
	by := changeBy(ctx, "")
	rec := intent{State: intentStaging, Source: by.Source, Call: by.Call}
	for _, p := range plan {
		e := intentEntry{Path: p.Path, Delete: p.Delete, Op: OpDelete}
		if p.Delete {
			var st unix.Stat_t
			if err := unix.Fstatat(int(p.parent.Fd()), p.name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				undo()
				return nil, policy.FromErrno(err, "delete", p.Path)
			}
			e.Ino, e.Ctime = st.Ino, st.Ctim.Nano()
		} else {
			p.temp = tempName()
			e.Temp = p.temp
			e.Op = OpWrite
			if !p.exists {
				e.Op = OpCreate
			}
		}
		rec.Entries = append(rec.Entries, e)
	}
	if err := w.writeState(IntentFile, rec, true); err != nil {
		undo()
		return nil, err
	}
	if err := w.stage(plan); err != nil {
		w.rollBack(rec)
		undo()
		return nil, err
	}
	rec.State = intentCommit
	if err := w.writeState(IntentFile, rec, false); err != nil {
		w.rollBack(rec)
		undo()
		return nil, err
	}
	crash, _ := strconv.Atoi(os.Getenv(crashEnv))
	results := make([]WriteResult, len(plan))
	for i, p := range plan {
		if err := w.put(p.parent, rec.Entries[i], rec, false); err != nil {
			// The record stays: the next lock take rolls it forward,
			// the rest of the set as it was committed. The answer can't
			// say nothing was written, nor that all of it was.
			return nil, &policy.Error{Code: policy.UnknownOutcome, Message: fmt.Sprintf("the change set was committed, but placing %s failed (%v); the rest of it is placed by the next change on this workspace: re-read the files it names before changing them again", p.Path, err), Err: err}
		}
		if !p.Delete {
			results[i] = WriteResult{Bytes: int64(len(p.Data)), SHA256: hashBytes(p.Data), Created: !p.exists}
		}
		if crash > 0 && i+1 == crash {
			unix.Kill(os.Getpid(), unix.SIGKILL)
		}
	}
	// Each directory once: a patch of 20 files in one directory costs
	// one directory fsync here, not 20.
	synced := map[string]bool{}
	for _, p := range plan {
		if dir, _ := policy.Split(p.Path); !synced[dir] {
			synced[dir] = true
			syncDir(int(p.parent.Fd()))
		}
	}
	// Every file is in place: that is the answer, even if the record
	// can't be removed now (a full volume, an I/O error). The next lock
	// take rolls it forward, which finds every entry done: the staged
	// files are gone, and a delete removes only the file it checked.
	w.removeIntent()
	return results, nil
}

// plan checks one change and says which directories must be made for it.
func (w *Workspace) plan(c FileChange) (*planned, []string, error) {
	op := policy.OpWrite
	if c.Delete {
		op = policy.OpDelete
	}
	if err := w.pol.Check(op, c.Path); err != nil {
		return nil, nil, err
	}
	p := &planned{FileChange: c, perm: policy.FilePerm}
	if !c.Delete {
		if err := w.pol.Limits.CheckText(c.Path, int64(len(c.Data))); err != nil {
			return nil, nil, err
		}
	}
	parent, name, err := w.Parent(c.Path)
	if policy.CodeOf(err) == policy.NotFound && !c.Delete && c.Expected == "" {
		// A new file in a directory still to make: every missing one
		// must be one the policy lets us create.
		var dirs []string
		for dir, _ := policy.Split(c.Path); dir != "."; dir, _ = policy.Split(dir) {
			if _, err := w.Lstat(dir); err == nil {
				break
			} else if policy.CodeOf(err) != policy.NotFound {
				return nil, nil, err
			}
			if err := w.pol.Check(policy.OpCreate, dir); err != nil {
				return nil, nil, err
			}
			dirs = append([]string{dir}, dirs...)
		}
		if err := w.pol.Check(policy.OpCreate, c.Path); err != nil {
			return nil, nil, err
		}
		// The deepest, with its parents.
		return p, dirs[max(len(dirs)-1, 0):], nil
	}
	if err != nil {
		return nil, nil, err
	}
	p.parent, p.name = parent, name
	if c.Link {
		info, err := w.lstatChecked(policy.OpDelete, c.Path, int(parent.Fd()), name)
		if err != nil {
			return p, nil, err
		}
		if !c.Delete || info.Kind != policy.KindLink {
			return p, nil, policy.Errorf(policy.Conflict, "%s is no longer a symbolic link", c.Path)
		}
		p.exists, p.size = true, info.Size
		return p, nil, nil
	}
	cur, info, exists, err := w.currentHash(parent, c.Path, name)
	if err != nil {
		return p, nil, err
	}
	switch {
	case c.Delete && !exists:
		return p, nil, policy.Errorf(policy.NotFound, "%s does not exist", c.Path)
	case c.Expected == "" && exists, c.Expected != "" && c.Expected != cur:
		return p, nil, w.conflict(c.Path, cur)
	}
	p.exists, p.size = exists, info.Size
	if exists {
		p.perm = policy.OwnerPerm(info.Perm)
	} else if err := w.pol.Check(policy.OpCreate, c.Path); err != nil {
		return p, nil, err
	}
	return p, nil, nil
}

// reserve counts the whole set in the quotas, deletes first, and returns
// how to undo it.
func (w *Workspace) reserve(ctx context.Context, plan []*planned) (undo func(), err error) {
	type held struct {
		rel          string
		bytes, files int64
	}
	var done []held
	undo = func() {
		for _, h := range done {
			w.AdjustAt(h.rel, -h.bytes, -h.files)
		}
	}
	for _, deletes := range []bool{true, false} {
		for _, p := range plan {
			if p.Delete != deletes {
				continue
			}
			h := held{rel: p.Path, bytes: int64(len(p.Data)) - p.size}
			switch {
			case p.Delete:
				h.bytes, h.files = -p.size, -1
			case !p.exists:
				h.files = 1
			}
			if err := w.ReserveAt(ctx, h.rel, h.bytes, h.files); err != nil {
				undo()
				// Named, so the caller can tell which of its files
				// the quota ran out at.
				var pe *policy.Error
				if errors.As(err, &pe) {
					named := *pe
					named.Message = h.rel + ": " + pe.Message
					err = &named
				}
				return nil, err
			}
			done = append(done, h)
		}
	}
	return undo, nil
}

// stage writes each new content, fsynced, under its temporary name.
func (w *Workspace) stage(plan []*planned) error {
	for batch := plan; len(batch) > 0; {
		n := min(len(batch), stageBatch)
		if err := stageFiles(batch[:n]); err != nil {
			return err
		}
		batch = batch[n:]
	}
	return nil
}

// stageBatch is how many staged files are written before they are
// fsynced together: a change set holds that many descriptors at most.
const stageBatch = 32

// stageFiles writes the staged files of plan, then fsyncs them all at
// once: on a local journalling filesystem concurrent fsyncs share one
// journal commit, and on a network one their round trips overlap, where
// one after another a 20-file patch waited for 20.
func stageFiles(plan []*planned) error {
	var files []*os.File
	var paths []string
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	for _, p := range plan {
		if p.Delete {
			continue
		}
		pfd := int(p.parent.Fd())
		fd, err := unix.Openat(pfd, p.temp, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, p.perm)
		if err != nil {
			return policy.FromErrno(err, "write", p.Path)
		}
		unix.Fchmod(fd, p.perm)
		f := os.NewFile(uintptr(fd), p.temp)
		files, paths = append(files, f), append(paths, p.Path)
		if _, err := f.Write(p.Data); err != nil {
			return policy.FromErrno(err, "write", p.Path)
		}
	}
	errs := make([]error, len(files))
	var wg sync.WaitGroup
	for i, f := range files {
		wg.Go(func() { errs[i] = f.Sync() })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return policy.FromErrno(err, "write", paths[i])
		}
	}
	return nil
}

// put does one entry of a committed record: the staged file renamed into
// place, or the file removed. Done already (after a crash) is done; when
// rolling forward, a delete whose file is no longer the one the record
// checked (it was removed, and a file made again at its path since) is
// done too.
func (w *Workspace) put(parent *Dir, e intentEntry, rec intent, rollForward bool) error {
	_, name := policy.Split(e.Path)
	pfd := int(parent.Fd())
	if rollForward && e.Delete && e.Ino != 0 {
		var st unix.Stat_t
		if err := unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && (st.Ino != e.Ino || st.Ctim.Nano() != e.Ctime) {
			return nil
		}
	}
	var err error
	for { // a call interrupted by a signal is made again, not failed
		if e.Delete {
			err = unix.Unlinkat(pfd, name, 0)
		} else {
			err = unix.Renameat(pfd, e.Temp, pfd, name)
		}
		if err != unix.EINTR {
			break
		}
	}
	if err == unix.ENOENT {
		return nil
	}
	if err != nil {
		return policy.FromErrno(err, "apply", e.Path)
	}
	w.NoteChangeBy(e.Path, false, Change{Op: e.Op, Source: rec.Source, Call: rec.Call})
	return nil
}

// recoverChanges finishes a change set a crash cut midway: rolled back
// while staging, forward once committed. It runs when the scope lock is
// taken.
func (w *Workspace) recoverChanges(ctx context.Context) (found bool, err error) {
	rec, err := w.readIntent()
	if err != nil || rec == nil {
		return false, err
	}
	if rec.State != intentCommit {
		w.rollBack(*rec)
		return true, w.removeIntent()
	}
	if err := w.ReadyToChange(); err != nil {
		return true, err
	}
	for _, e := range rec.Entries {
		parent, _, err := w.Parent(e.Path)
		if err != nil {
			return true, fmt.Errorf("finish the change set at %s: %w", e.Path, err)
		}
		err = w.put(parent, e, *rec, true)
		syncDir(int(parent.Fd()))
		parent.Close()
		if err != nil {
			return true, err
		}
	}
	w.RefreshUsage(ctx)
	return true, w.removeIntent()
}

// rollBack removes the temporaries a staging record names.
func (w *Workspace) rollBack(rec intent) {
	for _, e := range rec.Entries {
		if e.Temp == "" {
			continue
		}
		if parent, _, err := w.Parent(e.Path); err == nil {
			unix.Unlinkat(int(parent.Fd()), e.Temp, 0)
			parent.Close()
		}
	}
	w.removeIntent()
}

// ChangeSetPending reports whether a change set's intent record is in
// the state directory: one is being applied, or a crash cut one that the
// next lock take finishes. A reader that must not see a change set half
// applied takes the lock then (and so waits for it, or finishes it).
func (w *Workspace) ChangeSetPending() bool {
	var st unix.Stat_t
	return unix.Fstatat(int(w.state.Fd()), IntentFile, &st, unix.AT_SYMLINK_NOFOLLOW) == nil
}

func (w *Workspace) readIntent() (*intent, error) {
	fd, err := unix.Openat(int(w.state.Fd()), IntentFile, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err == unix.ENOENT {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", IntentFile, err)
	}
	f := os.NewFile(uintptr(fd), IntentFile)
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", IntentFile, err)
	}
	var rec intent
	if err := json.Unmarshal(b, &rec); err != nil {
		// Written whole by a rename: unreadable means damaged, and
		// guessing could half-apply it.
		return nil, fmt.Errorf("the scope's change set record %s is damaged (%v); an administrator must look at it", IntentFile, err)
	}
	for _, e := range rec.Entries {
		clean, err := policy.CleanPath(e.Path, w.pol.MainScope)
		if err != nil || clean != e.Path || e.Temp != "" && (!strings.HasPrefix(e.Temp, policy.InternalPrefix+"tmp-") || strings.ContainsRune(e.Temp, '/')) {
			return nil, fmt.Errorf("the scope's change set record %s names %q: refused", IntentFile, e.Path)
		}
	}
	return &rec, nil
}

func (w *Workspace) removeIntent() error {
	sfd := int(w.state.Fd())
	if err := unix.Unlinkat(sfd, IntentFile, 0); err != nil && err != unix.ENOENT {
		return fmt.Errorf("remove %s: %w", IntentFile, err)
	}
	return syncDir(sfd)
}
