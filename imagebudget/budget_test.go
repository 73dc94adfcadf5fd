package imagebudget_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/agentloom/loomfs/imagebudget"
)

// acquireAsync starts an Acquire and returns the channel its outcome
// arrives on.
func acquireAsync(ctx context.Context, b *imagebudget.Budget, n int64) chan func() {
	got := make(chan func(), 1)
	go func() {
		release, err := b.Acquire(ctx, n)
		if err != nil {
			release = nil
		}
		got <- release
	}()
	return got
}

// waitFor waits until n charges wait for b.
func waitFor(t *testing.T, b *imagebudget.Budget, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); b.Waiting() != n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d charges wait, want %d", b.Waiting(), n)
		}
	}
}

func TestAcquire(t *testing.T) {
	t.Run("a charge over the whole budget is refused at once", func(t *testing.T) {
		b := imagebudget.New(100)
		_, err := b.Acquire(context.Background(), 101)
		var tl *imagebudget.TooLargeError
		if !errors.As(err, &tl) || tl.Need != 101 || tl.Limit != 100 {
			t.Fatalf("got %v, want a TooLargeError of 101 over 100", err)
		}
	})
	t.Run("charges that fit together go at once and come back", func(t *testing.T) {
		b := imagebudget.New(100)
		r1, err1 := b.Acquire(context.Background(), 60)
		r2, err2 := b.Acquire(context.Background(), 40)
		if err1 != nil || err2 != nil || b.Used() != 100 {
			t.Fatalf("%v %v, used %d", err1, err2, b.Used())
		}
		r1()
		r1() // a second call gives nothing back twice
		if b.Used() != 40 {
			t.Fatalf("used %d after one release, want 40", b.Used())
		}
		r2()
		if b.Used() != 0 {
			t.Fatalf("used %d after both, want 0", b.Used())
		}
	})
	t.Run("a charge that does not fit now waits, and a later small one does not overtake it", func(t *testing.T) {
		b := imagebudget.New(100)
		r1, _ := b.Acquire(context.Background(), 60)
		big := acquireAsync(context.Background(), b, 50)
		waitFor(t, b, 1)
		small := acquireAsync(context.Background(), b, 10)
		waitFor(t, b, 2)
		select {
		case <-big:
			t.Fatal("50 granted while 60 of 100 are held")
		case <-small:
			t.Fatal("10 granted before the 50 that came first")
		default:
		}
		r1()
		rBig, rSmall := <-big, <-small
		if rBig == nil || rSmall == nil || b.Used() != 60 {
			t.Fatalf("after the release: big %v, small %v, used %d", rBig != nil, rSmall != nil, b.Used())
		}
		rBig()
		rSmall()
	})
	t.Run("a wait ends with its context and leaves nothing held or queued", func(t *testing.T) {
		b := imagebudget.New(100)
		r1, _ := b.Acquire(context.Background(), 100)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
		defer cancel()
		if _, err := b.Acquire(ctx, 50); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("got %v, want the deadline", err)
		}
		r1()
		if b.Used() != 0 || b.Waiting() != 0 {
			t.Fatalf("used %d, %d waiting, want none", b.Used(), b.Waiting())
		}
		r, err := b.Acquire(context.Background(), 100) // the gone waiter blocks nobody
		if err != nil {
			t.Fatal(err)
		}
		r()
	})
}
