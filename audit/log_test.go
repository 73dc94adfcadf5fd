package audit

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A child process started by TestTwoProcessesOneRoot writes records and exits.
const (
	childRootEnv  = "LOOMFS_AUDIT_TEST_CHILD_ROOT"
	childCountEnv = "LOOMFS_AUDIT_TEST_CHILD_COUNT"
	childHangEnv  = "LOOMFS_AUDIT_TEST_CHILD_HANG"  // write, say "ready", wait to be killed
	childQueueEnv = "LOOMFS_AUDIT_TEST_CHILD_QUEUE" // the child's Options.Queue
	childKillEnv  = "LOOMFS_AUDIT_TEST_CHILD_KILL"  // record, then SIGKILL itself at once
)

func TestMain(m *testing.M) {
	if root := os.Getenv(childRootEnv); root != "" {
		n, _ := strconv.Atoi(os.Getenv(childCountEnv))
		queue, _ := strconv.Atoi(os.Getenv(childQueueEnv))
		if os.Getenv(childHangEnv) != "" || os.Getenv(childKillEnv) != "" {
			l, err := Open(root, Options{Node: "shared-node", Queue: queue})
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			for range n {
				l.Record(context.Background(), sampleEvent())
			}
			if os.Getenv(childKillEnv) != "" {
				unix.Kill(os.Getpid(), unix.SIGKILL)
			}
			for l.Status().Queued > 0 {
				time.Sleep(time.Millisecond)
			}
			fmt.Println("ready")
			time.Sleep(time.Hour)
		}
		if err := writeRecords(root, "shared-node", n); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func writeRecords(root, node string, n int) error {
	l, err := Open(root, Options{Node: node, MaxFileBytes: 8 << 10})
	if err != nil {
		return err
	}
	for i := range n {
		e := sampleEvent()
		e.CallID = fmt.Sprintf("pid%d-%d", os.Getpid(), i)
		if err := l.Record(context.Background(), e); err != nil {
			l.Close()
			return err
		}
	}
	return l.Close()
}

func sampleEvent() Event {
	return Event{
		TraceID:  "trace-1",
		CallID:   "call-1",
		Actor:    Actor{Space: "sp", Agent: "ag", Session: "se", Run: "r1"},
		Scope:    "5f2c0e9a1b7d",
		Source:   SourceFUSE,
		Op:       "create",
		Path:     "src/pkg/file.go",
		Result:   "ok",
		Duration: 42 * time.Microsecond,
	}
}

func openLog(t testing.TB, root string, opts Options) *Log {
	t.Helper()
	l, err := Open(root, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func queryAll(t *testing.T, dir string, f Filter) []Record {
	t.Helper()
	var out []Record
	if err := Query(dir, f, func(r Record) error { out = append(out, r); return nil }); err != nil {
		t.Fatalf("Query: %v", err)
	}
	return out
}

func fixedClock(t time.Time) func() time.Time {
	var mu sync.Mutex
	return func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		t = t.Add(time.Millisecond)
		return t
	}
}

func TestRecordRoundTrip(t *testing.T) {
	root := t.TempDir()
	start := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	l := openLog(t, root, Options{Node: "node-a.example", Clock: fixedClock(start)})
	e := Event{
		TraceID:  "tr-9",
		CallID:   "call-7",
		Actor:    Actor{Space: "s1", Agent: "a1", Session: "se1", Run: "run1", Instance: "sub-1", Container: "loomfs-abc", Operator: "ci-bot"},
		Scope:    "9c1f00ab",
		Source:   SourceSandbox,
		Op:       "rename",
		Path:     "src/a.go",
		NewPath:  "src/b.go",
		Bytes:    1234,
		SHA256:   strings.Repeat("ab", 32),
		Result:   "refused",
		Code:     "quota_exceeded",
		Duration: 1500 * time.Microsecond,
		Detail: map[string]any{"exit_code": 3, "container_id": "c0ffee", "passthrough": true, "written": int64(-5),
			"mode": uint32(0o600), "offset": uint64(1 << 40), "argv": []string{"sh", "-c"}},
	}
	if err := l.Record(context.Background(), e); err != nil {
		t.Fatalf("Record: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	got := queryAll(t, Dir(root), Filter{})
	if len(got) != 1 {
		t.Fatalf("Query returned %d records, want 1", len(got))
	}
	r := got[0]
	want := e
	want.Detail = map[string]any{"exit_code": float64(3), "container_id": "c0ffee", "passthrough": true, "written": float64(-5),
		"mode": float64(0o600), "offset": float64(1 << 40), "argv": []any{"sh", "-c"}}
	if !reflect.DeepEqual(r.Event, want) {
		t.Errorf("event read back:\n got %+v\nwant %+v", r.Event, want)
	}
	if r.Kind != KindEvent || r.Node != "node-a.example" || r.PID != os.Getpid() || r.Seq != 1 || r.Prev != "" {
		t.Errorf("chain fields: kind %q node %q pid %d seq %d prev %q", r.Kind, r.Node, r.PID, r.Seq, r.Prev)
	}
	// The clock ticks twice for Open (the file's day, the registration)
	// and once for the record.
	if !r.Time.Equal(start.Add(3*time.Millisecond)) || r.Time.Location() != time.UTC || r.Writer != 1 {
		t.Errorf("time %v writer %d, want %v UTC, writer 1", r.Time, r.Writer, start.Add(3*time.Millisecond))
	}

	// The raw lines: the event's field names; the ledger's open and close.
	files, _ := filepath.Glob(filepath.Join(Dir(root), "*.jsonl"))
	if len(files) != 2 || filepath.Base(files[0]) != "node-a.example.20250301.000001.jsonl" || filepath.Base(files[1]) != "node-a.example.ledger.jsonl" {
		t.Fatalf("files %v, want the node's chain file of the day and its ledger", files)
	}
	lines := readLines(t, files[0])
	if len(lines) != 1 {
		t.Fatalf("%d lines, want the event", len(lines))
	}
	var raw map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"time", "node", "pid", "kind", "seq", "prev", "trace_id", "call_id", "actor", "scope", "source", "op", "path", "new_path", "bytes", "sha256", "result", "code", "duration_ns", "detail"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("record has no %q field: %s", k, lines[0])
		}
	}
	if ts := raw["time"].(string); ts != "2025-03-01T12:00:00.003Z" {
		t.Errorf("time %q, want RFC 3339 UTC", ts)
	}
	ledger := readLines(t, files[1])
	if len(ledger) != 2 {
		t.Fatalf("ledger %q: want open and close", ledger)
	}
	var open, cl LedgerEntry
	if err := json.Unmarshal([]byte(ledger[0]), &open); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(ledger[1]), &cl); err != nil {
		t.Fatal(err)
	}
	if open.Kind != LedgerOpen || open.Seq != 1 || open.PID != os.Getpid() || open.Node != "node-a.example" || open.ChainSeq != 0 || open.Start.IsZero() {
		t.Errorf("open entry %+v", open)
	}
	head := sha256hex(lines[0] + "\n")
	if cl.Kind != LedgerClose || cl.Seq != 2 || cl.Prev != sha256hex(ledger[0]+"\n") || cl.Writer != 1 || cl.Count != 1 ||
		cl.LastSeq != 1 || cl.LastHash != head || cl.ChainSeq != 1 || cl.ChainHead != head {
		t.Errorf("close entry %+v", cl)
	}
	for _, f := range files {
		if fi, err := os.Stat(f); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", f, fi.Mode().Perm())
		}
	}

	fi, err := os.Stat(files[0])
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("file mode %v, want 0600", fi.Mode().Perm())
	}
	di, err := os.Stat(Dir(root))
	if err != nil || di.Mode().Perm() != 0o700 {
		t.Errorf("dir mode %v, want 0700", di.Mode().Perm())
	}
}

