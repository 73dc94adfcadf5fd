package store

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A call that outlives its caller's budget is counted until what it took
// is given back, not only until it returns: a Close that waits for the
// count must find nothing still held (a lock taken late and released a
// moment after the Close had returned was seen to leave the lock file
// open in a closed Workspace).
func TestWithinCountsTheUndo(t *testing.T) {
	boom := errors.New("boom")
	for _, lateErr := range []error{nil, boom} {
		var late sync.WaitGroup
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		release := make(chan struct{})
		var undone atomic.Bool
		_, err := within(ctx, &late, func() (int, error) {
			<-release
			return 1, lateErr
		}, func(int) {
			time.Sleep(50 * time.Millisecond) // a slow release
			undone.Store(true)
		})
		cancel()
		if !overBudget(err) {
			t.Fatalf("late error %v: err = %v, want the budget's", lateErr, err)
		}
		close(release)
		late.Wait()
		if got, want := undone.Load(), lateErr == nil; got != want {
			t.Fatalf("late error %v: undone when the wait ended = %v, want %v", lateErr, got, want)
		}
	}

	// In time: the caller gets f's result, nothing is undone, and the
	// count is back to zero.
	var late sync.WaitGroup
	v, err := within(context.Background(), &late, func() (int, error) { return 7, boom }, func(int) {
		t.Error("a result the caller got was undone")
	})
	if v != 7 || !errors.Is(err, boom) {
		t.Fatalf("in time: %v, %v; want 7, %v", v, err, boom)
	}
	late.Wait()
}
