package store

import (
	"context"
	"errors"
	"sync"

	"github.com/agentloom/loomfs/budget"
	"github.com/agentloom/loomfs/policy"
)

// within runs f under the caller's budget (budget.Run), counting it in
// late until it returns: a Close waits for it instead of closing the fds a
// system call stuck in the kernel still uses.
func within[T any](ctx context.Context, late *sync.WaitGroup, f func() (T, error), undo func(T)) (T, error) {
	late.Add(1)
	return budget.Run(ctx, func() (T, error) {
		defer late.Done()
		return f()
	}, undo)
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
