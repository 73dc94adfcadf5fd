package fork

import (
	"bufio"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/snapshot"
	"github.com/agentloom/loomfs/store"
)

// RecordFile is a fork's record in its scope's state directory (named for
// its first format, JSON, which its head still is).
const RecordFile = "fork.json"

// ForksDir, in a source scope's state directory, names the scopes forked
// from it: one file per fork, named by its scope hash, holding its scope.
const ForksDir = "forks"

// A record is written in format recordVersion: a line of JSON, the head
// (recordHead), then a line an entry (appendEntry). The entries are most
// of it (11,478 for Go's src), and encoding/json took a quarter of a
// merge to read them back and write them again. A record of format
// jsonRecordVersion, all one JSON object, is still read; a merge writes
// it again in the new one.
const (
	recordVersion     = 2
	jsonRecordVersion = 1
)

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

// recordHead is a record's first line: the record with the number of its
// entries in place of them (this Entries hides the Record's from JSON). In
// a record of the JSON format the head is all of it, the entries too.
type recordHead struct {
	Record
	Entries json.RawMessage `json:"entries"`
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

// index maps each entry's path to its place in r.Entries.
func (r *Record) index() map[string]int {
	m := make(map[string]int, len(r.Entries))
	for i := range r.Entries {
		m[r.Entries[i].Path] = i
	}
	return m
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
	// Read into the string the entries' strings will share: a copy of 2
	// MB, in a process just started, costs as much as parsing it.
	var data strings.Builder
	if st, err := f.Stat(); err == nil {
		data.Grow(int(st.Size()))
	}
	if _, err := io.Copy(&data, f); err != nil {
		return nil, fmt.Errorf("read the fork record of %s: %w", sc, err)
	}
	damaged := func(err error) (*Record, error) {
		return nil, fmt.Errorf("the fork record of %s is damaged: %w", sc, err)
	}
	head, body, _ := strings.Cut(data.String(), "\n")
	var h recordHead
	if err := json.Unmarshal([]byte(head), &h); err != nil {
		return damaged(err)
	}
	r := h.Record
	switch r.Version {
	case jsonRecordVersion:
		if len(h.Entries) > 0 {
			if err := json.Unmarshal(h.Entries, &r.Entries); err != nil {
				return damaged(err)
			}
		}
		return &r, nil
	case recordVersion:
	default:
		return nil, fmt.Errorf("the fork record of %s has version %d, this loomfs reads %d and %d", sc, r.Version, jsonRecordVersion, recordVersion)
	}
	var n int
	if err := json.Unmarshal(h.Entries, &n); err != nil || n < 0 || n > len(body) {
		return damaged(fmt.Errorf("its head counts %s entries in %d bytes", h.Entries, len(body)))
	}
	r.Entries = make([]Entry, 0, n)
	for rest := body; rest != ""; {
		line, after, ok := strings.Cut(rest, "\n")
		if !ok {
			return damaged(fmt.Errorf("entry %d is cut short", len(r.Entries)+1))
		}
		rest = after
		e, err := parseEntry(line)
		if err != nil {
			return damaged(fmt.Errorf("entry %d: %w", len(r.Entries)+1, err))
		}
		r.Entries = append(r.Entries, e)
	}
	if len(r.Entries) != n {
		return damaged(fmt.Errorf("it holds %d entries, its head counts %d", len(r.Entries), n))
	}
	return &r, nil
}

// encodeRecord writes r to w as writeRecord writes it: the head, then the
// entries.
func encodeRecord(w io.Writer, r *Record) error {
	h := recordHead{Record: *r, Entries: strconv.AppendInt(nil, int64(len(r.Entries)), 10)}
	h.Version = recordVersion
	b, err := json.Marshal(h)
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(w, 64<<10)
	bw.Write(b)
	bw.WriteByte('\n')
	for i := range r.Entries {
		b = appendEntry(b[:0], &r.Entries[i])
		bw.Write(b)
	}
	return bw.Flush() // the first error of any write
}

// appendEntry appends e's line: its type, permission bits (octal), size,
// modification time and sha256 ("-" for none), then the fork copy's
// inode, change time, size and modification time, each followed by a
// space, and last its path, quoted as Go quotes a string, so that any byte
// a name holds reads back.
func appendEntry(b []byte, e *Entry) []byte {
	b = append(b, e.Type...)
	b = append(b, ' ')
	b = strconv.AppendUint(b, uint64(e.Perm), 8)
	b = append(b, ' ')
	b = strconv.AppendInt(b, e.Size, 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, e.MTime, 10)
	b = append(b, ' ')
	if e.SHA256 == "" {
		b = append(b, '-')
	}
	b = append(b, e.SHA256...)
	b = append(b, ' ')
	b = strconv.AppendUint(b, e.Ino, 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, e.CTime, 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, e.FSize, 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, e.FMod, 10)
	b = append(b, ' ')
	b = strconv.AppendQuote(b, e.Path)
	return append(b, '\n')
}

// parseEntry reads a line appendEntry wrote, without its newline.
func parseEntry(line string) (Entry, error) {
	var err error // the first field that does not read
	field := func() string {
		f, rest, _ := strings.Cut(line, " ")
		line = rest
		return f
	}
	unsigned := func(base, bits int) uint64 {
		n, ferr := strconv.ParseUint(field(), base, bits)
		err = cmp.Or(err, ferr)
		return n
	}
	signed := func() int64 {
		n, ferr := strconv.ParseInt(field(), 10, 64)
		err = cmp.Or(err, ferr)
		return n
	}
	var e Entry
	e.Type = field()
	e.Perm = uint32(unsigned(8, 32))
	e.Size = signed()
	e.MTime = signed()
	if e.SHA256 = field(); e.SHA256 == "-" {
		e.SHA256 = ""
	}
	e.Ino = unsigned(10, 64)
	e.CTime = signed()
	e.FSize = signed()
	e.FMod = signed()
	if err != nil {
		return Entry{}, err
	}
	if e.Path, err = strconv.Unquote(line); err != nil {
		return Entry{}, fmt.Errorf("path %.40s: %w", line, err)
	}
	return e, nil
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
	s, err := stageRecord(vol, sc, r)
	if err != nil {
		return err
	}
	return s.commit()
}

// stagedRecord is a record written and fsynced under a temporary name in
// its scope's state directory, not yet in place: a merge writes the
// fork's next record while its change set is applied, and puts it in
// place only once the change set is.
type stagedRecord struct {
	sc  store.Scope
	dir *os.File
	tmp string
}

// stageRecord writes r, fsynced, beside the record of scope sc; commit or
// discard must follow.
func stageRecord(vol *store.Volume, sc store.Scope, r *Record) (*stagedRecord, error) {
	dir, err := vol.ScopeState(sc)
	if err != nil {
		return nil, fmt.Errorf("open the state of %s: %w", sc, err)
	}
	tmp := fmt.Sprintf(".%s.%d.tmp", RecordFile, os.Getpid())
	fd, err := unix.Openat(int(dir.Fd()), tmp, unix.O_CREAT|unix.O_TRUNC|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		dir.Close()
		return nil, fmt.Errorf("write the fork record of %s: %w", sc, err)
	}
	f := os.NewFile(uintptr(fd), tmp)
	err = encodeRecord(f, r)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	s := &stagedRecord{sc: sc, dir: dir, tmp: tmp}
	if err != nil {
		s.discard()
		return nil, fmt.Errorf("write the fork record of %s: %w", sc, err)
	}
	return s, nil
}

// commit renames the staged record over the scope's and fsyncs the
// directory, so the new record is durable when it returns.
func (s *stagedRecord) commit() error {
	defer s.dir.Close()
	if err := unix.Renameat(int(s.dir.Fd()), s.tmp, int(s.dir.Fd()), RecordFile); err != nil {
		unix.Unlinkat(int(s.dir.Fd()), s.tmp, 0)
		return fmt.Errorf("write the fork record of %s: %w", s.sc, err)
	}
	if err := s.dir.Sync(); err != nil {
		return fmt.Errorf("write the fork record of %s: %w", s.sc, err)
	}
	return nil
}

// discard removes the staged record; the scope's stays as it was.
func (s *stagedRecord) discard() {
	unix.Unlinkat(int(s.dir.Fd()), s.tmp, 0)
	s.dir.Close()
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
// version and from, the first fields of its head in either format, and no
// further (its entries are most of it).
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
	if version != recordVersion && version != jsonRecordVersion {
		return store.Scope{}, fmt.Errorf("the fork record of %s has version %d, this loomfs reads %d and %d", sc, version, jsonRecordVersion, recordVersion)
	}
	return *from, nil
}
