package fork

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sort"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/snapshot"
	"github.com/agentloom/loomfs/store"
)

// RecordFile is a fork's record in its scope's state directory.
const RecordFile = "fork.json"

// ForksDir, in a source scope's state directory, names the scopes forked
// from it: one file per fork, named by its scope hash, holding its scope.
const ForksDir = "forks"

const recordVersion = 1

// Record is what a scope was forked from: the source and snapshot, and
// the base every merge compares against.
type Record struct {
	Version  int                `json:"version"`
	From     store.Scope        `json:"from"`
	Snapshot string             `json:"snapshot"`
	Created  time.Time          `json:"created"`
	Clone    string             `json:"clone"` // "reflink" or "copy": how file data came over
	Entries  []Entry            `json:"entries"`
	Skipped  []snapshot.Skipped `json:"skipped,omitempty"`
}

// Entry is one path of a fork's base: the snapshot's entry, and what
// fstat said of the fork's copy when it became the base.
type Entry struct {
	snapshot.Entry
	Ino   uint64 `json:"ino,omitempty"`
	CTime int64  `json:"ctime_ns,omitempty"`
	FSize int64  `json:"fsize,omitempty"` // the fork copy's size (a link's is its target's)
	FMod  int64  `json:"fmtime_ns,omitempty"`
}

// unchanged reports whether st still describes the fork's copy of e.
func (e *Entry) unchanged(st *unix.Stat_t) bool {
	return e.Ino != 0 && st.Ino == e.Ino && st.Size == e.FSize && st.Mtim.Nano() == e.FMod && st.Ctim.Nano() == e.CTime
}

func (e *Entry) setStat(st *unix.Stat_t) {
	e.Ino, e.FSize, e.FMod, e.CTime = st.Ino, st.Size, st.Mtim.Nano(), st.Ctim.Nano()
}

// ReadRecord returns the record of the fork scope sc; a scope that is no
// fork answers not_found.
func ReadRecord(vol *store.Volume, sc store.Scope) (*Record, error) {
	f, err := openRecord(vol, sc)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return decodeRecord(f, sc)
}

// HeldRecord is a fork's record, read and kept open so that a merge or a
// status begun from it reads it no second time (a merge reads it again
// only when a new one replaced it while the merge waited for the locks).
// It serves one merge: a merge moves the record on.
type HeldRecord struct {
	*Record
	scope store.Scope
	f     *os.File
	read  time.Time // when reading it began: a merge's duration counts from there
}

// HoldRecord reads the record of the fork scope sc and keeps it open until
// Close; a scope that is no fork answers not_found.
func HoldRecord(vol *store.Volume, sc store.Scope) (*HeldRecord, error) {
	start := time.Now()
	f, err := openRecord(vol, sc)
	if err != nil {
		return nil, err
	}
	rec, err := decodeRecord(f, sc)
	if err != nil {
		f.Close()
		return nil, err
	}
	return &HeldRecord{Record: rec, scope: sc, f: f, read: start}, nil
}

// Close lets the record go.
func (h *HeldRecord) Close() error { return h.f.Close() }

// check refuses a fork scope that is not the one whose record h is.
func (h *HeldRecord) check(fork *store.Workspace) error {
	if fork.Scope() != h.scope {
		return policy.Errorf(policy.InvalidInput, "the fork record held is %s's, not %s's", h.scope, fork.Scope())
	}
	return nil
}

// openRecord opens the record of the fork scope sc; a scope that is no
// fork answers not_found.
func openRecord(vol *store.Volume, sc store.Scope) (*os.File, error) {
	dir, err := vol.ScopeState(sc)
	if err != nil {
		return nil, fmt.Errorf("open the state of %s: %w", sc, err)
	}
	defer dir.Close()
	fd, err := unix.Openat(int(dir.Fd()), RecordFile, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil, policy.Errorf(policy.NotFound, "scope %s is not a fork: fork it first (loomfs fork --from SCOPE --to %s)", sc, sc)
	}
	if err != nil {
		return nil, fmt.Errorf("open the fork record of %s: %w", sc, err)
	}
	return os.NewFile(uintptr(fd), RecordFile), nil
}

// decodeRecord reads the record of sc from f, from its start.
func decodeRecord(f *os.File, sc store.Scope) (*Record, error) {
	var r Record
	if err := json.NewDecoder(f).Decode(&r); err != nil {
		return nil, fmt.Errorf("the fork record of %s is damaged: %w", sc, err)
	}
	if r.Version != recordVersion {
		return nil, fmt.Errorf("the fork record of %s has version %d, this loomfs reads %d", sc, r.Version, recordVersion)
	}
	return &r, nil
}

