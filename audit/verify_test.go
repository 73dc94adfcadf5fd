package audit

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// rotatedLog writes n events to a fresh root in files of about 2 KiB and
// returns the audit directory and its files in chain order.
func rotatedLog(t *testing.T, n int) (string, []string) {
	t.Helper()
	root := t.TempDir()
	l := openLog(t, root, Options{Node: "n1", MaxFileBytes: 2 << 10, Clock: fixedClock(time.Date(2025, 5, 1, 0, 0, 0, 0, time.UTC))})
	for i := range n {
		e := sampleEvent()
		e.Path = fmt.Sprintf("src/file-%04d.go", i)
		if err := l.Record(context.Background(), e); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(Dir(root), "n1.2*.jsonl"))
	if err != nil || len(files) < 3 {
		t.Fatalf("want at least 3 rotated files, got %d (%v)", len(files), err)
	}
	slices.Sort(files)
	return Dir(root), files
}

// ledgerOf names the ledger beside a chain's files.
func ledgerOf(files []string) string {
	return filepath.Join(filepath.Dir(files[0]), "n1"+ledgerExt)
}

// cutLedger removes the ledger's last n entries.
func cutLedger(t *testing.T, files []string, n int) {
	t.Helper()
	editLines(t, ledgerOf(files), func(l [][]byte) [][]byte { return l[:len(l)-n] })
}

