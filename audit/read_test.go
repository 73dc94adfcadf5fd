package audit

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
)

func TestFilterMatch(t *testing.T) {
	t0 := time.Date(2025, 6, 1, 10, 0, 0, 0, time.UTC)
	main := Record{Kind: KindEvent, Time: t0, Event: Event{
		Actor: Actor{Space: "sp", Agent: "ag", Session: "se", Run: "r1"}, Scope: "hashmain",
		Source: SourceTool, Op: "workspace_write", Path: "src/a.go", Result: "ok",
	}}
	child := Record{Kind: KindEvent, Time: t0.Add(time.Hour), Event: Event{
		Actor: Actor{Space: "sp", Agent: "ag", Session: "se", Run: "r1", Instance: "sub-1"}, Scope: "hashchild",
		Source: SourceFUSE, Op: "rename", Path: "tmp/x", NewPath: "output/x", Result: "refused", Code: "permission_denied",
	}}
	checkpoint := Record{Kind: KindCheckpoint, Time: t0}
	for _, tc := range []struct {
		name  string
		f     Filter
		match []Record
	}{
		{"zero filter matches every event", Filter{}, []Record{main, child}},
		{"scope hash", Filter{Scope: "hashchild"}, []Record{child}},
		{"main scope by ids", Filter{Scope: "sp/ag/se"}, []Record{main}},
		{"child instance by ids", Filter{Scope: "sp/ag/se/r1/sub-1"}, []Record{child}},
		{"other run's instance", Filter{Scope: "sp/ag/se/r2/sub-1"}, nil},
		{"malformed scope matches nothing", Filter{Scope: "sp/ag"}, nil},
		{"since is inclusive", Filter{Since: t0.Add(time.Hour)}, []Record{child}},
		{"until is exclusive", Filter{Until: t0.Add(time.Hour)}, []Record{main}},
		{"source", Filter{Source: SourceFUSE}, []Record{child}},
		{"op", Filter{Op: "workspace_write"}, []Record{main}},
		{"path prefix", Filter{Path: "src/"}, []Record{main}},
		{"path prefix matches the new path", Filter{Path: "output"}, []Record{child}},
		{"result", Filter{Result: "refused"}, []Record{child}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []Record
			for _, r := range []Record{main, child, checkpoint} {
				if tc.f.Match(r) {
					got = append(got, r)
				}
			}
			if len(got) != len(tc.match) {
				t.Fatalf("matched %d records, want %d", len(got), len(tc.match))
			}
			for i := range got {
				if got[i].Op != tc.match[i].Op {
					t.Errorf("matched %s, want %s", got[i].Op, tc.match[i].Op)
				}
			}
		})
	}
}