func TestOpenTightensDirMode(t *testing.T) {
	root := t.TempDir()
	if err := os.Mkdir(Dir(root), 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chmod(Dir(root), 0o755)
	openLog(t, root, Options{Node: "n"})
	if fi, _ := os.Stat(Dir(root)); fi.Mode().Perm() != 0o700 {
		t.Errorf("dir mode %v, want 0700", fi.Mode().Perm())
	}
}

// Filenames are data: newlines, quotes and control characters in a path
// must not make a second line or a second record.
func TestPathCannotForgeRecord(t *testing.T) {
	root := t.TempDir()
	l := openLog(t, root, Options{Node: "n"})
	forged := `{"time":"2025-01-01T00:00:00Z","kind":"event","seq":2,"prev":"","op":"unlink","path":"x"}`
	paths := []string{
		"evil\n" + forged + "\n.txt",
		"q\"uote\\back\x00nul\x01\x1b[2J\r\t\u2028\u2029end",
		"not-utf8-\xff\xfe-\xc3(",
	}
	for _, p := range paths {
		if err := l.Record(context.Background(), Event{Source: SourceFUSE, Op: "rename", Path: p, NewPath: p + "\n2", Result: "refused"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(Dir(root), "*.[0-9]*.jsonl"))
	if n := len(readLines(t, files[0])); n != len(paths) {
		t.Errorf("%d lines, want %d records", n, len(paths))
	}
	for _, p := range paths {
		got := queryAll(t, Dir(root), Filter{Path: p})
		if len(got) != 1 || got[0].Path != p || got[0].NewPath != p+"\n2" {
			t.Errorf("query for %q returned %d records: %+v", p, len(got), got)
		}
	}
	if got := queryAll(t, Dir(root), Filter{Op: "unlink"}); len(got) != 0 {
		t.Errorf("forged record came back: %+v", got)
	}
	rep, err := Verify(Dir(root))
	if err != nil || !rep.OK() || rep.Records != len(paths) {
		t.Errorf("Verify: %v %v %+v", rep, err, rep.Problems)
	}
}

func TestConcurrentGoroutines(t *testing.T) {
	root := t.TempDir()
	l := openLog(t, root, Options{Node: "n", MaxFileBytes: 16 << 10})
	const workers, each = 16, 300
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				e := sampleEvent()
				e.CallID = fmt.Sprintf("%d-%d", w, i)
				if err := l.Record(context.Background(), e); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err := Verify(Dir(root))
	if err != nil || !rep.OK() {
		t.Fatalf("Verify: %v %v %+v", rep, err, rep.Problems)
	}
	if rep.Events != workers*each || rep.Files < 10 || len(rep.Chains) != 1 || len(rep.Nodes) != 1 || rep.Nodes[0].Closed != 1 {
		t.Errorf("report %+v: want %d events in one chain over many files, its writer closed", rep, workers*each)
	}
	seen := map[string]bool{}
	for _, r := range queryAll(t, Dir(root), Filter{}) {
		if seen[r.CallID] {
			t.Errorf("call %s recorded twice", r.CallID)
		}
		seen[r.CallID] = true
	}
	if len(seen) != workers*each {
		t.Errorf("%d distinct records, want %d", len(seen), workers*each)
	}
}

// Three processes of one node share its chain: every record is there,
// once, in one chain, and each writer is registered and closed.
func TestTwoProcessesOneRoot(t *testing.T) {
	root := t.TempDir()
	const each = 1500
	var children []*exec.Cmd
	for range 2 {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childRootEnv+"="+root, childCountEnv+"="+strconv.Itoa(each))
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		children = append(children, cmd)
	}
	if err := writeRecords(root, "shared-node", each); err != nil {
		t.Fatal(err)
	}
	for _, c := range children {
		if err := c.Wait(); err != nil {
			t.Fatalf("child: %v", err)
		}
	}
	rep, err := Verify(Dir(root))
	if err != nil || !rep.Clean(false) {
		t.Fatalf("Verify: %v %v %+v %+v", rep, err, rep.Problems, rep.Crashed)
	}
	if len(rep.Chains) != 1 || rep.Events != 3*each || rep.Files < 2 {
		t.Fatalf("%d chains, %d events in %d files; want one rotated chain of %d", len(rep.Chains), rep.Events, rep.Files, 3*each)
	}
	if n := rep.Nodes[0]; n.Writers != 3 || n.Closed != 3 {
		t.Errorf("node %+v: want 3 writers, all closed", n)
	}
	got := queryAll(t, Dir(root), Filter{})
	seen := map[string]bool{}
	for _, r := range got {
		if seen[r.CallID] {
			t.Errorf("record %s twice", r.CallID)
		}
		seen[r.CallID] = true
	}
	if len(seen) != 3*each {
		t.Errorf("Query: %d distinct records, want %d", len(seen), 3*each)
	}
}

func TestUnavailable(t *testing.T) {
	ctx := context.Background()
	t.Run("file where the directory should be", func(t *testing.T) {
		root := t.TempDir()
		os.WriteFile(Dir(root), []byte("x"), 0o600)
		if _, err := Open(root, Options{Node: "n"}); !errors.Is(err, ErrUnavailable) {
			t.Errorf("Open: %v, want ErrUnavailable", err)
		}
	})
	t.Run("symlink where the directory should be", func(t *testing.T) {
		root := t.TempDir()
		os.Symlink(t.TempDir(), Dir(root))
		if _, err := Open(root, Options{Node: "n"}); !errors.Is(err, ErrUnavailable) {
			t.Errorf("Open: %v, want ErrUnavailable", err)
		}
	})
	t.Run("missing root", func(t *testing.T) {
		if _, err := Open(filepath.Join(t.TempDir(), "nope"), Options{Node: "n"}); !errors.Is(err, ErrUnavailable) {
			t.Errorf("Open: %v, want ErrUnavailable", err)
		}
	})
	t.Run("closed log", func(t *testing.T) {
		l := openLog(t, t.TempDir(), Options{Node: "n"})
		l.Close()
		if err := l.Record(ctx, sampleEvent()); !errors.Is(err, ErrUnavailable) {
			t.Errorf("Record after Close: %v, want ErrUnavailable", err)
		}
	})
	t.Run("directory replaced by a file", func(t *testing.T) {
		root := t.TempDir()
		l := openLog(t, root, Options{Node: "n", MaxFileBytes: 1})
		if err := l.Record(ctx, sampleEvent()); err != nil {
			t.Fatal(err)
		}
		os.RemoveAll(Dir(root))
		os.WriteFile(Dir(root), nil, 0o600)
		// The next record must rotate, and there is nowhere to rotate to.
		if err := l.Record(ctx, sampleEvent()); !errors.Is(err, ErrUnavailable) {
			t.Errorf("Record: %v, want ErrUnavailable", err)
		}
		if st := l.Status(); !errors.Is(st.Err, ErrUnavailable) {
			t.Errorf("Status().Err = %v, want ErrUnavailable", st.Err)
		}
	})
	t.Run("disk full", func(t *testing.T) {
		root := tinyTmpfs(t)
		l := openLog(t, root, Options{Node: "n"})
		e := sampleEvent()
		e.Detail = map[string]any{"blob": strings.Repeat("x", 3000)}
		var err error
		written := 0
		for ; written < 1000; written++ {
			if err = l.Record(ctx, e); err != nil {
				break
			}
		}
		if !errors.Is(err, ErrUnavailable) || !errors.Is(err, unix.ENOSPC) {
			t.Fatalf("Record on a full disk after %d records: %v, want ErrUnavailable wrapping ENOSPC", written, err)
		}
		t.Logf("disk full after %d records: %v", written, err)
		if st := l.Status(); st.Err == nil || st.Records != uint64(written) {
			t.Errorf("Status %+v: want the error and %d records", st, written)
		}
		// A small record still fits where the large one did not, and the
		// chain stays whole: the partial line was cut off.
		if err := l.Record(ctx, sampleEvent()); err != nil {
			t.Logf("small record after full: %v", err)
		}
		l.Close()
		rep, err := Verify(Dir(root))
		if err != nil || !rep.OK() || len(rep.Warnings) != 0 {
			t.Errorf("Verify after disk full: %v %v problems %+v warnings %+v", rep, err, rep.Problems, rep.Warnings)
		}
	})
}

// shortWriter writes half of what it is given, then fails like a full disk.
type shortWriter struct{ f *os.File }

func (w shortWriter) Write(b []byte) (int, error) {
	n, _ := w.f.Write(b[:len(b)/2])
	return n, unix.ENOSPC
}
func (w shortWriter) Sync() error { return w.f.Sync() }

// A record that only half reached the file is cut off again, so the chain
// stays whole and later records continue it.
func TestPartialWriteCutOff(t *testing.T) {
	root := t.TempDir()
	l := openLog(t, root, Options{Node: "n"})
	ctx := context.Background()
	for range 3 {
		if err := l.Record(ctx, sampleEvent()); err != nil {
			t.Fatal(err)
		}
	}
	l.mu.Lock()
	l.ws = shortWriter{l.f}
	l.mu.Unlock()
	if err := l.Record(ctx, sampleEvent()); !errors.Is(err, ErrUnavailable) || !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("Record on a short write: %v", err)
	}
	l.mu.Lock()
	l.ws = l.f
	l.mu.Unlock()
	if err := l.Record(ctx, sampleEvent()); err != nil {
		t.Fatalf("Record after the disk has room again: %v", err)
	}
	if st := l.Status(); st.Err != nil || st.Records != 4 {
		t.Errorf("Status %+v: want no error, 4 records", st)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err := Verify(Dir(root))
	if err != nil || !rep.OK() || len(rep.Warnings) != 0 || rep.Events != 4 {
		t.Errorf("Verify: %v %v problems %v warnings %v", rep, err, rep.Problems, rep.Warnings)
	}
}

// tinyTmpfs mounts a 64 KiB tmpfs for the test, or skips without privilege.
func tinyTmpfs(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64k,mode=0700"); err != nil {
		t.Skipf("cannot mount tmpfs (needs root): %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

func TestSyncOption(t *testing.T) {
	root := t.TempDir()
	l := openLog(t, root, Options{Node: "n", Sync: true})
	for range 3 {
		if err := l.Record(context.Background(), sampleEvent()); err != nil {
			t.Fatal(err)
		}
	}
	if st := l.Status(); st.Records != 3 || st.Err != nil {
		t.Errorf("Status %+v", st)
	}
}

func TestDiscard(t *testing.T) {
	if err := Discard.Record(context.Background(), sampleEvent()); err != nil {
		t.Error(err)
	}
}

// BenchmarkRecord: the cost of a record to its caller. A synchronous Log
// (serial, detail, sync, writers, unheld, parallel) writes in Record,
// keeping the chain lock through a burst (unheld: not); a queued one
// (queued…) returns once the record is queued, and its writer goroutine
// writes the rest: the total CPU of a run (time, user + sys) counts both.
func BenchmarkRecord(b *testing.B) {
	release := Event{Source: SourceFUSE, Op: "release", Path: "src/pkg/file.go", Result: "ok",
		Detail: map[string]any{"read": int64(0), "written": int64(4096), "passthrough": true}}
	for _, bc := range []struct {
		name string
		opts Options
		e    Event
	}{
		{"serial", Options{Node: "bench"}, sampleEvent()},
		{"detail", Options{Node: "bench"}, release},
		{"sync", Options{Node: "bench", Sync: true}, sampleEvent()},
		{"queued", Options{Node: "bench", Queue: DefaultQueue}, sampleEvent()},
		{"queued-detail", Options{Node: "bench", Queue: DefaultQueue}, release},
	} {
		b.Run(bc.name, func(b *testing.B) {
			l := openLog(b, b.TempDir(), bc.opts)
			b.ReportAllocs()
			for b.Loop() {
				if err := l.Record(context.Background(), bc.e); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	// Writers of one node recording at once, each its own Log (as
	// processes would be), sharing the node's chain.
	b.Run("writers", func(b *testing.B) {
		root := b.TempDir()
		e := sampleEvent()
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			l, err := Open(root, Options{Node: "bench"})
			if err != nil {
				b.Error(err)
				return
			}
			defer l.Close()
			for pb.Next() {
				if err := l.Record(context.Background(), e); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	// A synchronous writer recording now and then takes and releases the
	// lock for each record: measured with bursts not detected.
	b.Run("unheld", func(b *testing.B) {
		defer func(g, most time.Duration) { holdGap, holdGapMost = g, most }(holdGap, holdGapMost)
		holdGap, holdGapMost = 0, 0
		l := openLog(b, b.TempDir(), Options{Node: "bench"})
		e := sampleEvent()
		b.ReportAllocs()
		for b.Loop() {
			if err := l.Record(context.Background(), e); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, bc := range []struct {
		name string
		opts Options
	}{
		{"parallel", Options{Node: "bench"}},
		{"parallel-queued", Options{Node: "bench", Queue: DefaultQueue}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			l := openLog(b, b.TempDir(), bc.opts)
			e := sampleEvent()
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := l.Record(context.Background(), e); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

func readLines(t *testing.T, name string) []string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}

func sha256hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// TestSyncBurstFollowsTheLockCost: a synchronous Log keeps the chain lock
// from one record to the next when they come within its gap, which is
// stretched where letting the lock go was dear, and measured again each
// time it lets the lock go.
func TestSyncBurstFollowsTheLockCost(t *testing.T) {
	root := t.TempDir()
	l := openLog(t, root, Options{Node: "n"})
	heldByAnother := func() bool {
		f, err := os.Open(l.f.Name())
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		lk := unix.Flock_t{Type: unix.F_RDLCK}
		if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_GETLK, &lk); err != nil {
			t.Fatal(err)
		}
		return lk.Type != unix.F_UNLCK
	}
	record := func() {
		if err := l.Record(context.Background(), sampleEvent()); err != nil {
			t.Fatal(err)
		}
	}

	// A record now and then takes the lock and lets it go. As if letting
	// it go had been dear (holds stretches the gap to 16 ms for a lock of
	// about 2 ms on CephFS; a second here, so that a slow machine's sleep
	// can't outlast it), the next record 10 ms later begins a burst.
	record()
	l.mu.Lock()
	l.gap, l.most = time.Second, 2*time.Second
	gap := l.gap
	l.mu.Unlock()
	time.Sleep(10 * time.Millisecond)
	record()
	if !heldByAnother() {
		t.Errorf("records 10 ms apart with a gap of %v: the lock was let go between them", gap)
	}
	// Once the burst is over the lock goes, and the gap is measured again
	// from what letting it go cost: at most holdGapMost, whatever a loaded
	// machine made the unlock cost, never the stretched second kept.
	deadline := time.Now().Add(5 * time.Second)
	for heldByAnother() {
		if time.Now().After(deadline) {
			t.Fatalf("the lock was still held %v after the last record", 5*time.Second)
		}
		time.Sleep(5 * time.Millisecond)
	}
	l.mu.Lock()
	gap = l.gap
	l.mu.Unlock()
	if gap > holdGapMost {
		t.Errorf("after the lock was let go the gap is %v, want it measured again (at most %v)", gap, holdGapMost)
	}
	// Records further apart than any measured gap don't keep the lock.
	record()
	time.Sleep(2 * holdGapMost)
	record()
	if heldByAnother() {
		t.Errorf("records %v apart with a gap of at most %v: the lock was kept", 2*holdGapMost, holdGapMost)
	}
}