// editLines rewrites a file's lines (each with its newline) through fn.
func editLines(t *testing.T, name string, fn func([][]byte) [][]byte) {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.SplitAfter(b, []byte("\n"))
	if len(lines[len(lines)-1]) == 0 {
		lines = lines[:len(lines)-1]
	}
	if err := os.WriteFile(name, bytes.Join(fn(lines), nil), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestVerify(t *testing.T) {
	const events = 60
	for _, tc := range []struct {
		name    string
		tamper  func(t *testing.T, files []string)
		ok      bool
		warn    bool
		crashed bool   // a writer ended without closing
		at      string // file index and line of the first problem, "1:3"; "" not checked
	}{
		{name: "untouched log over several rotated files", tamper: func(*testing.T, []string) {}, ok: true},
		{name: "edited byte", at: "1:3", tamper: func(t *testing.T, f []string) {
			editLines(t, f[1], func(l [][]byte) [][]byte {
				l[2] = bytes.Replace(l[2], []byte(`"create"`), []byte(`"creatE"`), 1)
				return l
			})
		}},
		{name: "edited byte that breaks the JSON", at: "1:2", tamper: func(t *testing.T, f []string) {
			editLines(t, f[1], func(l [][]byte) [][]byte { l[1][0] = '['; return l })
		}},
		{name: "edited checkpoint", tamper: func(t *testing.T, f []string) {
			editLines(t, f[0], func(l [][]byte) [][]byte {
				n := len(l) - 1
				l[n] = bytes.Replace(l[n], []byte(fmt.Sprintf(`"count":%d`, n)), []byte(`"count":7`), 1)
				return l
			})
		}},
		{name: "dropped line", at: "0:3", tamper: func(t *testing.T, f []string) {
			editLines(t, f[0], func(l [][]byte) [][]byte { return slices.Delete(l, 2, 3) })
		}},
		{name: "dropped last line of a file", tamper: func(t *testing.T, f []string) {
			editLines(t, f[2], func(l [][]byte) [][]byte { return l[:len(l)-1] })
		}},
		{name: "swapped pair", at: "2:2", tamper: func(t *testing.T, f []string) {
			editLines(t, f[2], func(l [][]byte) [][]byte { l[1], l[2] = l[2], l[1]; return l })
		}},
		{name: "inserted copy of a line", at: "1:3", tamper: func(t *testing.T, f []string) {
			editLines(t, f[1], func(l [][]byte) [][]byte { return slices.Insert(l, 2, l[1]) })
		}},
		{name: "inserted forged line", at: "1:2", tamper: func(t *testing.T, f []string) {
			editLines(t, f[1], func(l [][]byte) [][]byte {
				return slices.Insert(l, 1, []byte(`{"time":"2025-05-01T00:00:00Z","node":"n1","pid":1,"kind":"event","seq":9,"prev":"","op":"unlink"}`+"\n"))
			})
		}},
		{name: "record appended after the writer's close", tamper: func(t *testing.T, f []string) {
			editLines(t, f[len(f)-1], func(l [][]byte) [][]byte { return append(l, l[0]) })
		}},
		{name: "file removed from the middle", at: "3:0", tamper: func(t *testing.T, f []string) { os.Remove(f[2]) }},
		{name: "first file removed", at: "1:0", tamper: func(t *testing.T, f []string) { os.Remove(f[0]) }},
		{name: "last file removed", tamper: func(t *testing.T, f []string) { os.Remove(f[len(f)-1]) }},
		{name: "two files swapped", tamper: func(t *testing.T, f []string) {
			os.Rename(f[1], f[1]+".tmp")
			os.Rename(f[2], f[1])
			os.Rename(f[1]+".tmp", f[2])
		}},
		{name: "file emptied", tamper: func(t *testing.T, f []string) { os.Truncate(f[1], 0) }},
		{name: "truncated last line after a crash", ok: true, warn: true, crashed: true, tamper: func(t *testing.T, f []string) {
			// The close never made it, and the last event only half.
			editLines(t, f[len(f)-1], func(l [][]byte) [][]byte {
				n := len(l) - 1
				l[n] = l[n][:len(l[n])/2]
				return l
			})
			cutLedger(t, f, 1)
		}},
		{name: "truncated line in a middle file", tamper: func(t *testing.T, f []string) {
			editLines(t, f[1], func(l [][]byte) [][]byte { n := len(l) - 1; l[n] = l[n][:10]; return l })
		}},
		{name: "last records of a closed chain cut", tamper: func(t *testing.T, f []string) {
			editLines(t, f[len(f)-1], func(l [][]byte) [][]byte { return l[:len(l)-2] })
		}},
		{name: "last records and the close cut: ended without closing", ok: true, crashed: true, tamper: func(t *testing.T, f []string) {
			editLines(t, f[len(f)-1], func(l [][]byte) [][]byte { return l[:len(l)-2] })
			cutLedger(t, f, 1)
		}},
		{name: "ledger entry edited", tamper: func(t *testing.T, f []string) {
			editLines(t, ledgerOf(f), func(l [][]byte) [][]byte {
				l[0] = bytes.Replace(l[0], []byte(`"pid":`), []byte(`"pid":1`), 1)
				return l
			})
		}},
		{name: "ledger entry removed", tamper: func(t *testing.T, f []string) {
			editLines(t, ledgerOf(f), func(l [][]byte) [][]byte { return l[1:] })
		}},
		{name: "ledger removed", tamper: func(t *testing.T, f []string) { os.Remove(ledgerOf(f)) }},
		{name: "the chain's whole file set removed", tamper: func(t *testing.T, f []string) {
			for _, name := range f {
				os.Remove(name)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, files := rotatedLog(t, events)
			tc.tamper(t, files)
			rep, err := Verify(dir)
			if err != nil {
				t.Fatal(err)
			}
			if rep.OK() != tc.ok {
				t.Fatalf("OK = %v, want %v; %s; problems %v", rep.OK(), tc.ok, rep, rep.Problems)
			}
			if got := len(rep.Crashed) > 0; tc.ok && (got != tc.crashed || rep.Clean(false) != !tc.crashed || !rep.Clean(true)) {
				t.Errorf("ended without closing %v, want %v", rep.Crashed, tc.crashed)
			}
			if got := len(rep.Warnings) > 0; got != tc.warn {
				t.Errorf("warnings %v, want some: %v", rep.Warnings, tc.warn)
			}
			if tc.at != "" {
				var fi, line int
				fmt.Sscanf(tc.at, "%d:%d", &fi, &line)
				p := rep.Problems[0]
				if p.File != filepath.Base(files[fi]) || p.Line != line {
					t.Errorf("first problem %v, want at %s:%d", p, filepath.Base(files[fi]), line)
				}
			}
			if !tc.ok {
				t.Logf("first problem: %v", rep.Problems[0])
			}
		})
	}
}

func TestVerifyCounts(t *testing.T) {
	dir, files := rotatedLog(t, 60)
	rep, err := Verify(dir)
	if err != nil || !rep.OK() {
		t.Fatalf("%v %v", rep, err)
	}
	// One rotation checkpoint per file but the last.
	if rep.Files != len(files) || rep.Events != 60 || rep.Records != 60+len(files)-1 {
		t.Errorf("report %s (%d events); want %d files, %d records", rep, rep.Events, len(files), 60+len(files)-1)
	}
	if want := fmt.Sprintf("%d files, %d records, chain intact (1 node, 1 writer)", len(files), 60+len(files)-1); rep.String() != want {
		t.Errorf("summary %q, want %q", rep.String(), want)
	}
	c := rep.Chains[0]
	if c.Files != len(files) || len(c.Head) != 64 || c.Legacy {
		t.Errorf("chain %+v", c)
	}
	if n := rep.Nodes[0]; n.Writers != 1 || n.Closed != 1 || n.ChainHead != c.Head || n.LedgerSeq != 2 {
		t.Errorf("node %+v", n)
	}
}

func TestVerifyTruncatedLineRestStillChecked(t *testing.T) {
	dir, files := rotatedLog(t, 60)
	editLines(t, files[0], func(l [][]byte) [][]byte {
		l[1] = bytes.Replace(l[1], []byte("src/"), []byte("SRC/"), 1)
		return l
	})
	last := files[len(files)-1]
	editLines(t, last, func(l [][]byte) [][]byte { n := len(l) - 1; l[n] = l[n][:5]; return l })
	cutLedger(t, files, 1)
	rep, _ := Verify(dir)
	if rep.OK() || len(rep.Warnings) != 1 {
		t.Errorf("edit before a truncated tail: OK %v warnings %v", rep.OK(), rep.Warnings)
	}
}

func TestVerifyUnexpectedFiles(t *testing.T) {
	dir, files := rotatedLog(t, 20)
	os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("hi"), 0o600)
	os.Chmod(files[0], 0o644)
	rep, err := Verify(dir)
	if err != nil || !rep.OK() || len(rep.Warnings) != 2 {
		t.Errorf("%v %v warnings %v", rep, err, rep.Warnings)
	}
	if _, err := Verify(filepath.Join(dir, "missing")); err == nil {
		t.Error("Verify of a missing directory succeeded")
	}
	// Another writer's records moved into this chain's file set.
	os.Symlink(files[0], strings.Replace(files[0], ".000001.", ".000099.", 1))
	if rep, _ := Verify(dir); rep.OK() {
		t.Error("symlinked chain file accepted")
	}
}

// copyLegacy copies the legacy per-process log in testdata to a fresh
// audit directory.
func copyLegacy(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	if err := os.Mkdir(Dir(root), 0o700); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir("testdata/legacy")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("testdata/legacy", e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(Dir(root), e.Name()), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// A log written in the format before the ledger still verifies, says so,
// and reads back beside a new one.
func TestVerifyLegacy(t *testing.T) {
	root := copyLegacy(t)
	l := openLog(t, root, Options{Node: "n1"})
	if err := l.Record(context.Background(), sampleEvent()); err != nil {
		t.Fatal(err)
	}
	l.Close()
	rep, err := Verify(Dir(root))
	if err != nil || !rep.Clean(false) || rep.Legacy != 1 || len(rep.Nodes) != 1 || rep.Events != 21 {
		t.Fatalf("%v %v %+v", rep, err, rep.Problems)
	}
	if len(rep.Warnings) != 1 || !strings.Contains(rep.Warnings[0].Message, "legacy per-process format") {
		t.Errorf("warnings %v: want one saying the log is partly legacy", rep.Warnings)
	}
	if got := queryAll(t, Dir(root), Filter{}); len(got) != 21 {
		t.Errorf("query: %d records, want 21", len(got))
	}
	files, _ := filepath.Glob(filepath.Join(Dir(root), "old-node-*.000002.jsonl"))
	editLines(t, files[0], func(l [][]byte) [][]byte { return l[1:] })
	if rep, _ := Verify(Dir(root)); rep.OK() {
		t.Error("a record dropped from a legacy chain went unseen")
	}
}

// The fast reading of a record's chain fields agrees with encoding/json
// on every kind of line a writer makes, and gives up on any other.
func TestParseFast(t *testing.T) {
	_, files := rotatedLog(t, 20)
	lines := append(readLines(t, files[0]), readLines(t, files[len(files)-1])...)
	legacy, _ := filepath.Glob("testdata/legacy/*.jsonl")
	slices.Sort(legacy)
	lines = append(lines, readLines(t, legacy[0])...)
	lines = append(lines, readLines(t, legacy[len(legacy)-1])...)
	for _, l := range lines {
		var fast, slow verifyFields
		if !fast.parseFast([]byte(l + "\n")) {
			t.Errorf("fast path refused a writer's line %s", l)
			continue
		}
		if err := json.Unmarshal([]byte(l), &slow); err != nil || fast != slow {
			t.Errorf("line %s:\nfast %+v\njson %+v", l, fast, slow)
		}
	}
	for _, l := range []string{
		`[{"time":"x","node":"n","pid":1,"kind":"event","seq":1,"prev":""}` + "\n",
		`{"time":"x","node":"n\"q","pid":1,"kind":"event","seq":1,"prev":""}` + "\n",
		`{"time":"x","node":"n","pid":1,"seq":1,"kind":"event","prev":""}` + "\n",
		`{"time":"x","node":"n","pid":-1,"kind":"event","seq":1,"prev":""}` + "\n",
		`{"time":"x","node":"n","pid":1,"kind":"checkpoint","seq":1,"prev":"","count":1,"head":"","reason":"rotate"}garbage` + "\n",
	} {
		var r verifyFields
		if r.parseFast([]byte(l)) {
			t.Errorf("fast path took %q", l)
		}
	}
}
