package snapshot

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/store"
)

// The index is the scope as the last snapshot saw it: every entry with
// what lstat said of it and, for files, its sha256; the objects it skipped;
// and where it stopped reading the change journals (store/journal.go).
//
// A walk reads only files whose size, modification time, change time or
// inode differ from the index. A file changed in the same clock tick as it
// was read could look unchanged, so a file whose change time is not older
// than the snapshot's start (as the volume's own clock tells it: a probe
// file's ctime) is marked racy and read again by the next walk.
//
// A snapshot that trusts the journals does not walk: it takes the index,
// looks again at the paths the journals name since its cursor, and is
// done. The index is then the previous snapshot's entries, so it must
// describe exactly what that snapshot recorded.
//
// On disk it is a text file in walk order, written anew (not fsynced) by
// each snapshot, so it is read back in order with no sorting or map:
//
//	loomfs-snapshot-index 2
//	K SHA SIZE MTIME CTIME INO PERM PATH   one entry per line, K below
//	S ID FULL NAME=OFFSET…                 last: the snapshot it describes,
//	                                       when its last full walk began
//	                                       (unix ns), the journal offsets
//
// K is f (a file), r (a racy file), d (a directory, SHA "-") or x (an
// object skipped, SHA its reason). A lost or damaged index only makes the
// next snapshot walk and read every file.

const indexHeader = "loomfs-snapshot-index 2"

const (
	kindFile    = 'f'
	kindRacy    = 'r'
	kindDir     = 'd'
	kindSkipped = 'x'
)

type indexEntry struct {
	kind               byte
	perm               uint32
	size, mtime, ctime int64
	ino                uint64
	sha                string // or the reason of a skipped entry
}

// named is an index entry and its path.
type named struct {
	path string
	indexEntry
}

// state is the index: entries in walk order, and its commit line.
type state struct {
	list   []named
	base   string           // the snapshot it describes; "" when none (walk)
	full   int64            // when the last full walk began, unix ns
	cursor map[string]int64 // journal file → offset read
}

// lookup finds path's entry.
func (s *state) lookup(path string) (indexEntry, bool) {
	i, ok := slices.BinarySearchFunc(s.list, path, func(n named, p string) int { return walkOrder(n.path, p) })
	if !ok {
		return indexEntry{}, false
	}
	return s.list[i].indexEntry, true
}

func entryOf(kind byte, info store.Info, sha string) indexEntry {
	st := &info.Stat
	return indexEntry{kind: kind, perm: info.Perm, size: st.Size, mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano(), ino: st.Ino, sha: sha}
}

// entry is the snapshot entry e describes at path (a file or directory).
func (e indexEntry) entry(path string) Entry {
	if e.kind == kindDir {
		return Entry{Path: path, Type: typeDir, Perm: e.perm, MTime: e.mtime}
	}
	return Entry{Path: path, Type: typeFile, Size: e.size, Perm: e.perm, MTime: e.mtime, SHA256: e.sha}
}

// matches reports whether st is the file the entry describes, unchanged.
func (e indexEntry) matches(st *unix.Stat_t) bool {
	return e.kind == kindFile && e.size == st.Size && e.mtime == st.Mtim.Nano() && e.ctime == st.Ctim.Nano() && e.ino == st.Ino
}

// loadState reads the index; a missing or unreadable one is empty, with
// no base, so the next snapshot walks and reads every file.
func (r *Repo) loadState() *state {
	empty := &state{}
	fd, err := unix.Openat(int(r.dir.Fd()), indexFile, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return empty
	}
	f := os.NewFile(uintptr(fd), indexFile)
	defer f.Close()
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Size > 1<<30 {
		return empty
	}
	b := make([]byte, st.Size)
	if _, err := io.ReadFull(f, b); err != nil {
		return empty
	}
	s, err := parseState(b)
	if err != nil {
		return empty
	}
	return s
}

// parseState reads an index. Paths and hashes are cut from one string
// holding the whole file, so an entry costs no allocation of its own.
func parseState(b []byte) (*state, error) {
	text := string(b)
	head, text, ok := strings.Cut(text, "\n")
	if !ok || head != indexHeader {
		return nil, fmt.Errorf("not an index")
	}
	s := &state{list: make([]named, 0, len(text)/110)}
	for text != "" {
		i := strings.IndexByte(text, '\n')
		if i < 0 {
			return nil, fmt.Errorf("torn index")
		}
		line := text[:i]
		text = text[i+1:]
		if strings.HasPrefix(line, "S ") {
			if text != "" {
				return nil, fmt.Errorf("index goes on after its commit line")
			}
			return s, s.commit(line[2:])
		}
		n, err := parseEntry(line)
		if err != nil {
			return nil, err
		}
		if k := len(s.list); k > 0 && walkOrder(s.list[k-1].path, n.path) >= 0 {
			return nil, fmt.Errorf("index out of order at %q", n.path)
		}
		s.list = append(s.list, n)
	}
	return nil, fmt.Errorf("index has no commit line")
}

func (s *state) commit(rest string) error {
	f := strings.Fields(rest)
	if len(f) < 2 {
		return fmt.Errorf("malformed index commit %q", rest)
	}
	if s.base = f[0]; s.base == "-" {
		s.base = ""
	}
	full, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return fmt.Errorf("malformed index commit %q", rest)
	}
	s.full = full
	s.cursor = make(map[string]int64, len(f)-2)
	for _, c := range f[2:] {
		name, off, ok := strings.Cut(c, "=")
		n, err := strconv.ParseInt(off, 10, 64)
		if !ok || err != nil || n < 0 {
			return fmt.Errorf("malformed index commit %q", rest)
		}
		s.cursor[name] = n
	}
	return nil
}

