package snapshot

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// The index is the scope as the last snapshot saw it: every entry with
// what lstat said of it and, for files, its sha256; the objects it skipped;
// its totals; and where it stopped reading the change journals
// (store/journal.go).
//
// A walk reads only files whose size, modification time, change time or
// inode differ from the index. A file changed in the same clock tick as it
// was read could look unchanged, so a file whose change time is not older
// than the snapshot's start (as the volume's own clock tells it: a probe
// file's ctime) is marked racy and read again by the next walk.
//
// A snapshot that trusts the journals does not walk: it looks up in the
// index only the paths the journals name and their directories, and
// appends what changed. So that costs what changed, not the size of the
// scope, the index is a base, in walk order, looked up by binary search
// without being parsed, followed by the changes of later snapshots:
//
//	loomfs-snapshot-index 3 BASELEN
//	PATH<TAB>K SHA SIZE MTIME CTIME INO PERM   BASELEN bytes of entries
//	- PATH                                    the entry and all beneath it go
//	+ PATH<TAB>K SHA SIZE MTIME CTIME INO PERM an entry is added or replaced
//	X JSON                                    the skipped objects (an array)
//	S ID FULL FILES DIRS BYTES DEPTH NAME=OFFSET…
//
// An S line commits what precedes it: the state after snapshot ID (DEPTH
// deltas above a full manifest), whose last full walk began at FULL (unix
// ns), with these totals and journal offsets. Lines after the last S line
// are what a snapshot that died was appending, and are ignored. K is f (a
// file), r (a racy file) or d (a directory, SHA "-"). When the changes have
// grown, the index is written anew as a base alone. It is not fsynced: a
// lost or damaged index only makes the next snapshot walk.

const indexMagic = "loomfs-snapshot-index 3 "

const (
	kindFile = 'f'
	kindRacy = 'r'
	kindDir  = 'd'
)

type indexEntry struct {
	kind               byte
	perm               uint32
	size, mtime, ctime int64
	ino                uint64
	sha                string
}

// named is an index entry and its path.
type named struct {
	path string
	indexEntry
}

// commit is what an S line says.
type commit struct {
	id           string // "" when the index describes no snapshot (walk)
	full         int64  // when the last full walk began, unix ns
	files, dirs  int
	bytes        int64
	depth        int              // deltas between snapshot id and a full manifest
	cursor       map[string]int64 // journal file → offset read
	skipped      []Skipped
	deltaEntries int // lines after the base, for the decision to rewrite
}

// state is a loaded index.
type state struct {
	commit
	base   string           // the base section
	starts []int            // where each base line starts
	over   map[string]named // entries added or replaced after the base
	gone   map[string]bool  // base subtrees removed after the base
	size   int64            // bytes up to the last S line
	torn   bool             // something follows the last S line
}

func entryOf(kind byte, info store.Info, sha string) indexEntry {
	st := &info.Stat
	return indexEntry{kind: kind, perm: info.Perm, size: st.Size, mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano(), ino: st.Ino, sha: sha}
}

// entry is the snapshot entry e describes at path.
func (e indexEntry) entry(path string) Entry {
	if e.kind == kindDir {
		return Entry{Path: path, Type: typeDir, Perm: e.perm, MTime: e.mtime}
	}
	typ := typeFile
	if e.perm&policy.LinkMarker != 0 {
		// A link is a file of the index whose mode has the marker.
		typ = typeLink
	}
	return Entry{Path: path, Type: typ, Size: e.size, Perm: e.perm, MTime: e.mtime, SHA256: e.sha}
}

// matches reports whether st is the file the entry describes, unchanged.
func (e indexEntry) matches(st *unix.Stat_t) bool {
	return e.kind == kindFile && e.size == st.Size && e.mtime == st.Mtim.Nano() && e.ctime == st.Ctim.Nano() && e.ino == st.Ino
}

// lookup finds path's entry.
func (s *state) lookup(path string) (indexEntry, bool) {
	if n, ok := s.over[path]; ok {
		return n.indexEntry, true
	}
	if s.removed(path) {
		return indexEntry{}, false
	}
	i, ok := s.search(path)
	if !ok {
		return indexEntry{}, false
	}
	n, _ := parseBaseLine(s.baseLine(i))
	return n.indexEntry, true
}

// removed reports whether a later change removed path from the base.
func (s *state) removed(path string) bool {
	return len(s.gone) > 0 && (s.gone[path] || underAny(path, s.gone))
}

// search finds path in the base: its line, or where it would be.
func (s *state) search(path string) (int, bool) {
	return slices.BinarySearchFunc(s.starts, path, func(start int, p string) int {
		return walkOrder(basePath(s.base[start:]), p)
	})
}

func (s *state) baseLine(i int) string {
	line := s.base[s.starts[i]:]
	return line[:strings.IndexByte(line, '\n')]
}