// recordCurrent reports whether f, opened by openRecord, is the record of
// sc still. writeRecord never rewrites a record in place, it renames a new
// file over it; and f, held open, keeps its inode from being reused. So
// the same inode under the name is the same content, and a merge that
// read the record before waiting for the locks need not decode it again.
func recordCurrent(vol *store.Volume, sc store.Scope, f *os.File) (bool, error) {
	dir, err := vol.ScopeState(sc)
	if err != nil {
		return false, fmt.Errorf("open the state of %s: %w", sc, err)
	}
	defer dir.Close()
	var now, held unix.Stat_t
	if err := unix.Fstatat(int(dir.Fd()), RecordFile, &now, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, fmt.Errorf("stat the fork record of %s: %w", sc, err)
	}
	if err := unix.Fstat(int(f.Fd()), &held); err != nil {
		return false, fmt.Errorf("stat the fork record of %s: %w", sc, err)
	}
	return now.Ino == held.Ino && now.Dev == held.Dev, nil
}

// writeRecord replaces the record of scope sc atomically: a temporary file
// fsynced, renamed over the old one, the directory fsynced.
func writeRecord(vol *store.Volume, sc store.Scope, r *Record) error {
	dir, err := vol.ScopeState(sc)
	if err != nil {
		return fmt.Errorf("open the state of %s: %w", sc, err)
	}
	defer dir.Close()
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	tmp := fmt.Sprintf(".%s.%d.tmp", RecordFile, os.Getpid())
	fd, err := unix.Openat(int(dir.Fd()), tmp, unix.O_CREAT|unix.O_TRUNC|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("write the fork record of %s: %w", sc, err)
	}
	f := os.NewFile(uintptr(fd), tmp)
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(int(dir.Fd()), tmp, int(dir.Fd()), RecordFile)
	}
	if err != nil {
		unix.Unlinkat(int(dir.Fd()), tmp, 0)
		return fmt.Errorf("write the fork record of %s: %w", sc, err)
	}
	return dir.Sync()
}

// removeRecord removes the record of scope sc, if any.
func removeRecord(vol *store.Volume, sc store.Scope) error {
	dir, err := vol.ScopeState(sc)
	if err != nil {
		return err
	}
	defer dir.Close()
	if err := unix.Unlinkat(int(dir.Fd()), RecordFile, 0); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// noteFork records in src's state directory that dst was forked from it.
func noteFork(vol *store.Volume, src, dst store.Scope) error {
	dir, err := vol.ScopeState(src)
	if err != nil {
		return err
	}
	defer dir.Close()
	if err := unix.Mkdirat(int(dir.Fd()), ForksDir, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
		return err
	}
	b, err := json.Marshal(dst)
	if err != nil {
		return err
	}
	fd, err := unix.Openat(int(dir.Fd()), ForksDir+"/"+dst.Hash(), unix.O_CREAT|unix.O_TRUNC|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), dst.Hash())
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Forks lists the scopes forked from sc that are forks of it still (a
// scope forked again from elsewhere, or whose record is gone, is left
// out), in name order. Of each record it reads the head, as far as its
// source: a record damaged further on is listed, and a merge of it says
// so.
func Forks(vol *store.Volume, sc store.Scope) ([]store.Scope, error) {
	dir, err := vol.ScopeState(sc)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	fd, err := unix.Openat(int(dir.Fd()), ForksDir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list the forks of %s: %w", sc, err)
	}
	d := os.NewFile(uintptr(fd), ForksDir)
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("list the forks of %s: %w", sc, err)
	}
	sort.Strings(names)
	var out []store.Scope
	for _, n := range names {
		ffd, err := unix.Openat(fd, n, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		f := os.NewFile(uintptr(ffd), n)
		var s store.Scope
		err = json.NewDecoder(io.LimitReader(f, 4096)).Decode(&s)
		f.Close()
		if err != nil || s.Validate() != nil || s.Hash() != n {
			continue
		}
		if from, err := readFrom(vol, s); err == nil && from == sc {
			out = append(out, s)
		}
	}
	return out, nil
}

// readFrom reads the source scope of the fork scope sc's record: its
// version and from, the first fields writeRecord writes, and no further
// (its entries are most of it).
func readFrom(vol *store.Volume, sc store.Scope) (store.Scope, error) {
	f, err := openRecord(vol, sc)
	if err != nil {
		return store.Scope{}, err
	}
	defer f.Close()
	dec := json.NewDecoder(f)
	damaged := func(err error) (store.Scope, error) {
		return store.Scope{}, fmt.Errorf("the fork record of %s is damaged: %w", sc, err)
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return damaged(fmt.Errorf("no object at its start (%v)", err))
	}
	var from *store.Scope
	version := -1
	for dec.More() && (from == nil || version < 0) {
		key, err := dec.Token()
		if err != nil {
			return damaged(err)
		}
		switch key {
		case "version":
			err = dec.Decode(&version)
		case "from":
			from = new(store.Scope)
			err = dec.Decode(from)
		default:
			var skip json.RawMessage
			err = dec.Decode(&skip)
		}
		if err != nil {
			return damaged(err)
		}
	}
	if from == nil {
		return damaged(errors.New("no source named"))
	}
	if version != recordVersion {
		return store.Scope{}, fmt.Errorf("the fork record of %s has version %d, this loomfs reads %d", sc, version, recordVersion)
	}
	return *from, nil
}
