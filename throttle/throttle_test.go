package throttle

import (
	"context"
	"testing"
	"time"
)

func TestFor(t *testing.T) {
	if l := For("none", Rates{}); l != nil {
		t.Fatal("a limiter for no limits")
	}
	var none *Limiter
	if d := none.Wait(context.Background(), 1<<30); d != 0 || none.Stats().Waits != 0 {
		t.Fatal("a nil limiter waited")
	}
	a := For("scope-a", Rates{BytesPerSec: 1 << 20})
	if For("scope-a", Rates{BytesPerSec: 1 << 20}) != a {
		t.Fatal("two doors of one scope got different buckets")
	}
	if For("scope-b", Rates{BytesPerSec: 1 << 20}) == a {
		t.Fatal("two scopes share a bucket")
	}
	if b := For("scope-a", Rates{BytesPerSec: 2 << 20}); b == a || b.Rates().BytesPerSec != 2<<20 {
		t.Fatal("new rates kept the old bucket")
	}
}

// TestWaitHoldsTheRate: taking more than a bucket holds (one FUSE write of
// 1 MiB against 256 KiB/s) waits, a bucketful at a time, at least as long
// as the rate says; no bucket can be beaten. An upper bound would be a
// timing assertion; bench/warm.sh measures how close it holds.
func TestWaitHoldsTheRate(t *testing.T) {
	l := For("rate", Rates{BytesPerSec: 256 << 10})
	start := time.Now()
	total := 0
	for total < 1<<20 {
		l.Wait(context.Background(), 128<<10)
		total += 128 << 10
	}
	// The first bucketful (100 ms of rate) comes at once.
	want := time.Duration(float64(total-(256<<10)/10)/float64(256<<10)*float64(time.Second)) * 9 / 10
	if d := time.Since(start); d < want {
		t.Fatalf("%d bytes at 256 KiB/s took %v, want at least %v", total, d, want)
	}
	if s := l.Stats(); s.Waits == 0 || s.Waited == 0 {
		t.Fatalf("stats %+v after waiting", s)
	}
	// A cancelled wait returns.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	l.Wait(ctx, 10<<20)
}

func TestOpsRate(t *testing.T) {
	l := For("ops", Rates{OpsPerSec: 50})
	start := time.Now()
	for range 30 {
		l.Wait(context.Background(), 0)
	}
	// 5 come at once (100 ms of rate), then 25 at 50/s.
	if d := time.Since(start); d < 400*time.Millisecond {
		t.Fatalf("30 ops at 50/s took %v", d)
	}
}

// TestTakeInterrupted: a wait cut short by its context says how much it
// took, less than asked, so the caller moves only that.
func TestTakeInterrupted(t *testing.T) {
	l := For("take-interrupted", Rates{BytesPerSec: 40 << 10})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	taken, _ := l.Take(ctx, 1<<20)
	if taken <= 0 || taken >= 1<<20 {
		t.Fatalf("a wait for 1 MiB at 40 KiB/s cut off after 300 ms took %d bytes", taken)
	}
	if taken, _ := l.Take(context.Background(), 0); taken != 0 {
		t.Errorf("took %d of 0 bytes", taken)
	}
}
