package fork

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/snapshot"
	"github.com/agentloom/loomfs/store"
)

// TestRecordCurrent checks what lets a merge decode its record once: a
// record held open is current until a new one is written over it (or it
// is removed), and the one read then is the new one.
func TestRecordCurrent(t *testing.T) {
	vol, err := store.OpenVolume(context.Background(), store.Config{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer vol.Close()
	sc := store.Scope{Space: "sp", Agent: "ag", Session: "se", Run: "r1", Instance: "a"}
	from := store.Scope{Space: "sp", Agent: "ag", Session: "se"}
	if err := writeRecord(vol, sc, &Record{Version: recordVersion, From: from, Snapshot: "one"}); err != nil {
		t.Fatal(err)
	}
	f, err := openRecord(vol, sc)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if rec, err := decodeRecord(f, sc); err != nil || rec.Snapshot != "one" {
		t.Fatalf("record %+v, %v; want snapshot one", rec, err)
	}
	if ok, err := recordCurrent(vol, sc, f); err != nil || !ok {
		t.Fatalf("current %v, %v; want true before any change", ok, err)
	}
	if err := writeRecord(vol, sc, &Record{Version: recordVersion, From: from, Snapshot: "two"}); err != nil {
		t.Fatal(err)
	}
	if ok, err := recordCurrent(vol, sc, f); err != nil || ok {
		t.Fatalf("current %v, %v; want false after a new record", ok, err)
	}
	if rec, err := ReadRecord(vol, sc); err != nil || rec.Snapshot != "two" {
		t.Fatalf("record %+v, %v; want snapshot two", rec, err)
	}
	g, err := openRecord(vol, sc)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := removeRecord(vol, sc); err != nil {
		t.Fatal(err)
	}
	if ok, err := recordCurrent(vol, sc, g); err != nil || ok {
		t.Fatalf("current %v, %v; want false once removed", ok, err)
	}
}

// TestForks checks the list of a scope's forks, which reads of each record
// its head alone: a fork whose record names the scope is listed, even when
// the record is damaged past its source (a merge of it says so); one
// forked from elsewhere since, with no record, with a head that does not
// read or of another version is not.
func TestForks(t *testing.T) {
	vol, err := store.OpenVolume(context.Background(), store.Config{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer vol.Close()
	main := store.Scope{Space: "sp", Agent: "ag", Session: "se"}
	other := store.Scope{Space: "sp", Agent: "ag", Session: "other"}
	head := `{"version":1,"from":{"space":"sp","agent":"ag","session":"se"},"snapshot":"s"`
	cases := []struct {
		name   string
		record string // "" none; else the record's content
		listed bool
	}{
		{"a record naming the scope", "valid", true},
		{"forked from elsewhere since", "other", false},
		{"no record", "", false},
		{"a head that does not read", `{"version":1,"from":{"space":`, false},
		{"not an object", `[1]`, false},
		{"another version", strings.Replace(head, `"version":1`, `"version":3`, 1) + `,"entries":[]}`, false},
		{"a head of the line format", strings.Replace(head, `"version":1`, `"version":2`, 1) + `,"entries":0}` + "\n", true},
		{"damaged past its source", head + `,"entries":[{"path":`, true},
		{"fields in another order", `{"snapshot":"s","entries":[{"path":"a","type":"file"}],` + head[1:] + `}`, true},
	}
	var want []store.Scope
	for i, c := range cases {
		sc := store.Scope{Space: "sp", Agent: "ag", Session: "se", Run: "r", Instance: string(rune('a' + i))}
		if err := noteFork(vol, main, sc); err != nil {
			t.Fatal(err)
		}
		switch c.record {
		case "":
		case "valid", "other":
			from := main
			if c.record == "other" {
				from = other
			}
			if err := writeRecord(vol, sc, &Record{Version: recordVersion, From: from, Snapshot: "s"}); err != nil {
				t.Fatal(err)
			}
		default:
			dir, err := vol.ScopeState(sc)
			if err != nil {
				t.Fatal(err)
			}
			fd, err := unix.Openat(int(dir.Fd()), RecordFile, unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o600)
			dir.Close()
			if err != nil {
				t.Fatal(err)
			}
			f := os.NewFile(uintptr(fd), RecordFile)
			_, err = f.WriteString(c.record)
			f.Close()
			if err != nil {
				t.Fatal(err)
			}
		}
		if c.listed {
			want = append(want, sc)
		}
	}
	got, err := Forks(vol, main)
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(got, func(a, b store.Scope) int { return strings.Compare(a.Instance, b.Instance) })
	if !slices.Equal(got, want) {
		for i, c := range cases {
			sc := store.Scope{Space: "sp", Agent: "ag", Session: "se", Run: "r", Instance: string(rune('a' + i))}
			t.Errorf("%s: listed %v, want %v", c.name, slices.Contains(got, sc), c.listed)
		}
	}
}

// recordEntries are entries of every kind, with names that quoting must
// carry: a space, a quote, a backslash, a newline, a byte that is no
// UTF-8, a leading dash; times before 1970 and an inode above 2^63.
var recordEntries = []Entry{
	{Entry: snapshot.Entry{Path: "src", Type: "dir", Perm: 0o700, MTime: 1765000000123456789}},
	{Entry: snapshot.Entry{Path: "src/a.go", Type: "file", Size: 12, Perm: 0o600, MTime: 1765000000123456789, SHA256: strings.Repeat("ab", 32)},
		Ino: 1234567, CTime: 1765000000223456789, FSize: 12, FMod: 1765000000123456789},
	{Entry: snapshot.Entry{Path: "src/with space \"quoted\" back\\slash", Type: "file", Perm: 0o700, MTime: -5, SHA256: strings.Repeat("0f", 32)},
		Ino: 1<<63 + 5, CTime: -1, FMod: -5},
	{Entry: snapshot.Entry{Path: "src/new\nline\tand\xffbyte", Type: "file", Size: 1, Perm: 0o400, SHA256: strings.Repeat("11", 32)}, FSize: 1},
	{Entry: snapshot.Entry{Path: "-dash/ü", Type: "symlink", Size: 6, Perm: 0o600, SHA256: strings.Repeat("22", 32)}, Ino: 9, FSize: 6},
	{Entry: snapshot.Entry{Path: "empty", Type: "file", Perm: 0o600, SHA256: strings.Repeat("e3", 32)}},
}

// putRecord writes content as the record of sc, behind writeRecord's back.
func putRecord(t *testing.T, vol *store.Volume, sc store.Scope, content []byte) {
	t.Helper()
	dir, err := vol.ScopeState(sc)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	fd, err := unix.Openat(int(dir.Fd()), RecordFile, unix.O_CREAT|unix.O_TRUNC|unix.O_WRONLY|unix.O_CLOEXEC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), RecordFile)
	defer f.Close()
	if _, err := f.Write(content); err != nil {
		t.Fatal(err)
	}
}

// TestRecordFormats checks that a record reads back as written, in the
// line format, and that one of the JSON format (as loomfs wrote it before
// the line format) reads the same.
func TestRecordFormats(t *testing.T) {
	vol, err := store.OpenVolume(context.Background(), store.Config{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer vol.Close()
	sc := store.Scope{Space: "sp", Agent: "ag", Session: "se", Run: "r1", Instance: "a"}
	from := store.Scope{Space: "sp", Agent: "ag", Session: "se"}
	want := &Record{Version: recordVersion, From: from, Snapshot: "snap", Created: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC),
		Clone: "reflink", Entries: recordEntries, Skipped: []snapshot.Skipped{{Path: "fifo", Reason: "not a file"}}}
	// JSON carries no name that is not UTF-8 (it writes U+FFFD for the
	// byte): the line format is the first to.
	old := *want
	old.Version = jsonRecordVersion
	old.Entries = slices.DeleteFunc(slices.Clone(recordEntries), func(e Entry) bool { return !utf8.ValidString(e.Path) })
	oldJSON, err := json.Marshal(&old)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		write func() error
		want  *Record
	}{
		{"line format", func() error { return writeRecord(vol, sc, want) }, want},
		{"JSON format", func() error { putRecord(t, vol, sc, oldJSON); return nil }, &old},
		{"no entries", func() error { return writeRecord(vol, sc, &Record{Version: recordVersion, From: from}) }, &Record{Version: recordVersion, From: from, Entries: []Entry{}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := c.write(); err != nil {
				t.Fatal(err)
			}
			got, err := ReadRecord(vol, sc)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("read back\n%+v\nwant\n%+v", got, c.want)
			}
			if f, err := readFrom(vol, sc); err != nil || f != from {
				t.Errorf("its source read from its head: %v, %v; want %v", f, err, from)
			}
		})
	}
	// The line format: a head of JSON, then a line an entry.
	if err := writeRecord(vol, sc, want); err != nil {
		t.Fatal(err)
	}
	f, err := openRecord(vol, sc)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b, err := os.ReadFile("/proc/self/fd/" + strconv.Itoa(int(f.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if !strings.HasPrefix(lines[0], `{"version":2,`) || !strings.HasSuffix(lines[0], `,"entries":6}`) || len(lines) != 1+len(recordEntries) {
		t.Errorf("record:\n%s\nwant a head of version 2 counting 6 entries, then 6 lines", b)
	}
}

// TestRecordDamaged checks that a record cut short or altered is refused
// with the reason, never read as another base.
func TestRecordDamaged(t *testing.T) {
	vol, err := store.OpenVolume(context.Background(), store.Config{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer vol.Close()
	sc := store.Scope{Space: "sp", Agent: "ag", Session: "se", Run: "r1", Instance: "a"}
	var good strings.Builder
	if err := encodeRecord(&good, &Record{Version: recordVersion, Snapshot: "s", Entries: recordEntries[:2]}); err != nil {
		t.Fatal(err)
	}
	text := good.String()
	head, _, _ := strings.Cut(text, "\n")
	cases := []struct {
		name, record, want string
	}{
		{"empty", "", "damaged"},
		{"last line cut short", strings.TrimSuffix(text, "\n"), "entry 2 is cut short"},
		{"a line missing", head + "\n" + strings.SplitAfter(text, "\n")[1], "holds 1 entries, its head counts 2"},
		{"a line more", text + strings.SplitAfter(text, "\n")[2], "holds 3 entries, its head counts 2"},
		{"a count past the end", strings.Replace(text, `"entries":2`, `"entries":2000`, 1), "counts 2000 entries"},
		{"a negative count", strings.Replace(text, `"entries":2`, `"entries":-1`, 1), "counts -1 entries"},
		{"a number that does not read", strings.Replace(text, " 1234567 ", " 12x4567 ", 1), "entry 2: strconv.ParseUint"},
		{"a path not quoted", strings.Replace(text, `"src/a.go"`, `src/a.go`, 1), "entry 2: path"},
		{"a field missing", strings.Replace(text, "file 600 12 ", "file 600 ", 1), "entry 2: strconv.ParseInt"},
		{"another version", strings.Replace(text, `"version":2`, `"version":3`, 1), "has version 3"},
		{"a JSON record cut short", `{"version":1,"from":{},"entries":[{"path":"a"`, "damaged"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			putRecord(t, vol, sc, []byte(c.record))
			rec, err := ReadRecord(vol, sc)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("read %+v, %v; want an error saying %q", rec, err, c.want)
			}
		})
	}
}

// BenchmarkRecord reads and writes a record of Go's src's size (11,478
// entries) in either format: the line format's entries are what a merge
// reads before it can start and writes once it is done.
func BenchmarkRecord(b *testing.B) {
	rec := &Record{Version: recordVersion, Snapshot: "s"}
	for i := range 11478 {
		rec.Entries = append(rec.Entries, Entry{
			Entry: snapshot.Entry{Path: fmt.Sprintf("src/p%02d/d%04d/f%05d.go", i%40, i%1300, i), Type: "file", Size: int64(i * 7),
				Perm: 0o600, MTime: 1765000000123456789 + int64(i), SHA256: fmt.Sprintf("%064x", i)},
			Ino: uint64(1000000 + i), CTime: 1765000000223456789 + int64(i), FSize: int64(i * 7), FMod: 1765000000123456789 + int64(i)})
	}
	var lines bytes.Buffer
	if err := encodeRecord(&lines, rec); err != nil {
		b.Fatal(err)
	}
	old := *rec
	old.Version = jsonRecordVersion
	js, err := json.Marshal(&old)
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		data []byte
	}{{"lines", lines.Bytes()}, {"json", js}} {
		path := filepath.Join(b.TempDir(), RecordFile)
		if err := os.WriteFile(path, c.data, 0o600); err != nil {
			b.Fatal(err)
		}
		b.Run("decode-"+c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.data)))
			for range b.N {
				f, err := os.Open(path)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := decodeRecord(f, store.Scope{}); err != nil {
					b.Fatal(err)
				}
				f.Close()
			}
		})
	}
	b.Run("encode-lines", func(b *testing.B) {
		for range b.N {
			encodeRecord(io.Discard, rec)
		}
	})
	b.Run("encode-json", func(b *testing.B) {
		for range b.N {
			json.Marshal(&old)
		}
	})
}