func parseEntry(line string) (named, error) {
	n, ok := parseEntryLine(line)
	if !ok {
		return named{}, fmt.Errorf("malformed index line %q", line)
	}
	return n, nil
}

func parseEntryLine(line string) (named, bool) {
	if len(line) < 3 || line[1] != ' ' {
		return named{}, false
	}
	n := named{indexEntry: indexEntry{kind: line[0]}}
	switch n.kind {
	case kindFile, kindRacy, kindDir, kindSkipped:
	default:
		return named{}, false
	}
	rest := line[2:]
	var fields [6]string
	for i := range fields {
		j := strings.IndexByte(rest, ' ')
		if j < 0 {
			return named{}, false
		}
		fields[i], rest = rest[:j], rest[j+1:]
	}
	var ok [5]bool
	var perm uint64
	n.sha = fields[0]
	n.size, ok[0] = atoi(fields[1])
	n.mtime, ok[1] = atoi(fields[2])
	n.ctime, ok[2] = atoi(fields[3])
	ino, ok3 := atoi(fields[4])
	n.ino, ok[3] = uint64(ino), ok3
	perm, err := strconv.ParseUint(fields[5], 8, 32)
	n.perm, ok[4] = uint32(perm), err == nil
	if ok != [5]bool{true, true, true, true, true} {
		return named{}, false
	}
	if n.kind == kindDir {
		n.sha = ""
	} else if (n.kind == kindFile || n.kind == kindRacy) && len(n.sha) != 64 {
		return named{}, false
	}
	path, err := unquotePath(rest)
	if err != nil || path == "" {
		return named{}, false
	}
	n.path = path
	return n, true
}

// atoi parses a decimal int64, possibly negative (times before 1970),
// without the allocation strconv would make for a substring.
func atoi(s string) (int64, bool) {
	d := strings.TrimPrefix(s, "-")
	if d == "" || len(d) > 18 {
		v, err := strconv.ParseInt(s, 10, 64)
		return v, err == nil
	}
	var v int64
	for i := 0; i < len(d); i++ {
		c := d[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int64(c-'0')
	}
	if len(d) < len(s) {
		v = -v
	}
	return v, true
}

// saveState writes s as the index.
func (r *Repo) saveState(s *state) error {
	return writeAtomic(r.dir, indexFile, false, func(w *bufio.Writer) error {
		w.WriteString(indexHeader)
		w.WriteByte('\n')
		var b []byte
		for _, n := range s.list {
			b = appendIndexLine(b[:0], n.path, n.indexEntry)
			if _, err := w.Write(b); err != nil {
				return err
			}
		}
		_, err := w.Write(appendCommit(b[:0], s))
		return err
	})
}

func appendCommit(b []byte, s *state) []byte {
	b = append(b, "S "...)
	if s.base == "" {
		b = append(b, '-')
	} else {
		b = append(b, s.base...)
	}
	b = append(b, ' ')
	b = strconv.AppendInt(b, s.full, 10)
	for name, off := range s.cursor {
		b = append(b, ' ')
		b = append(b, name...)
		b = append(b, '=')
		b = strconv.AppendInt(b, off, 10)
	}
	return append(b, '\n')
}

func appendIndexLine(b []byte, path string, e indexEntry) []byte {
	b = append(b, e.kind, ' ')
	if e.sha == "" {
		b = append(b, '-')
	} else {
		b = append(b, e.sha...)
	}
	b = append(b, ' ')
	b = strconv.AppendInt(b, e.size, 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, e.mtime, 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, e.ctime, 10)
	b = append(b, ' ')
	b = strconv.AppendUint(b, e.ino, 10)
	b = append(b, ' ')
	b = strconv.AppendUint(b, uint64(e.perm), 8)
	b = append(b, ' ')
	b = appendPath(b, path)
	return append(b, '\n')
}

// appendPath writes a path as is, or quoted when it starts with a quote
// or holds a byte a line can't carry.
func appendPath(b []byte, path string) []byte {
	for i := 0; i < len(path); i++ {
		if c := path[i]; c < 0x20 || c == 0x7f || (i == 0 && c == '"') {
			return strconv.AppendQuote(b, path)
		}
	}
	return append(b, path...)
}

func unquotePath(s string) (string, error) {
	if strings.HasPrefix(s, `"`) {
		return strconv.Unquote(s)
	}
	return s, nil
}

// fsNow returns the volume's clock now, as the change time of a probe
// file written in the snapshot directory.
func (r *Repo) fsNow() (int64, error) {
	name := tmpName()
	fd, err := unix.Openat(int(r.dir.Fd()), name, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return 0, fmt.Errorf("clock probe: %w", err)
	}
	defer unix.Unlinkat(int(r.dir.Fd()), name, 0)
	defer unix.Close(fd)
	if _, err := unix.Write(fd, []byte{'\n'}); err != nil {
		return 0, fmt.Errorf("clock probe: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, fmt.Errorf("clock probe: %w", err)
	}
	return st.Ctim.Nano(), nil
}
