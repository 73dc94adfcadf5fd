package budget_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentloom/loomfs/budget"
)

func TestRun(t *testing.T) {
	boom := errors.New("boom")
	cases := []struct {
		name     string
		block    bool // f waits until released, after the caller's budget
		err      error
		wantErr  error
		wantUndo bool
	}{
		{name: "result within the budget is returned", wantErr: nil},
		{name: "error within the budget is returned", err: boom, wantErr: boom},
		{name: "late success is undone", block: true, wantErr: context.DeadlineExceeded, wantUndo: true},
		{name: "late failure has nothing to undo", block: true, err: boom, wantErr: context.DeadlineExceeded},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			release := make(chan struct{})
			finished := make(chan struct{})
			var undone atomic.Int32
			v, err := budget.Run(ctx, func() (int, error) {
				defer close(finished)
				if tc.block {
					<-release
				}
				return 7, tc.err
			}, func(v int) { undone.Add(int32(v)) })
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if err == nil && v != 7 {
				t.Fatalf("v = %d, want 7", v)
			}
			close(release)
			<-finished
			// undo runs after f returns; give the hand-over a moment.
			deadline := time.Now().Add(time.Second)
			for tc.wantUndo && undone.Load() == 0 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			if got := undone.Load() == 7; got != tc.wantUndo {
				t.Fatalf("undone = %v, want %v", got, tc.wantUndo)
			}
		})
	}
}

// However close to the deadline f returns, its result is either returned
// or undone: never both, never neither.
func TestRunReturnsOrUndoes(t *testing.T) {
	for i := 0; i < 200; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%5)*time.Microsecond)
		undone := make(chan struct{}, 1)
		_, err := budget.Run(ctx, func() (int, error) { return 1, nil }, func(int) { undone <- struct{}{} })
		cancel()
		if err == nil {
			select {
			case <-undone:
				t.Fatal("a result returned to the caller was undone")
			case <-time.After(time.Millisecond):
			}
			continue
		}
		select {
		case <-undone:
		case <-time.After(5 * time.Second):
			t.Fatal("a result the caller never got was not undone")
		}
	}
}
