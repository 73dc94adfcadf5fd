package fork

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

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
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("read the fork record of %s: %w", sc, err)
	}
	r, ok := parseRecord(b)
	if !ok {
		r = &Record{}
		if err := json.NewDecoder(bytes.NewReader(b)).Decode(r); err != nil {
			return nil, fmt.Errorf("the fork record of %s is damaged: %w", sc, err)
		}
	}
	if r.Version != recordVersion {
		return nil, fmt.Errorf("the fork record of %s has version %d, this loomfs reads %d", sc, r.Version, recordVersion)
	}
	return r, nil
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
	b, err := encodeRecord(r)
	if err != nil {
		return fmt.Errorf("encode the fork record of %s: %w", sc, err)
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
// out), in name order.
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
		if rec, err := ReadRecord(vol, s); err == nil && rec.From == sc {
			out = append(out, s)
		}
	}
	return out, nil
}

// recordHead is a record without its entries, which encodeRecord writes
// by hand after it.
type recordHead struct {
	Version  int                `json:"version"`
	From     store.Scope        `json:"from"`
	Snapshot string             `json:"snapshot"`
	Created  time.Time          `json:"created"`
	Clone    string             `json:"clone"`
	Skipped  []snapshot.Skipped `json:"skipped,omitempty"`
}

// encodeRecord is r as JSON, its entries last and one a line. A record
// holds an entry for each path of the scope, is written by every fork and
// merge and read by every merge and status: encoding/json's reflection
// was most of what that cost, so the entries are written (and read, by
// parseRecord) by hand, as the JSON encoding/json reads and writes.
func encodeRecord(r *Record) ([]byte, error) {
	head, err := json.Marshal(recordHead{Version: r.Version, From: r.From, Snapshot: r.Snapshot, Created: r.Created, Clone: r.Clone, Skipped: r.Skipped})
	if err != nil {
		return nil, err
	}
	b := make([]byte, 0, len(head)+len(r.Entries)*260+16)
	b = append(b, head[:len(head)-1]...) // without its closing brace
	b = append(b, `,"entries":[`...)
	for i := range r.Entries {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '\n')
		b = appendEntry(b, &r.Entries[i])
	}
	return append(b, "]}\n"...), nil
}

// appendEntry appends e as encoding/json would write it.
func appendEntry(b []byte, e *Entry) []byte {
	b = append(b, `{"path":`...)
	b = appendString(b, e.Path)
	b = append(b, `,"type":`...)
	b = appendString(b, e.Type)
	b = appendInt(b, `,"size":`, e.Size, true)
	b = append(b, `,"perm":`...)
	b = strconv.AppendUint(b, uint64(e.Perm), 10)
	b = appendInt(b, `,"mtime_ns":`, e.MTime, false)
	if e.SHA256 != "" {
		b = append(b, `,"sha256":`...)
		b = appendString(b, e.SHA256)
	}
	if e.Ino != 0 {
		b = append(b, `,"ino":`...)
		b = strconv.AppendUint(b, e.Ino, 10)
	}
	b = appendInt(b, `,"ctime_ns":`, e.CTime, true)
	b = appendInt(b, `,"fsize":`, e.FSize, true)
	b = appendInt(b, `,"fmtime_ns":`, e.FMod, true)
	return append(b, '}')
}

// appendInt appends the key and n, unless n is 0 and the key omits it.
func appendInt(b []byte, key string, n int64, omitEmpty bool) []byte {
	if n == 0 && omitEmpty {
		return b
	}
	return strconv.AppendInt(append(b, key...), n, 10)
}

// appendString appends s as a JSON string; encoding/json quotes one that
// needs escapes.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= 0x80 || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// parseRecord reads a record from b as encoding/json would, for the JSON
// encodeRecord writes and any other object of a record's fields; ok is
// false where it is not sure to (a string with escapes in an odd place, a
// number that is no integer, bad syntax), and decodeRecord then leaves b
// to encoding/json.
func parseRecord(b []byte) (r *Record, ok bool) {
	p := &parser{b: b}
	r = &Record{}
	if !p.byte('{') {
		return nil, false
	}
	for first := true; ; first = false {
		if p.byte('}') {
			break
		}
		if !first && !p.byte(',') {
			return nil, false
		}
		key, ok := p.key()
		if !ok {
			return nil, false
		}
		switch key {
		case "version":
			n, ok := p.int(strconv.IntSize)
			if !ok {
				return nil, false
			}
			r.Version = int(n)
		case "snapshot":
			r.Snapshot, ok = p.string()
		case "clone":
			r.Clone, ok = p.string()
		case "from":
			ok = p.json(&r.From)
		case "created":
			ok = p.json(&r.Created)
		case "skipped":
			ok = p.json(&r.Skipped)
		case "entries":
			r.Entries, ok = p.entries()
		default:
			ok = p.unknown(key, recordKeys)
		}
		if !ok {
			return nil, false
		}
	}
	return r, true
}

// parser reads JSON from b at i; its methods skip white space first and
// report false on anything they don't read exactly as encoding/json.
type parser struct {
	b []byte
	i int
}

func (p *parser) space() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\n', '\t', '\r':
			p.i++
		default:
			return
		}
	}
}