// Records of several writers come back merged by time.
func TestQueryMergesChains(t *testing.T) {
	root := t.TempDir()
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	now := t0
	clock := func() time.Time { // one clock shared by all writers, ticking per call
		mu.Lock()
		defer mu.Unlock()
		now = now.Add(time.Second)
		return now
	}
	logs := []*Log{
		openLog(t, root, Options{Node: "a", Clock: clock, MaxFileBytes: 1 << 10}),
		openLog(t, root, Options{Node: "b", Clock: clock, MaxFileBytes: 1 << 10}),
		openLog(t, root, Options{Node: "c", Clock: clock, MaxFileBytes: 1 << 10}),
	}
	for i := range 60 {
		e := sampleEvent()
		e.CallID = fmt.Sprint(i)
		if err := logs[(i*7)%3].Record(context.Background(), e); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	err := Query(Dir(root), Filter{}, func(r Record) error {
		got = append(got, r.CallID)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 60 {
		t.Fatalf("%d records, want 60", len(got))
	}
	for i, id := range got {
		if id != fmt.Sprint(i) {
			t.Fatalf("record %d is call %s: not in time order: %v", i, id, got)
		}
	}
	stop := errors.New("stop")
	n := 0
	if err := Query(Dir(root), Filter{}, func(Record) error { n++; return stop }); err != stop || n != 1 {
		t.Errorf("Query did not stop on the callback's error: %v after %d", err, n)
	}
}

func TestTailLast(t *testing.T) {
	root := t.TempDir()
	l := openLog(t, root, Options{Node: "n", MaxFileBytes: 1 << 10})
	for i := range 30 {
		e := sampleEvent()
		e.CallID = fmt.Sprint(i)
		if i%2 == 1 {
			e.Op = "unlink"
		}
		l.Record(context.Background(), e)
	}
	var got []string
	err := Tail(context.Background(), Dir(root), Filter{Op: "unlink"}, 3, false, func(r Record) error {
		got = append(got, r.CallID)
		return nil
	})
	if err != nil || !slices.Equal(got, []string{"25", "27", "29"}) {
		t.Errorf("Tail -n 3 --op unlink = %v, %v", got, err)
	}
}

// Follow sees every record exactly once, across rotations, a writer that
// appears later and a record still being written.
func TestFollow(t *testing.T) {
	defer func(d time.Duration) { pollInterval = d }(pollInterval)
	pollInterval = 5 * time.Millisecond

	root := t.TempDir()
	first := openLog(t, root, Options{Node: "first", MaxFileBytes: 1 << 10})
	record := func(l *Log, id string) {
		e := sampleEvent()
		e.CallID = id
		if err := l.Record(context.Background(), e); err != nil {
			t.Error(err)
		}
	}
	for i := range 5 {
		record(first, fmt.Sprint("before-", i))
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan string, 1000)
	done := make(chan error, 1)
	go func() {
		done <- Follow(ctx, Dir(root), func(r Record) error {
			got <- r.CallID
			return nil
		})
	}()

	want := map[string]bool{}
	for i := range 5 {
		want[fmt.Sprint("before-", i)] = true
	}
	second := openLog(t, root, Options{Node: "second", MaxFileBytes: 1 << 10})
	for i := range 40 {
		id := fmt.Sprint("after-", i)
		want[id] = true
		if i%2 == 0 {
			record(first, id)
		} else {
			record(second, id)
		}
		if i%10 == 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	second.Close()

	// A line that arrives in two writes is delivered once, whole.
	line := `{"time":"2025-01-01T00:00:00Z","node":"third","pid":7,"kind":"event","seq":1,"prev":"","call_id":"half-written","op":"create"}` + "\n"
	want["half-written"] = true
	name := filepath.Join(Dir(root), legacyFileName("third-7-"+time.Now().UTC().Format(startLayout), 1))
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(line[:40])
	time.Sleep(30 * time.Millisecond)
	f.WriteString(line[40:])
	f.Close()

	seen := map[string]bool{}
	timeout := time.After(10 * time.Second)
	for len(seen) < len(want) {
		select {
		case id := <-got:
			if seen[id] {
				t.Errorf("record %s delivered twice", id)
			}
			if !want[id] {
				t.Errorf("unexpected record %q", id)
			}
			seen[id] = true
		case <-timeout:
			t.Fatalf("saw %d of %d records", len(seen), len(want))
		}
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Follow returned %v, want context.Canceled", err)
	}
	select {
	case id := <-got:
		t.Errorf("extra record %s", id)
	default:
	}
}

// A query by time reads only the files of its days, and returns exactly
// the records a full scan would.
func TestQuerySinceReadsItsDays(t *testing.T) {
	root := t.TempDir()
	t0 := time.Date(2025, 6, 1, 0, 0, 0, 0, time.UTC)
	now := t0
	clock := func() time.Time { return now }
	for _, node := range []string{"a", "b"} {
		now = t0
		l := openLog(t, root, Options{Node: node, Clock: clock})
		for i := range 72 { // three days, a record an hour
			e := sampleEvent()
			e.CallID = fmt.Sprint(node, i)
			if err := l.Record(context.Background(), e); err != nil {
				t.Fatal(err)
			}
			now = now.Add(time.Hour)
		}
		l.Close()
	}
	// A file a day and node, the chain whole across the days.
	if rep, err := Verify(Dir(root)); err != nil || !rep.Clean(false) || rep.Files != 6 {
		t.Fatalf("three days of two nodes: %v %v %v", rep, err, rep.Problems)
	}
	since := t0.Add(50*time.Hour + 30*time.Minute)
	var want []string
	for _, r := range queryAll(t, Dir(root), Filter{}) {
		if !r.Time.Before(since) {
			want = append(want, r.CallID)
		}
	}
	var got []string
	var last ScanProgress
	defer func(d time.Duration) { progressEvery = d }(progressEvery)
	progressEvery = 0
	err := QueryWith(Dir(root), Filter{Since: since}, func(p ScanProgress) { last = p }, func(r Record) error {
		got = append(got, r.CallID)
		return nil
	})
	if err != nil || !slices.Equal(got, want) || len(got) != 2*21 {
		t.Fatalf("since: %v %v, want %v", got, err, want)
	}
	if last.TotalFiles != 2 {
		t.Errorf("read %d files, want the last day's file of each node", last.TotalFiles)
	}
	if got := queryAll(t, Dir(root), Filter{Node: "b", Until: t0.Add(2 * time.Hour)}); len(got) != 2 || got[0].CallID != "b0" {
		t.Errorf("node and until: %v", got)
	}
}
