package store

import (
	"context"
	"errors"
	"sync"

	"github.com/agentloom/loomfs/budget"
	"github.com/agentloom/loomfs/policy"
)

// within runs f under the caller's budget (budget.Run), counting it in
// late until it returns and, if its caller has gone by then, until what it
// returned is undone: a Close waits for it instead of closing the fds a
// system call stuck in the kernel still uses, and once Close returns
// nothing a call that outlived its budget took is still held. Counting
// only f would let a Close return between f's end and the undo, while the
// abandoned call still held what it took (the scope lock, for a caller
// that had already been told the scope was busy), and the undo would then
// keep its lock file in a closed Workspace for good.
func within[T any](ctx context.Context, late *sync.WaitGroup, f func() (T, error), undo func(T)) (T, error) {
	type result struct {
		v   T
		err error
	}
	late.Add(1)
	// f's own error travels in its result, so that budget.Run hands every
	// late result to the undo below, which ends the count either way; an
	// error from Run itself means only that the caller's budget ran out.
	r, err := budget.Run(ctx, func() (result, error) {
		v, err := f()
		return result{v, err}, nil
	}, func(r result) {
		defer late.Done()
		if r.err == nil && undo != nil {
			undo(r.v)
		}
	})
	if err != nil {
		var zero T
		return zero, err
	}
	late.Done()
	return r.v, r.err
}

// overBudget reports whether err is budget.Run's answer that the caller's
// context ran out before the call returned, rather than the call's own
// error (a refusal, or the deadline noticed by the call itself).
func overBudget(err error) bool {
	var pe *policy.Error
	return err != nil && !errors.As(err, &pe) &&
		(errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled))
}

// storageTimeout is the refusal of an entry point whose storage did not
// answer within the caller's budget.
func storageTimeout(op string, err error) error {
	if errors.Is(err, context.Canceled) {
		return policy.Errorf(policy.Cancelled, "%s cancelled", op)
	}
	return &policy.Error{Code: policy.Timeout, Err: err,
		Message: op + ": the workspace's storage did not answer within the call's budget; retry later, and tell the operator if it persists"}
}
