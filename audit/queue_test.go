package audit

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fastRetry makes a queued Log's writer retry failed writes at once and
// give up soon after Close, for the length of a test.
func fastRetry(t *testing.T) {
	mn, mx, cl := retryMin, retryMax, closeRetry
	retryMin, retryMax, closeRetry = time.Millisecond, 5*time.Millisecond, 200*time.Millisecond
	t.Cleanup(func() { retryMin, retryMax, closeRetry = mn, mx, cl })
}

// holdChain takes the append lock of the node's current chain file
// through a file of its own, as another writer of the node would, so a
// queued Log's writer can't write until release is called.
func holdChain(t *testing.T, l *Log) (release func()) {
	t.Helper()
	l.mu.Lock()
	name := l.f.Name()
	l.mu.Unlock()
	f, err := os.OpenFile(name, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := lockRange(f, 0, 0); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() { once.Do(func() { f.Close() }) }
	t.Cleanup(release)
	return release
}

// Many goroutines recording through one queued Log, a small queue (so
// Record waits for room) and small files (so the chain rotates inside a
// write), beside a synchronous writer of the same node: every record is
// in the chain once, each goroutine's in the order it recorded them, and
// the time stamps are those of Record, in chain order.
func TestQueuedOrderAndChain(t *testing.T) {
	root := t.TempDir()
	l := openLog(t, root, Options{Node: "n", Queue: 64, MaxFileBytes: 32 << 10, Clock: fixedClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))})
	other := openLog(t, root, Options{Node: "n"})
	const workers, each = 32, 250
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				e := sampleEvent()
				e.CallID = fmt.Sprintf("%d-%d", w, i)
				e.Detail = map[string]any{"i": i, "w": strconv.Itoa(w)}
				if err := l.Record(context.Background(), e); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Go(func() {
		for i := range 200 {
			e := sampleEvent()
			e.CallID = fmt.Sprintf("other-%d", i)
			if err := other.Record(context.Background(), e); err != nil {
				t.Error(err)
				return
			}
		}
	})
	wg.Wait()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := other.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err := Verify(Dir(root))
	if err != nil || !rep.Clean(false) || len(rep.Warnings) != 0 {
		t.Fatalf("Verify: %v %v %+v %+v", rep, err, rep.Problems, rep.Warnings)
	}
	if rep.Events != workers*each+200 || len(rep.Chains) != 1 || rep.Files < 10 || rep.Nodes[0].Closed != 2 {
		t.Fatalf("report %+v: want %d events in one rotated chain, both writers closed", rep, workers*each+200)
	}
	next := make([]int, workers) // each goroutine's next record
	var last time.Time
	for _, r := range queryAll(t, Dir(root), Filter{}) {
		if strings.HasPrefix(r.CallID, "other-") {
			continue
		}
		var w, i int
		if _, err := fmt.Sscanf(r.CallID, "%d-%d", &w, &i); err != nil {
			t.Fatalf("call id %q: %v", r.CallID, err)
		}
		if i != next[w] {
			t.Fatalf("goroutine %d: record %d where %d was due", w, i, next[w])
		}
		next[w]++
		if !r.Time.After(last) {
			t.Fatalf("record %s stamped %v, not after the one before it (%v)", r.CallID, r.Time, last)
		}
		last = r.Time
	}
	for w, n := range next {
		if n != each {
			t.Errorf("goroutine %d: %d records, want %d", w, n, each)
		}
	}
}

