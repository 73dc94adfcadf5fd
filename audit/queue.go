package audit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// A queued Log's writer retries a failed write after retryMin, doubling
// up to retryMax; once Close is called it gives up after closeRetry.
// It keeps the chain lock for holdGap after its queue ran empty, so the
// next record of a burst needs no lock, fstat and unlock; it lets the lock
// go after holdMax even if records keep coming, and waits holdYield before
// taking it again, so the node's other writers get their turn. A
// synchronous Log holds the lock through a burst by the same holdGap and
// holdMax.
//
// Where taking the lock is dear the queued writer holds it longer, in
// proportion (holds): on CephFS a lock, its fstat and its unlock are
// round trips to the metadata server of about a millisecond, and a mount
// serving tar -x records every millisecond or two, so a hold of 500 µs
// took the lock again for nearly every record, and those round trips
// queued behind (and ahead of) the requests the mount was serving.
var (
	retryMin   = 10 * time.Millisecond
	retryMax   = time.Second
	closeRetry = 5 * time.Second
	holdGap    = 500 * time.Microsecond
	holdMax    = 5 * time.Millisecond
	holdYield  = time.Millisecond

	// The longest holds the cost of the lock stretches them to.
	holdGapMost = 20 * time.Millisecond
	holdMaxMost = 100 * time.Millisecond

	// The writer gathers records for at least gatherLeast before each
	// write (gathering).
	gatherLeast = 5 * time.Millisecond
)

// gathering returns how long the queued writer, woken by a record, lets
// more arrive before it writes, given what its last write cost: sixteen
// times that cost, at least gatherLeast and at most holdGapMost. Each look
// at the queue is a wake-up of the writer's thread, and on a shared CPU
// the switches to it and back cost the requests being served more than
// the records' own encoding: looking every half millisecond, as the writer
// did on a local disk, kept the small-file cycle of a mount pinned to one
// core 4.4% slower with the audit on, looking every 5 ms 1.8% (medians of
// 36 rounds, BENCHMARKS.md). Where a write is dear (a write to a
// ceph-fuse mount is a request its daemon serves in turn with every other,
// about half a millisecond) the longer wait also keeps the requests it
// serves from queuing behind the records, and a mount serving tar -x
// writes once for several files. SIGKILL loses what was gathered; Close
// writes it.
func gathering(cost time.Duration) time.Duration {
	return min(max(gatherLeast, 16*cost), holdGapMost)
}

// holds returns how long the queued writer keeps the chain lock past its
// last record (gap), at a stretch (most), and how long it then lets it go
// (yield), given what taking the lock costs (measured as three times
// what letting it go last took: the lock, its fstat and the unlock are a
// request each, and the unlock never waits for another writer): the gap is eight times
// that cost and the stretch ten gaps, never less than on a local disk
// (holdGap, holdMax), never more than holdGapMost and holdMaxMost; the
// yield is twice the cost, so that a waiter whose own request is as slow
// gets in, and at most holdGapMost.
func holds(cost time.Duration) (gap, most, yield time.Duration) {
	gap = min(max(holdGap, 8*cost), holdGapMost)
	most = min(max(holdMax, 10*gap), holdMaxMost)
	yield = min(max(holdYield, 2*cost), holdGapMost)
	return gap, most, yield
}

// queue holds a queued Log's records from Record to their write.
type queue struct {
	mu      sync.Mutex
	ready   chan struct{} // records arrived, or Close began
	hurry   chan struct{} // the queue is half full, or Close began: stop gathering
	ticking bool          // the writer looks again by itself: Record need not wake it
	room    sync.Cond     // records were written, or a write failed
	recs    []queued      // accepted, not yet written, oldest first
	max     int
	err     error  // the last write's failure; nil once a write succeeded
	failed  uint64 // writes that failed
	closing bool
	closeAt time.Time
	done    chan struct{} // closed when the writer goroutine returns

	// What Status reports, as of the writer's last write, so that Status
	// never waits for a write.
	status Status
}

// queued is a record waiting for its write, stamped when it was recorded;
// e's detail is in detail.
type queued struct {
	t      time.Time
	e      Event
	detail detailList
}

func newQueue(max int) *queue {
	q := &queue{max: max, ready: make(chan struct{}, 1), hurry: make(chan struct{}, 1), done: make(chan struct{})}
	q.room.L = &q.mu
	return q
}