// byte reads c, if it is next.
func (p *parser) byte(c byte) bool {
	p.space()
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// key reads an object's key and its colon.
func (p *parser) key() (string, bool) {
	k, ok := p.string()
	return k, ok && p.byte(':')
}

// string reads a string; one with escapes, control characters or bytes
// that are not UTF-8 is unquoted by encoding/json.
func (p *parser) string() (string, bool) {
	p.space()
	if p.i >= len(p.b) || p.b[p.i] != '"' {
		return "", false
	}
	start, plain := p.i, true
	for p.i++; p.i < len(p.b); p.i++ {
		switch c := p.b[p.i]; {
		case c == '"':
			p.i++
			raw := p.b[start+1 : p.i-1]
			switch {
			case !plain || !utf8.Valid(raw):
			case string(raw) == "file":
				return "file", true // an entry's type: not a copy each
			case string(raw) == "dir":
				return "dir", true
			default:
				return string(raw), true
			}
			var s string
			err := json.Unmarshal(p.b[start:p.i], &s)
			return s, err == nil
		case c == '\\':
			plain = false
			p.i++
		case c < 0x20:
			return "", false
		}
	}
	return "", false
}

// int reads an integer of bits bits.
func (p *parser) int(bits int) (int64, bool) {
	neg, n, ok := p.number()
	switch {
	case !ok:
		return 0, false
	case neg && n <= 1<<(bits-1):
		return -int64(n), true
	case !neg && n < 1<<(bits-1):
		return int64(n), true
	}
	return 0, false
}

// uint reads an unsigned integer of bits bits.
func (p *parser) uint(bits int) (uint64, bool) {
	neg, n, ok := p.number()
	if !ok || neg || bits < 64 && n >= 1<<bits {
		return 0, false
	}
	return n, true
}

// number reads an integer as its sign and magnitude, without a copy of
// its digits (a record has six numbers an entry). JSON has no empty
// number and no leading zero, and a fraction or exponent is no integer.
func (p *parser) number() (neg bool, n uint64, ok bool) {
	p.space()
	if p.i < len(p.b) && p.b[p.i] == '-' {
		neg = true
		p.i++
	}
	start := p.i
	for ; p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9'; p.i++ {
		d := uint64(p.b[p.i] - '0')
		if n > (math.MaxUint64-d)/10 {
			return false, 0, false
		}
		n = n*10 + d
	}
	digits := p.i - start
	if digits == 0 || digits > 1 && p.b[start] == '0' || p.i < len(p.b) && (p.b[p.i] == '.' || p.b[p.i] == 'e' || p.b[p.i] == 'E') {
		return false, 0, false
	}
	return neg, n, true
}

// skip reads any value and returns it.
func (p *parser) skip() ([]byte, bool) {
	p.space()
	start, depth := p.i, 0
	for p.i < len(p.b) {
		switch c := p.b[p.i]; c {
		case '"':
			if _, ok := p.string(); !ok {
				return nil, false
			}
			if depth == 0 {
				return p.b[start:p.i], true
			}
			continue
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return p.b[start:p.i], p.i > start
			}
			depth--
			if depth == 0 {
				p.i++
				return p.b[start:p.i], true
			}
		case ',':
			if depth == 0 {
				return p.b[start:p.i], p.i > start
			}
		}
		p.i++
	}
	return nil, false
}

// The keys of a record and of an entry, which encoding/json would also
// take in another case.
var (
	recordKeys = []string{"version", "from", "snapshot", "created", "clone", "skipped", "entries"}
	entryKeys  = []string{"path", "type", "size", "perm", "mtime_ns", "sha256", "ino", "ctime_ns", "fsize", "fmtime_ns"}
)

// unknown reads the value of a key that is none of known, as encoding/json
// ignores it: it must be valid JSON, and the key no known one in another
// case (encoding/json would take it as that one).
func (p *parser) unknown(key string, known []string) bool {
	for _, k := range known {
		if strings.EqualFold(key, k) {
			return false
		}
	}
	raw, ok := p.skip()
	return ok && json.Valid(raw)
}

// json reads a value into v by encoding/json.
func (p *parser) json(v any) bool {
	raw, ok := p.skip()
	return ok && json.Unmarshal(raw, v) == nil
}

// entries reads the array of a record's entries.
func (p *parser) entries() ([]Entry, bool) {
	if !p.byte('[') {
		return nil, false
	}
	out := make([]Entry, 0, len(p.b)/260+1)
	for first := true; ; first = false {
		if p.byte(']') {
			return out, true
		}
		if !first && !p.byte(',') {
			return nil, false
		}
		var e Entry
		if !p.entry(&e) {
			return nil, false
		}
		out = append(out, e)
	}
}

// entry reads one entry's object into e.
func (p *parser) entry(e *Entry) bool {
	if !p.byte('{') {
		return false
	}
	for first := true; ; first = false {
		if p.byte('}') {
			return true
		}
		if !first && !p.byte(',') {
			return false
		}
		key, ok := p.key()
		if !ok {
			return false
		}
		var u uint64
		switch key {
		case "path":
			e.Path, ok = p.string()
		case "type":
			e.Type, ok = p.string()
		case "sha256":
			e.SHA256, ok = p.string()
		case "size":
			e.Size, ok = p.int(64)
		case "mtime_ns":
			e.MTime, ok = p.int(64)
		case "ctime_ns":
			e.CTime, ok = p.int(64)
		case "fsize":
			e.FSize, ok = p.int(64)
		case "fmtime_ns":
			e.FMod, ok = p.int(64)
		case "perm":
			u, ok = p.uint(32)
			e.Perm = uint32(u)
		case "ino":
			e.Ino, ok = p.uint(64)
		default:
			ok = p.unknown(key, entryKeys)
		}
		if !ok {
			return false
		}
	}
}