// Record returns once the record is queued, stamped with the time of the
// call, even while the writer can't write; Close waits for the writer to
// write everything, then closes the writer in the ledger.
func TestQueuedStampsAndCloseDrains(t *testing.T) {
	root := t.TempDir()
	var mu sync.Mutex
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	setClock := func(t time.Time) { mu.Lock(); now = t; mu.Unlock() }
	l := openLog(t, root, Options{Node: "n", Queue: 16, Clock: clock})
	release := holdChain(t, l)
	var want []time.Time
	for i := range 5 {
		setClock(now.Add(time.Second))
		want = append(want, clock())
		e := sampleEvent()
		e.CallID = strconv.Itoa(i)
		if err := l.Record(context.Background(), e); err != nil {
			t.Fatal(err)
		}
	}
	if st := l.Status(); st.Queued != 5 || st.Records != 0 {
		t.Fatalf("Status %+v: want 5 records queued, none written while the chain is held", st)
	}
	setClock(now.Add(time.Hour))
	closed := make(chan error, 1)
	go func() { closed <- l.Close() }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) before its records could be written", err)
	case <-time.After(50 * time.Millisecond):
	}
	if err := l.Record(context.Background(), sampleEvent()); !errors.Is(err, ErrUnavailable) {
		t.Errorf("Record while closing: %v, want ErrUnavailable", err)
	}
	release()
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if st := l.Status(); st.Queued != 0 || st.Records != 5 || !st.Closed || st.Err != nil {
		t.Errorf("Status after Close %+v", st)
	}
	recs := queryAll(t, Dir(root), Filter{})
	if len(recs) != 5 {
		t.Fatalf("%d records, want 5", len(recs))
	}
	for i, r := range recs {
		if !r.Time.Equal(want[i]) || r.CallID != strconv.Itoa(i) {
			t.Errorf("record %d: %s at %v, want %d at %v (when Record was called)", i, r.CallID, r.Time, i, want[i])
		}
	}
	rep, err := Verify(Dir(root))
	if err != nil || !rep.Clean(false) || rep.Nodes[0].Closed != 1 {
		t.Errorf("Verify: %v %v %+v %+v", rep, err, rep.Problems, rep.Crashed)
	}
}

// fill writes to a file in dir until its filesystem is full and returns
// the file's name.
func fill(t *testing.T, dir string) string {
	t.Helper()
	name := filepath.Join(dir, "filler")
	f, err := os.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	block := make([]byte, 512)
	for {
		if _, err := f.Write(block); err != nil {
			if !errors.Is(err, unix.ENOSPC) {
				t.Fatal(err)
			}
			return name
		}
	}
}

// On a full disk the writer's write fails: the records stay queued,
// Record refuses from then on (ErrUnavailable, wrapping ENOSPC), and once
// there is room again the writer writes them all and Record accepts
// again. No record Record accepted is lost.
func TestQueuedDiskFull(t *testing.T) {
	fastRetry(t)
	root := tinyTmpfs(t)
	l := openLog(t, root, Options{Node: "n", Queue: 64}) // a queue that fits the disk
	ctx := context.Background()
	if err := l.Record(ctx, sampleEvent()); err != nil {
		t.Fatal(err)
	}
	for l.Status().Queued > 0 {
		time.Sleep(time.Millisecond)
	}
	filler := fill(t, root)
	accepted := 1
	var err error
	deadline := time.Now().Add(10 * time.Second)
	for ; time.Now().Before(deadline); accepted++ {
		e := sampleEvent()
		e.CallID = strconv.Itoa(accepted)
		if err = l.Record(ctx, e); err != nil {
			break
		}
	}
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("Record on a full disk: %v, want ErrUnavailable wrapping ENOSPC", err)
	}
	st := l.Status()
	if st.Queued == 0 || st.Failed == 0 || !errors.Is(st.Err, unix.ENOSPC) {
		t.Fatalf("Status on a full disk %+v: want records queued, failed writes and the error", st)
	}
	t.Logf("disk full: %d records accepted, %d queued, %d failed writes", accepted, st.Queued, st.Failed)
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	// The writer retries on its own; Record accepts once a write succeeded.
	for err != nil && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
		e := sampleEvent()
		e.CallID = strconv.Itoa(accepted)
		if err = l.Record(ctx, e); err == nil {
			accepted++
		}
	}
	if err != nil {
		t.Fatalf("Record once the disk has room: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err := Verify(Dir(root))
	if err != nil || !rep.Clean(false) || len(rep.Warnings) != 0 || rep.Events != accepted {
		t.Fatalf("Verify: %v %v problems %+v warnings %+v; want %d events", rep, err, rep.Problems, rep.Warnings, accepted)
	}
	for i, r := range queryAll(t, Dir(root), Filter{}) {
		if want := strconv.Itoa(i); i > 0 && r.CallID != want {
			t.Fatalf("record %d is call %s", i, r.CallID)
		}
	}
}

// A queue that still can't be written when Close gives up is lost, and
// said to be: Close fails, naming how many, and the writer has no close
// entry, so Verify reports it as ended without closing.
func TestQueuedCloseOnFullDisk(t *testing.T) {
	fastRetry(t)
	root := tinyTmpfs(t)
	l := openLog(t, root, Options{Node: "n", Queue: DefaultQueue})
	filler := fill(t, root)
	e := sampleEvent()
	e.Detail = map[string]any{"blob": strings.Repeat("x", 3000)}
	if err := l.Record(context.Background(), e); err != nil {
		t.Fatal(err)
	}
	err := l.Close()
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "1 queued records could not be written") {
		t.Fatalf("Close on a full disk: %v", err)
	}
	os.Remove(filler)
	rep, verr := Verify(Dir(root))
	if verr != nil || !rep.OK() || len(rep.Crashed) != 1 || rep.Clean(false) || rep.Events != 0 {
		t.Errorf("Verify: %v %v problems %+v ended without closing %+v", rep, verr, rep.Problems, rep.Crashed)
	}
}

