package fork

import (
	"context"
	"testing"

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