// wake tells the writer goroutine there is work, without waiting.
func (q *queue) wake() {
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// rush tells the writer goroutine to stop gathering, without waiting.
func (q *queue) rush() {
	select {
	case q.hurry <- struct{}{}:
	default:
	}
}

// enqueue stamps e and queues it for the writer goroutine. It waits while
// the queue is full, for as long as the writer takes to make room: only
// a write that hangs (storage that does not answer) makes it wait long.
// While the last write failed it refuses.
func (l *Log) enqueue(e Event) error {
	e, d, err := frozen(e)
	if err != nil {
		return err
	}
	q := l.q
	q.mu.Lock()
	defer q.mu.Unlock()
	for {
		switch {
		case q.closing:
			return fmt.Errorf("%w: log closed", ErrUnavailable)
		case q.err != nil:
			return q.err
		}
		if len(q.recs) < q.max {
			break
		}
		q.room.Wait()
	}
	q.recs = append(q.recs, queued{t: l.opts.Clock().UTC(), e: e, detail: d})
	switch len(q.recs) {
	case 1:
		if !q.ticking {
			q.wake()
		}
	case q.max / 2:
		q.rush()
	}
	return nil
}

// frozen checks that e's detail can be encoded and copies it, sorted by
// key as encoding/json sorts them, so the record written later is the
// event as it was recorded even if the caller changes its map. A value of
// a type the encoder does not know is kept as its JSON, the bytes the
// encoder would have written. The copy is a slice, not another map: a
// release through the mount has a detail, and copying it into a map cost
// a record as much as its hash.
func frozen(e Event) (Event, detailList, error) {
	if len(e.Detail) == 0 {
		return e, nil, nil
	}
	d := make(detailList, 0, len(e.Detail))
	for k, v := range e.Detail {
		switch v.(type) {
		case string, bool, int, int64, uint32, uint64:
		default:
			var b bytes.Buffer
			enc := json.NewEncoder(&b)
			enc.SetEscapeHTML(false)
			if err := enc.Encode(v); err != nil {
				return e, nil, fmt.Errorf("%w: encode record: detail %q: %w", ErrUnavailable, k, err)
			}
			v = json.RawMessage(bytes.TrimSuffix(b.Bytes(), []byte("\n")))
		}
		d = append(d, detailField{k, v})
	}
	slices.SortFunc(d, func(a, b detailField) int { return strings.Compare(a.key, b.key) })
	e.Detail = nil
	return e, d, nil
}

// writerNice is the nice value of a queued writer's thread.
const writerNice = 10

// lowerPriority puts the calling goroutine, a queued Log's writer, on a
// thread of its own at nice writerNice. What it writes is already
// accepted, while the requests of the process serving a mount are waited
// on: at the same priority the kernel lets the writer, woken by its
// timer, preempt the request being served on a shared CPU (a daemon
// pinned to one core took 5 to 12% longer per create/stat/delete cycle
// with the audit on, against 1 to 7% with the writer at nice 10:
// BENCHMARKS.md). The queue is bounded, so the writer is never starved:
// once it is full the requests wait for it. With one P (GOMAXPROCS 1) it
// stays as it is, since a thread the kernel runs less would hold the only
// P, and every request with it.
//
// The returned func, run as the writer ends, puts the thread back at its
// nice value and lets it go back to the runtime. Where the priority can't
// be raised again (no CAP_SYS_NICE) the thread stays locked and ends with
// the writer; the runtime does end a locked thread then, except the
// process's main thread, which it parks instead, so without the restore a
// writer that ran there would leave the main thread at nice writerNice.
func lowerPriority() (restore func()) {
	if runtime.GOMAXPROCS(0) < 2 {
		return func() {}
	}
	runtime.LockOSThread()
	tid := unix.Gettid()
	// The system call answers 20 - nice.
	prio, err := unix.Getpriority(unix.PRIO_PROCESS, tid)
	// Refused, it runs at the process's priority, as it did before.
	if err != nil || unix.Setpriority(unix.PRIO_PROCESS, tid, writerNice) != nil {
		return func() {}
	}
	return func() {
		if unix.Setpriority(unix.PRIO_PROCESS, tid, 20-prio) == nil {
			runtime.UnlockOSThread()
		}
	}
}

// run is a queued Log's writer: it takes everything queued, appends it
// under one hold of the chain lock, and lets the lock go once the queue
// is empty. A failed write leaves its records queued, in order, and is
// retried, one record at a time until one is written; Record refuses
// until then.
func (l *Log) run() {
	restore := lowerPriority()
	q := l.q
	defer close(q.done)
	defer restore() // before done: Close returns with the thread as it was
	held := false
	var heldAt time.Time
	gap, most, yieldFor := holds(0)
	gather := gatherLeast
	retry := retryMin
	unlock := func() {
		start := time.Now()
		l.unlockChain()
		gap, most, yieldFor = holds(3 * time.Since(start))
		held = false
	}
	let := func() {
		l.mu.Lock()
		unlock()
		l.mu.Unlock()
	}
	for {
		q.mu.Lock()
		empty, closing := len(q.recs) == 0, q.closing
		q.mu.Unlock()
		switch {
		case empty && closing:
			if held {
				let()
			}
			return
		case empty && held:
			// In a burst: look again after gap without being woken. A
			// wake-up per record costs the recording request a futex
			// call and another thread's start, more than the record
			// itself; the timer's one wake-up per gap is shared by
			// every record of the gap.
			if !q.tick(max(gap, gather)) {
				let()
			}
			continue
		case empty:
			<-q.ready
			q.gather(gather)
			continue
		}
		q.mu.Lock()
		batch := q.recs // Record appends after it, never into it
		if q.err != nil {
			batch = batch[:1] // after a failure, one at a time: what fits is written
		}
		closeAt := q.closeAt
		q.mu.Unlock()

		l.mu.Lock()
		var n int
		var err error
		if !held {
			if err = l.lockChain(); err == nil {
				held, heldAt = true, time.Now()
			}
		}
		if err == nil {
			start := time.Now()
			n, err = l.write(batch)
			gather = gathering(time.Since(start))
		}
		yield := held && err == nil && time.Since(heldAt) >= most
		if held && (err != nil || yield) {
			unlock()
		}
		broken := l.broken
		st := Status{File: l.f.Name(), Writer: l.id, Records: l.records, Err: l.lastErr}
		l.mu.Unlock()

		q.mu.Lock()
		q.status = st
		rest := copy(q.recs, q.recs[n:])
		clear(q.recs[rest:])
		q.recs = q.recs[:rest]
		if err == nil {
			q.err, retry = nil, retryMin
		} else {
			q.err = unavailable(err)
			q.failed++
		}
		q.room.Broadcast()
		q.mu.Unlock()

		switch {
		case broken != nil:
			return // the chain can't be continued; Close reports what is lost
		case err != nil:
			if closing && time.Since(closeAt) >= closeRetry {
				return
			}
			time.Sleep(retry)
			retry = min(2*retry, retryMax)
		case yield:
			time.Sleep(yieldFor)
		}
	}
}

// tick waits d without being woken by the records that arrive meanwhile,
// or less if the queue fills to half or Close begins, and reports whether
// any arrived.
func (q *queue) tick(d time.Duration) bool {
	q.mu.Lock()
	q.ticking = true
	q.mu.Unlock()
	q.gather(d)
	q.mu.Lock()
	defer q.mu.Unlock()
	q.ticking = false
	// A wake sent before ticking began is stale now.
	select {
	case <-q.ready:
	default:
	}
	return len(q.recs) > 0 || q.closing
}

// gather waits d, or less if the queue fills to half or Close begins.
func (q *queue) gather(d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-q.hurry:
	}
}

// drain stops a queued Log taking records and waits until its writer has
// written them all, or given up; it returns an error naming what is lost.
func (l *Log) drain() error {
	q := l.q
	if q == nil {
		return nil
	}
	q.mu.Lock()
	if !q.closing {
		q.closing, q.closeAt = true, time.Now()
		q.wake()
		q.rush()
		q.room.Broadcast()
	}
	q.mu.Unlock()
	<-q.done
	q.mu.Lock()
	defer q.mu.Unlock()
	if n := len(q.recs); n > 0 {
		return fmt.Errorf("%d queued records could not be written: %w", n, q.err)
	}
	return nil
}
