package fork

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

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

// codecRecord is a record with the entries whose encoding is easy to get
// wrong: escapes, non-ASCII and invalid UTF-8 names, zero and extreme
// figures.
func codecRecord() *Record {
	r := &Record{Version: recordVersion, From: store.Scope{Space: "sp", Agent: "ag", Session: "se"}, Snapshot: "20260101-000000-abcd",
		Created: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC), Clone: "reflink",
		Skipped: []snapshot.Skipped{{Path: "output", Reason: "write-only in the source, readable in the fork"}}}
	for i, p := range []string{"src/a.go", "dir", `quote"back\slash`, "new\nline\ttab", "<tag>&amp", "naïve/日本.go", "bad\xffutf8", ""} {
		e := Entry{Entry: snapshot.Entry{Path: p, Type: "file", Size: int64(i) * 1000, Perm: 0o600, MTime: -int64(i), SHA256: strings.Repeat("ab", 32)}}
		if i%3 == 1 {
			e.Type, e.Size, e.SHA256 = "dir", 0, ""
		} else {
			e.Ino, e.CTime, e.FSize, e.FMod = math.MaxUint64-uint64(i), math.MaxInt64, int64(i), math.MinInt64
		}
		r.Entries = append(r.Entries, e)
	}
	return r
}

// TestRecordCodec checks the hand-written record encoding against
// encoding/json: what encodeRecord writes, encoding/json reads the same,
// and parseRecord reads what encoding/json wrote (earlier records) as it
// does; where parseRecord is not sure, it says so.
func TestRecordCodec(t *testing.T) {
	r := codecRecord()
	b, err := encodeRecord(r)
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid(b) {
		t.Fatalf("not JSON: %s", b)
	}
	var viaJSON Record
	if err := json.Unmarshal(b, &viaJSON); err != nil {
		t.Fatal(err)
	}
	old, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(compact(t, b), compact(t, reorder(t, old))) {
		t.Errorf("encodeRecord:\n%s\nencoding/json:\n%s", b, old)
	}
	indented, _ := json.MarshalIndent(r, " ", "\t")
	for name, in := range map[string][]byte{
		"encodeRecord":  b,
		"encoding/json": old,
		"indented":      indented,
		"unknown keys":  []byte(`{"version":1,"later":{"a":[1,"]"]},"entries":[{"path":"a","extra":null,"type":"file"}]}`),
		"extremes":      []byte(`{"version":1,"entries":[{"size":-9223372036854775808,"ino":18446744073709551615,"perm":4294967295,"mtime_ns":-0}]}`),
	} {
		got, ok := parseRecord(in)
		if !ok {
			t.Errorf("%s: not parsed", name)
			continue
		}
		checkParsed(t, name, in, got)
	}
	for _, in := range []string{
		`{"version":1,"Entries":[]}`,                             // encoding/json takes keys in any case
		`{"version":1,"entries":[{"Path":"a"}]}`,                 // in an entry too
		`{"version":1.0}`,                                        // no integer
		`{"version":01}`,                                         // no JSON
		`{"version":1,"entries":null}`,                           // null
		`{"version":1,"entries":[{"size":1e3}]}`,                 // no integer
		`{"version":1,"entries":[{"path":"a"}`,                   // cut short
		`{"version":1,"x":[1,}`,                                  // no JSON in an unknown key
		`{"version":1,"entries":[{"path":"a\u0000"}`,             // cut short after an escape
		`{"version":1,"entries":[{"ino":18446744073709551616}]}`, // too large
		`{"version":1,"entries":[{"size":9223372036854775808}]}`, // too large
		`{"version":1,"entries":[{"perm":4294967296}]}`,          // too large
		`{"version":1,"entries":[{"ino":-1}]}`,                   // negative
	} {
		if got, ok := parseRecord([]byte(in)); ok {
			t.Errorf("%s: parsed as %+v, want it left to encoding/json", in, got)
		}
	}
}

// checkParsed fails unless encoding/json reads in as parseRecord did.
func checkParsed(t *testing.T, name string, in []byte, got *Record) {
	t.Helper()
	var want Record
	if err := json.NewDecoder(bytes.NewReader(in)).Decode(&want); err != nil {
		t.Errorf("%s: parsed, but encoding/json refuses it: %v", name, err)
		return
	}
	if !reflect.DeepEqual(got, &want) {
		t.Errorf("%s: parsed\n%+v\nencoding/json\n%+v", name, got, &want)
	}
}

// reorder moves the entries of a record encoding/json wrote after its
// other fields, where encodeRecord puts them.
func reorder(t *testing.T, b []byte) []byte {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	entries := m["entries"]
	delete(m, "entries")
	var r Record
	json.Unmarshal(b, &r)
	head, _ := json.Marshal(recordHead{Version: r.Version, From: r.From, Snapshot: r.Snapshot, Created: r.Created, Clone: r.Clone, Skipped: r.Skipped})
	return append(append(append(head[:len(head)-1], `,"entries":`...), entries...), '}')
}

func compact(t *testing.T, b []byte) []byte {
	t.Helper()
	var out bytes.Buffer
	if err := json.Compact(&out, b); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// FuzzParseRecord checks that whatever parseRecord reads, encoding/json
// reads the same.
func FuzzParseRecord(f *testing.F) {
	b, _ := encodeRecord(codecRecord())
	f.Add(b)
	old, _ := json.Marshal(codecRecord())
	f.Add(old)
	f.Add([]byte(`{"version":1,"entries":[{"path":"a\"b","perm":384,"ino":1}],"skipped":[{"path":"x","reason":"y"}]}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		if got, ok := parseRecord(in); ok {
			checkParsed(t, "input", in, got)
		}
	})
}