// under calls fn for every entry beneath dir (not dir itself).
func (s *state) under(dir string, fn func(n named)) {
	prefix := dir + "/"
	i, _ := s.search(dir)
	for ; i < len(s.starts); i++ {
		p := basePath(s.base[s.starts[i]:])
		if p == dir {
			continue
		}
		if !strings.HasPrefix(p, prefix) {
			break
		}
		if _, ok := s.over[p]; ok || s.removed(p) {
			continue
		}
		if n, ok := parseBaseLine(s.baseLine(i)); ok {
			fn(n)
		}
	}
	for p, n := range s.over {
		if strings.HasPrefix(p, prefix) {
			fn(n)
		}
	}
}

// all returns every entry, in walk order.
func (s *state) all() []named {
	out := make([]named, 0, len(s.starts)+len(s.over))
	for i := range s.starts {
		n, ok := parseBaseLine(s.baseLine(i))
		if !ok {
			continue
		}
		if _, ok := s.over[n.path]; ok || s.removed(n.path) {
			continue
		}
		out = append(out, n)
	}
	if len(s.over) == 0 {
		return out
	}
	for _, n := range s.over {
		out = append(out, n)
	}
	slices.SortFunc(out, func(a, b named) int { return walkOrder(a.path, b.path) })
	return out
}

// loadState reads the index; a missing or unreadable one is empty,
// describing no snapshot, so the next snapshot walks and reads every file.
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
	s, err := parseState(string(b))
	if err != nil {
		return empty
	}
	return s
}

