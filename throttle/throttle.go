// Package throttle holds each scope's I/O to the bytes and operations per
// second its policy allows (limits io_bytes_per_s and io_ops_per_s), so a
// noisy agent can't saturate the channel it shares with others (seed 001
// §5.2). Both doors of a process take from the same token buckets: a call
// over the limit is delayed, never refused. It decides no rule; it only
// waits.
//
// The limits are the scope's, across processes and nodes: a Limiter given
// the scope's throttle directory (Share) counts the other processes doing
// throttled I/O in the scope there and holds itself to its equal share
// (share.go).
package throttle

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/agentloom/loomfs/policy"
)

// Limiter is one scope's token buckets. A nil *Limiter limits nothing.
type Limiter struct {
	limits Rates
	bytes  *rate.Limiter // nil: no byte limit
	ops    *rate.Limiter // nil: no op limit

	waits  atomic.Int64 // calls that had to wait
	waited atomic.Int64 // nanoseconds waited in all

	shareMu sync.Mutex
	share   *share // nil: this process holds the limits alone
}

// Rates are a scope's I/O limits; 0 is no limit.
type Rates struct {
	BytesPerSec int64
	OpsPerSec   int64
}

// RatesOf returns the I/O limits of l.
func RatesOf(l policy.Limits) Rates {
	return Rates{BytesPerSec: l.IOBytesPerSec, OpsPerSec: l.IOOpsPerSec}
}

// burst is how much of a second's worth a bucket holds: a writer idle for
// a while may go this far ahead of its rate, no further.
const burst = 100 * time.Millisecond

var (
	mu    sync.Mutex
	byKey = map[string]*Limiter{}
)

// For returns the limiter of the scope whose hash is scope, shared by every
// door of this process, or nil when r limits nothing. A scope given other
// rates (its policy changed) gets new buckets.
func For(scope string, r Rates) *Limiter {
	if r.BytesPerSec <= 0 && r.OpsPerSec <= 0 {
		return nil
	}
	mu.Lock()
	defer mu.Unlock()
	if l := byKey[scope]; l != nil && l.limits == r {
		return l
	}
	l := newLimiter(r)
	byKey[scope] = l
	return l
}

func newLimiter(r Rates) *Limiter {
	l := &Limiter{limits: r}
	if r.BytesPerSec > 0 {
		l.bytes = rate.NewLimiter(rate.Limit(r.BytesPerSec), max(int(float64(r.BytesPerSec)*burst.Seconds()), 4096))
	}
	if r.OpsPerSec > 0 {
		l.ops = rate.NewLimiter(rate.Limit(r.OpsPerSec), max(int(float64(r.OpsPerSec)*burst.Seconds()), 1))
	}
	return l
}

// Rates returns the limits the limiter holds to.
func (l *Limiter) Rates() Rates {
	if l == nil {
		return Rates{}
	}
	return l.limits
}

// Wait takes one operation and n bytes from the buckets, waiting as long
// as that takes (or until ctx is done), and returns how long it waited.
func (l *Limiter) Wait(ctx context.Context, n int) time.Duration {
	_, d := l.Take(ctx, n)
	return d
}

// Take is Wait that also says how many of the n bytes it took before ctx
// was done: all n unless ctx ended the wait. A caller interrupted while
// it waited serves only what was taken (a FUSE write or read cut short by
// a signal answers a short count), so that a signal, which interrupts the
// wait, never lets the rest through unthrottled.
func (l *Limiter) Take(ctx context.Context, n int) (taken int, waited time.Duration) {
	if l == nil {
		return n, 0
	}
	l.active()
	start := time.Now()
	if l.ops != nil {
		l.ops.Wait(ctx)
	}
	if l.bytes == nil {
		taken = n
	} else {
		// More than a bucket holds is taken a bucketful at a time.
		for b := l.bytes.Burst(); taken < n && ctx.Err() == nil; {
			k := min(n-taken, b)
			if l.bytes.WaitN(ctx, k) != nil {
				break
			}
			taken += k
		}
	}
	d := time.Since(start)
	if d >= time.Millisecond {
		l.waits.Add(1)
		l.waited.Add(int64(d))
		return taken, d
	}
	return taken, 0
}

// Stats says how much a limiter delayed.
type Stats struct {
	Waits  int64         // calls delayed by a millisecond or more
	Waited time.Duration // in all
}

// Stats returns what the limiter delayed so far.
func (l *Limiter) Stats() Stats {
	if l == nil {
		return Stats{}
	}
	return Stats{Waits: l.waits.Load(), Waited: time.Duration(l.waited.Load())}
}
