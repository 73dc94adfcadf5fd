package throttle

import (
	"context"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func shareDir(t *testing.T) int {
	t.Helper()
	fd, err := unix.Open(t.TempDir(), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// TestShareHoldsTheScope: two holders of one scope's limits (two processes
// or nodes serving it; here two limiters on one directory, whose OFD locks
// conflict as across processes) writing at once take together at least as
// long as the scope's rate allows for all their bytes. Alone, each would
// take half of that. Only a lower bound: an upper one would be a timing
// assertion (bench/warm.sh measures how close it holds).
func TestShareHoldsTheScope(t *testing.T) {
	dfd := shareDir(t)
	const rateB, each = 1 << 20, 1 << 20
	var ls []*Limiter
	for range 2 {
		l := newLimiter(Rates{BytesPerSec: rateB})
		if err := l.Share(dfd); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(l.Close)
		ls = append(ls, l)
	}
	start := time.Now()
	var wg sync.WaitGroup
	holders := make([]int, 2)
	for i, l := range ls {
		wg.Go(func() {
			for n := 0; n < each; n += 64 << 10 {
				l.Wait(context.Background(), 64<<10)
				holders[i] = max(holders[i], l.Holders())
			}
		})
	}
	wg.Wait()
	// Each bucket's first 100 ms come at once, and a holder may run at
	// the whole rate until its first recount sees the other.
	slack := 2*rateB/10 + 2*int(float64(rateB)*recount.Seconds())
	want := time.Duration(float64(2*each-slack) / rateB * float64(time.Second))
	if d := time.Since(start); d < want {
		t.Fatalf("two holders wrote %d bytes at a scope rate of %d/s in %v, want at least %v", 2*each, rateB, d, want)
	}
	for i, n := range holders {
		if n != 2 {
			t.Errorf("holder %d counted at most %d holders, want 2", i, n)
		}
	}
}

// TestShareLeavesAndFindsTheDead: an idle holder leaves (its file goes and
// the other is back to the whole rate), and the file of a holder that died
// (unlocked) is removed by the next count instead of being counted.
func TestShareLeavesAndFindsTheDead(t *testing.T) {
	r, i := recount, idleAfter
	t.Cleanup(func() { recount, idleAfter = r, i }) // after the holders' Close
	recount, idleAfter = 20*time.Millisecond, 100*time.Millisecond
	dfd := shareDir(t)
	dead, err := unix.Openat(dfd, "999-dead"+holderSuffix, unix.O_CREAT|unix.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(dead) // never locked: its holder is gone
	a, b := newLimiter(Rates{OpsPerSec: 1000}), newLimiter(Rates{OpsPerSec: 1000})
	for _, l := range []*Limiter{a, b} {
		l.Share(dfd)
		t.Cleanup(l.Close)
	}
	a.Wait(context.Background(), 0)
	if n := a.Holders(); n != 1 {
		t.Fatalf("a alone counts %d holders (a dead holder's file counted?)", n)
	}
	if err := unix.Fstatat(dfd, "999-dead"+holderSuffix, new(unix.Stat_t), 0); err == nil {
		t.Error("a dead holder's file was left")
	}
	b.Wait(context.Background(), 0)
	if n := b.Holders(); n != 2 {
		t.Fatalf("b counts %d holders beside an active a", n)
	}
	if got := b.ops.Limit(); got != 500 {
		t.Errorf("b's share of 1000 ops/s between two holders: %v", got)
	}
	// a stays active and sees b at its next recount; then b goes idle
	// and leaves, and a is back to the whole rate.
	until := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: a counts %d holders at %v ops/s", what, a.Holders(), a.ops.Limit())
			}
			a.Wait(context.Background(), 0)
			time.Sleep(5 * time.Millisecond)
		}
	}
	until("a never saw b", func() bool { return a.Holders() == 2 && a.ops.Limit() == 500 })
	until("after b went idle", func() bool { return a.Holders() == 1 && a.ops.Limit() == 1000 })
	names, _ := os.ReadDir("/proc/self/fd/" + itoa(dfd))
	if len(names) != 1 {
		t.Errorf("%d holder files with one holder active: %v", len(names), names)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }
