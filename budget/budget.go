// Package budget bounds a blocking call by its caller's context. A system
// call on a shared filesystem can wait in the kernel far longer than any
// caller may (a hung NFS server, a CephFS client that died holding
// capabilities the survivor needs), and the kernel can't be told to give
// up. Run answers the caller when its context is done and leaves the call
// its goroutine; what the call returns after that is undone, never used.
//
// It must never be used for a call whose late completion can't be undone
// or does harm: the caller is answered as if it had not happened.
package budget

import (
	"context"
	"fmt"
)

// Run calls f in its own goroutine and returns what f returns, or, when
// ctx is done first, an error wrapping ctx.Err(). f still runs to its end
// then; if it succeeds, undo (if not nil) is given its result, so a lock
// is released and a file closed by whoever took them.
func Run[T any](ctx context.Context, f func() (T, error), undo func(T)) (T, error) {
	type outcome struct {
		v   T
		err error
	}
	// An unbuffered hand-over: either the caller receives the outcome or
	// it has gone, and then abandoned is closed and the outcome undone.
	// Never both, never neither.
	out := make(chan outcome)
	abandoned := make(chan struct{})
	go func() {
		v, err := f()
		select {
		case out <- outcome{v, err}:
		case <-abandoned:
			if err == nil && undo != nil {
				undo(v)
			}
		}
	}()
	select {
	case o := <-out:
		return o.v, o.err
	case <-ctx.Done():
		// A result ready as the budget ends is taken, not undone.
		select {
		case o := <-out:
			return o.v, o.err
		default:
		}
		close(abandoned)
		var zero T
		return zero, fmt.Errorf("%w", context.Cause(ctx))
	}
}