// parseState reads an index: the base only as far as finding its lines,
// the changes after it in full.
func parseState(text string) (*state, error) {
	head, rest, ok := strings.Cut(text, "\n")
	n, err := strconv.Atoi(strings.TrimPrefix(head, indexMagic))
	if !ok || !strings.HasPrefix(head, indexMagic) || err != nil || n < 0 || n > len(rest) {
		return nil, fmt.Errorf("not an index")
	}
	s := &state{base: rest[:n], over: map[string]named{}, gone: map[string]bool{}}
	for i := 0; i < len(s.base); {
		j := strings.IndexByte(s.base[i:], '\n')
		if j < 0 {
			return nil, fmt.Errorf("torn index base")
		}
		s.starts = append(s.starts, i)
		i += j + 1
	}
	changes := rest[n:]
	last := strings.LastIndex(changes, "\nS ") + 1
	if last == 0 && !strings.HasPrefix(changes, "S ") {
		return nil, fmt.Errorf("index has no commit line")
	}
	end := strings.IndexByte(changes[last:], '\n')
	if end < 0 {
		return nil, fmt.Errorf("torn index commit")
	}
	end += last + 1
	s.size = int64(len(head) + 1 + n + end)
	s.torn = end < len(changes)
	for _, line := range strings.Split(changes[:end-1], "\n") {
		if err := s.apply(line); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// apply reads one line of the changes after the base.
func (s *state) apply(line string) error {
	bad := func() error { return fmt.Errorf("malformed index line %q", line) }
	if len(line) < 3 || line[1] != ' ' {
		return bad()
	}
	rest := line[2:]
	switch line[0] {
	case '+':
		n, ok := parseBaseLine(rest)
		if !ok {
			return bad()
		}
		s.over[n.path] = n
		s.deltaEntries++
	case '-':
		p, err := store.ParsePathLine(rest)
		if err != nil {
			return bad()
		}
		for k := range s.over {
			if k == p || strings.HasPrefix(k, p+"/") {
				delete(s.over, k)
			}
		}
		s.gone[p] = true
		s.deltaEntries++
	case 'X':
		s.skipped = nil
		if err := json.Unmarshal([]byte(rest), &s.skipped); err != nil {
			return bad()
		}
	case 'S':
		skipped, entries := s.skipped, s.deltaEntries
		c, err := parseCommit(rest)
		if err != nil {
			return bad()
		}
		s.commit = c
		s.skipped, s.deltaEntries = skipped, entries
	default:
		return bad()
	}
	return nil
}

func parseCommit(rest string) (commit, error) {
	var c commit
	f := strings.Fields(rest)
	if len(f) < 6 {
		return c, fmt.Errorf("short commit")
	}
	if c.id = f[0]; c.id == "-" {
		c.id = ""
	}
	var err [5]error
	c.full, err[0] = strconv.ParseInt(f[1], 10, 64)
	c.files, err[1] = strconv.Atoi(f[2])
	c.dirs, err[2] = strconv.Atoi(f[3])
	c.bytes, err[3] = strconv.ParseInt(f[4], 10, 64)
	c.depth, err[4] = strconv.Atoi(f[5])
	for _, e := range err {
		if e != nil {
			return c, e
		}
	}
	c.cursor = make(map[string]int64, len(f)-6)
	for _, kv := range f[6:] {
		name, off, ok := strings.Cut(kv, "=")
		n, err := strconv.ParseInt(off, 10, 64)
		if !ok || err != nil || n < 0 {
			return c, fmt.Errorf("bad cursor %q", kv)
		}
		c.cursor[name] = n
	}
	return c, nil
}

// basePath returns the path at the start of an entry line.
func basePath(line string) string {
	p := line[:strings.IndexByte(line, '\t')]
	if u, err := store.ParsePathLine(p); err == nil {
		return u
	}
	return p
}

// parseBaseLine reads "PATH<TAB>K SHA SIZE MTIME CTIME INO PERM".
func parseBaseLine(line string) (named, bool) {
	tab := strings.IndexByte(line, '\t')
	if tab <= 0 || len(line) < tab+3 || line[tab+2] != ' ' {
		return named{}, false
	}
	path, err := store.ParsePathLine(line[:tab])
	if err != nil {
		return named{}, false
	}
	n := named{path: path, indexEntry: indexEntry{kind: line[tab+1]}}
	if n.kind != kindFile && n.kind != kindRacy && n.kind != kindDir {
		return named{}, false
	}
	f := strings.Fields(line[tab+3:])
	if len(f) != 6 {
		return named{}, false
	}
	var ok [6]bool
	n.sha, ok[0] = f[0], true
	n.size, ok[1] = atoi(f[1])
	n.mtime, ok[2] = atoi(f[2])
	n.ctime, ok[3] = atoi(f[3])
	var ino int64
	ino, ok[4] = atoi(f[4])
	n.ino = uint64(ino)
	perm, err := strconv.ParseUint(f[5], 8, 32)
	n.perm, ok[5] = uint32(perm), err == nil
	if ok != [6]bool{true, true, true, true, true, true} {
		return named{}, false
	}
	switch {
	case n.kind == kindDir:
		n.sha = ""
	case len(n.sha) != 64:
		return named{}, false
	}
	return n, true
}

// atoi parses a decimal int64, possibly negative (times before 1970).
func atoi(s string) (int64, bool) {
	v, err := strconv.ParseInt(s, 10, 64)
	return v, err == nil
}

// saveState writes list (in walk order) as the index's base, with c.
func (r *Repo) saveState(list []named, c commit) error {
	var base []byte
	for _, n := range list {
		base = appendEntryLine(base, n)
	}
	return writeAtomic(r.dir, indexFile, false, false, func(w *bufio.Writer) error {
		fmt.Fprintf(w, "%s%d\n", indexMagic, len(base))
		w.Write(base)
		_, err := w.Write(appendCommit(nil, c))
		return err
	})
}

// appendState appends to the index s describes the removal of the
// subtrees at removed, then the entries upserts, and commit c, in one
// write.
func (r *Repo) appendState(s *state, removed []string, upserts []named, c commit) error {
	var b []byte
	for _, p := range removed {
		b = append(b, "- "...)
		b = store.AppendPathLine(b, p)
		b = append(b, '\n')
	}
	for _, n := range upserts {
		b = append(b, "+ "...)
		b = appendEntryLine(b, n)
	}
	b = appendCommit(b, c)
	fd, err := unix.Openat(int(r.dir.Fd()), indexFile, unix.O_WRONLY|unix.O_APPEND|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("index: %w", err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Size != s.size {
		return fmt.Errorf("index changed since it was read")
	}
	if _, err := unix.Write(fd, b); err != nil {
		return fmt.Errorf("index: %w", err)
	}
	return nil
}

func appendCommit(b []byte, c commit) []byte {
	sk, _ := json.Marshal(c.skipped)
	if c.skipped == nil {
		sk = []byte("[]")
	}
	b = append(b, "X "...)
	b = append(b, sk...)
	b = append(b, "\nS "...)
	if c.id == "" {
		b = append(b, '-')
	} else {
		b = append(b, c.id...)
	}
	for _, v := range []int64{c.full, int64(c.files), int64(c.dirs), c.bytes, int64(c.depth)} {
		b = append(b, ' ')
		b = strconv.AppendInt(b, v, 10)
	}
	for name, off := range c.cursor {
		b = append(b, ' ')
		b = append(b, name...)
		b = append(b, '=')
		b = strconv.AppendInt(b, off, 10)
	}
	return append(b, '\n')
}

func appendEntryLine(b []byte, n named) []byte {
	b = store.AppendPathLine(b, n.path)
	b = append(b, '\t', n.kind, ' ')
	if n.sha == "" {
		b = append(b, '-')
	} else {
		b = append(b, n.sha...)
	}
	b = append(b, ' ')
	b = strconv.AppendInt(b, n.size, 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, n.mtime, 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, n.ctime, 10)
	b = append(b, ' ')
	b = strconv.AppendUint(b, n.ino, 10)
	b = append(b, ' ')
	b = strconv.AppendUint(b, uint64(n.perm), 8)
	return append(b, '\n')
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
