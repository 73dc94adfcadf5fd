package snapshot

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// The index remembers, for each file of the last snapshot, what lstat said
// of it and its sha256, so the next snapshot reads only files whose size,
// modification time, change time or inode differ. An entry is kept only
// if the file's change time is older than the snapshot's start as the
// volume's own clock tells it (a probe file's ctime): a file changed in
// the same clock tick as it was read could otherwise look unchanged.

const indexHeader = "loomfs-snapshot-index 1"

type indexEntry struct {
	size, mtime, ctime int64
	ino                uint64
	sha                string
}

type index map[string]indexEntry

func entryOf(st *unix.Stat_t, sha string) indexEntry {
	return indexEntry{size: st.Size, mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano(), ino: st.Ino, sha: sha}
}

// matches reports whether st is the file the entry describes, unchanged.
func (e indexEntry) matches(st *unix.Stat_t) bool {
	return e.size == st.Size && e.mtime == st.Mtim.Nano() && e.ctime == st.Ctim.Nano() && e.ino == st.Ino
}

// loadIndex reads the index; a missing or unreadable one is empty (every
// file is then read again). lines is how many entry lines the file holds,
// superseded ones included.
func (r *Repo) loadIndex() (idx index, lines int) {
	idx = index{}
	fd, err := unix.Openat(int(r.dir.Fd()), indexFile, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return idx, 0
	}
	f := os.NewFile(uintptr(fd), indexFile)
	defer f.Close()
	var st unix.Stat_t
	if unix.Fstat(fd, &st) == nil {
		idx = make(index, st.Size/100)
	}
	sc := bufio.NewScanner(bufio.NewReaderSize(f, 1<<16))
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	if !sc.Scan() || sc.Text() != indexHeader {
		return index{}, 0
	}
	for sc.Scan() {
		lines++
		line := sc.Text()
		// A later line overrides an earlier one; "D path" removes.
		if rest, ok := strings.CutPrefix(line, "D "); ok {
			path, err := unquotePath(rest)
			if err != nil {
				return index{}, 0
			}
			delete(idx, path)
			continue
		}
		// sha size mtime ctime ino path
		f := strings.SplitN(line, " ", 6)
		if len(f) != 6 || len(f[0]) != 64 {
			return index{}, 0
		}
		var e indexEntry
		var err1, err2, err3, err4 error
		e.sha = f[0]
		e.size, err1 = strconv.ParseInt(f[1], 10, 64)
		e.mtime, err2 = strconv.ParseInt(f[2], 10, 64)
		e.ctime, err3 = strconv.ParseInt(f[3], 10, 64)
		e.ino, err4 = strconv.ParseUint(f[4], 10, 64)
		path, err := unquotePath(f[5])
		if err != nil || err1 != nil || err2 != nil || err3 != nil || err4 != nil {
			return index{}, 0
		}
		idx[path] = e
	}
	if sc.Err() != nil {
		return index{}, 0
	}
	return idx, lines
}

// saveIndex records idx. When the index on disk is old (from loadIndex,
// with lines lines) and only a few entries differ, the differences are
// appended; otherwise the file is written anew. Not fsynced: a lost or
// torn index is refused whole by loadIndex and only makes the next
// snapshot read every file again.
func (r *Repo) saveIndex(idx, old index, lines int) error {
	if old != nil && lines > 0 {
		var b []byte
		n := 0
		for path, e := range idx {
			if o, ok := old[path]; !ok || o != e {
				b = appendIndexLine(b, path, e)
				n++
			}
		}
		for path := range old {
			if _, ok := idx[path]; !ok {
				b = append(b, "D "...)
				b = appendPath(b, path)
				b = append(b, '\n')
				n++
			}
		}
		if n == 0 {
			return nil
		}
		if n <= max(64, len(idx)/8) && lines+n <= 2*len(idx)+1024 {
			fd, err := unix.Openat(int(r.dir.Fd()), indexFile, unix.O_WRONLY|unix.O_APPEND|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err == nil {
				_, err = unix.Write(fd, b)
				unix.Close(fd)
				if err == nil {
					return nil
				}
			}
		}
	}
	return writeAtomic(r.dir, indexFile, false, func(w *bufio.Writer) error {
		fmt.Fprintln(w, indexHeader)
		var b []byte
		for path, e := range idx {
			b = appendIndexLine(b[:0], path, e)
			if _, err := w.Write(b); err != nil {
				return err
			}
		}
		return nil
	})
}

func appendIndexLine(b []byte, path string, e indexEntry) []byte {
	b = append(b, e.sha...)
	b = append(b, ' ')
	b = strconv.AppendInt(b, e.size, 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, e.mtime, 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, e.ctime, 10)
	b = append(b, ' ')
	b = strconv.AppendUint(b, e.ino, 10)
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