// A detail value of a type the encoder does not know is kept as the JSON
// it had when recorded; one that can't be encoded is refused by Record.
func TestQueuedDetailFrozen(t *testing.T) {
	root := t.TempDir()
	l := openLog(t, root, Options{Node: "n", Queue: 4})
	release := holdChain(t, l)
	type point struct{ X, Y int }
	p := &point{1, 2}
	e := sampleEvent()
	e.Detail = map[string]any{"p": p, "tags": []string{"a<b"}, "n": 3}
	if err := l.Record(context.Background(), e); err != nil {
		t.Fatal(err)
	}
	p.X, e.Detail["n"] = 99, 4 // the caller changes what it recorded
	bad := sampleEvent()
	bad.Detail = map[string]any{"f": func() {}}
	if err := l.Record(context.Background(), bad); !errors.Is(err, ErrUnavailable) {
		t.Errorf("Record of an unencodable detail: %v, want ErrUnavailable", err)
	}
	release()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	recs := queryAll(t, Dir(root), Filter{})
	if len(recs) != 1 {
		t.Fatalf("%d records, want 1", len(recs))
	}
	got := fmt.Sprint(recs[0].Detail)
	if want := "map[n:3 p:map[X:1 Y:2] tags:[a<b]]"; got != want {
		t.Errorf("detail %s, want %s", got, want)
	}
}

