package fork

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

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
		{"another version", strings.Replace(head, `"version":1`, `"version":2`, 1) + `,"entries":[]}`, false},
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
