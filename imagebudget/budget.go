// Package imagebudget bounds the memory that decoding images may take in
// one process. Estimate reads an image's header (and, for JPEG, its marker
// segments) and says how many bytes the standard decoders will allocate for
// it, counting what they allocate beside the pixels (Adam7 passes, 16-bit
// samples, progressive JPEG coefficients, WebP transforms); a Budget is
// shared by every read of a process, so concurrent reads add up to its
// limit and no more. It never decodes a pixel and never reads a file
// itself: callers hand it bytes or a reader.
package imagebudget

import (
	"context"
	"fmt"
	"runtime"
	"sync"
)

// Limit is the decode budget of a process: what all of its image reads
// together may hold at once. With the runtime's own overhead and the
// garbage between two collections, a process that reads images stays
// within 256 MiB of memory (BENCHMARKS.md, "Image read memory").
const Limit = 192 << 20

// Process is the budget the tool door's image reads share.
var Process = New(Limit)

// collectAbove is the release from which a collection is run at once: the
// runtime lets the heap grow to twice what was live at its last collection
// before it collects again, so without it the next read's image would be
// allocated beside this one's garbage instead of in its place.
const collectAbove = 16 << 20

// TooLargeError answers a charge that the budget could not hold even
// alone; waiting would never help.
type TooLargeError struct {
	Need, Limit int64
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("image decode needs %d bytes, over the budget of %d", e.Need, e.Limit)
}

// Budget is a count of bytes that charges are taken from and given back
// to, first come first served.
type Budget struct {
	limit int64

	mu      sync.Mutex
	used    int64
	waiters []*waiter // in arrival order
}

type waiter struct {
	n     int64
	ready chan struct{} // closed once the charge is taken for it
}

// New returns a budget of limit bytes.
func New(limit int64) *Budget {
	return &Budget{limit: limit}
}

// Limit returns the budget's size in bytes.
func (b *Budget) Limit() int64 { return b.limit }

// Acquire takes n bytes from the budget and returns the function that
// gives them back (call it when nothing of the read is referenced any
// more: a large release collects garbage first). A
// charge over the whole budget fails at once with a *TooLargeError; one
// that fits the budget but not what is left waits, in arrival order, until
// earlier charges are given back or ctx is done (then ctx.Err() is
// returned). Waiting rather than refusing means an image that fits is
// never refused only because another read ran beside it; the wait is
// bounded by the caller's context.
func (b *Budget) Acquire(ctx context.Context, n int64) (release func(), err error) {
	if n > b.limit {
		return nil, &TooLargeError{Need: n, Limit: b.limit}
	}
	n = max(n, 0)
	b.mu.Lock()
	if len(b.waiters) == 0 && b.used+n <= b.limit {
		b.used += n
		b.mu.Unlock()
		return b.releaser(n), nil
	}
	w := &waiter{n: n, ready: make(chan struct{})}
	b.waiters = append(b.waiters, w)
	b.mu.Unlock()

	select {
	case <-w.ready:
		return b.releaser(n), nil
	case <-ctx.Done():
		b.mu.Lock()
		select {
		case <-w.ready:
			// Granted while ctx ended: give it back.
			b.used -= n
		default:
			for i, o := range b.waiters {
				if o == w {
					b.waiters = append(b.waiters[:i], b.waiters[i+1:]...)
					break
				}
			}
		}
		b.grantLocked()
		b.mu.Unlock()
		return nil, ctx.Err()
	}
}

// releaser returns the function that gives n bytes back, once.
func (b *Budget) releaser(n int64) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			// Collect before the bytes are handed on, so the next
			// read's allocations take the place of this one's.
			if n >= collectAbove {
				runtime.GC()
			}
			b.mu.Lock()
			b.used -= n
			b.grantLocked()
			b.mu.Unlock()
		})
	}
}

// grantLocked hands the budget to waiters in arrival order while the first
// of them fits; a small charge never overtakes a large one that came first.
func (b *Budget) grantLocked() {
	for len(b.waiters) > 0 {
		w := b.waiters[0]
		if b.used+w.n > b.limit {
			return
		}
		b.used += w.n
		b.waiters = b.waiters[1:]
		close(w.ready)
	}
}

// Used returns the bytes charged now.
func (b *Budget) Used() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// Waiting returns how many charges wait for the budget now.
func (b *Budget) Waiting() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.waiters)
}