// A detail that can't be encoded is refused by a synchronous Log too, which
// writes nothing of it and goes on with the next record.
func TestSyncDetailRefused(t *testing.T) {
	root := t.TempDir()
	l := openLog(t, root, Options{Node: "n"})
	bad := sampleEvent()
	bad.Detail = map[string]any{"f": func() {}}
	if err := l.Record(context.Background(), bad); !errors.Is(err, ErrUnavailable) {
		t.Errorf("Record of an unencodable detail: %v, want ErrUnavailable", err)
	}
	e := sampleEvent()
	e.Detail = map[string]any{"b": 2, "a": "x"}
	if err := l.Record(context.Background(), e); err != nil {
		t.Fatalf("Record after the refusal: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	recs := queryAll(t, Dir(root), Filter{})
	if len(recs) != 1 || fmt.Sprint(recs[0].Detail) != "map[a:x b:2]" {
		t.Fatalf("records %+v, want the one with detail a, b", recs)
	}
	// Keys sorted as encoding/json sorts them, in the line itself.
	chain, _ := filepath.Glob(filepath.Join(Dir(root), "n.*.000001.jsonl"))
	if len(chain) != 1 {
		t.Fatalf("chain files %v, want one", chain)
	}
	if b, err := os.ReadFile(chain[0]); err != nil || !strings.Contains(string(b), `"detail":{"a":"x","b":2}`) {
		t.Errorf("chain file (%v):\n%s\nwant the detail's keys in order", err, b)
	}
	if rep, err := Verify(Dir(root)); err != nil || !rep.OK() {
		t.Errorf("verify after the refusal: %v, %v", rep, err)
	}
}

// TestHolds: the queued writer holds the chain lock as on a local disk
// where the lock is cheap, longer in proportion where it is dear, and
// never past the bounds.
func TestHolds(t *testing.T) {
	for _, tc := range []struct {
		cost                time.Duration
		gap, most, yieldFor time.Duration
	}{
		{0, holdGap, holdMax, holdYield},
		{5 * time.Microsecond, holdGap, holdMax, holdYield},
		{time.Millisecond, 8 * time.Millisecond, 80 * time.Millisecond, 2 * time.Millisecond},
		{time.Second, holdGapMost, holdMaxMost, holdGapMost},
	} {
		gap, most, yieldFor := holds(tc.cost)
		if gap != tc.gap || most != tc.most || yieldFor != tc.yieldFor {
			t.Errorf("holds(%v) = %v, %v, %v; want %v, %v, %v", tc.cost, gap, most, yieldFor, tc.gap, tc.most, tc.yieldFor)
		}
	}
}

// TestGathering: the queued writer gathers for gatherLeast where a write
// is cheap and in proportion where it is dear, never past the bound.
func TestGathering(t *testing.T) {
	for _, tc := range []struct {
		cost, want time.Duration
	}{
		{0, gatherLeast},
		{20 * time.Microsecond, gatherLeast},
		{gatherLeast / 16, gatherLeast},
		{500 * time.Microsecond, 8 * time.Millisecond},
		{time.Second, holdGapMost},
	} {
		if got := gathering(tc.cost); got != tc.want {
			t.Errorf("gathering(%v) = %v, want %v", tc.cost, got, tc.want)
		}
	}
}

// A queued Log's writer runs on a thread of its own at nice writerNice
// when the process has more than one P, and at the process's priority
// with one; the thread goes with the writer at Close.
func TestQueuedWriterPriority(t *testing.T) {
	for _, procs := range []int{1, 2} {
		t.Run(fmt.Sprintf("GOMAXPROCS=%d", procs), func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			before := threadsAtNice(t, writerNice)
			l := openLog(t, t.TempDir(), Options{Node: "n", Queue: 4})
			if err := l.Record(context.Background(), sampleEvent()); err != nil {
				t.Fatal(err)
			}
			want := before
			if procs > 1 {
				want++
			}
			// The writer lowers its priority when it starts, which Record
			// does not wait for.
			deadline := time.Now().Add(5 * time.Second)
			for threadsAtNice(t, writerNice) != want && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			if got := threadsAtNice(t, writerNice); got != want {
				t.Fatalf("%d threads at nice %d with the log open, want %d", got, writerNice, want)
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			deadline = time.Now().Add(5 * time.Second)
			for threadsAtNice(t, writerNice) != before && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			if got := threadsAtNice(t, writerNice); got != before {
				t.Fatalf("%d threads at nice %d after Close, want %d", got, writerNice, before)
			}
		})
	}
}

// threadsAtNice counts the process's threads whose nice value is nice.
func threadsAtNice(t *testing.T, nice int) int {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, task := range tasks {
		b, err := os.ReadFile(filepath.Join("/proc/self/task", task.Name(), "stat"))
		if err != nil {
			continue // the thread ended
		}
		// The fields after the command's closing parenthesis: state is
		// the first, nice the 17th.
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) > 16 && f[16] == strconv.Itoa(nice) {
			n++
		}
	}
	return n
}
