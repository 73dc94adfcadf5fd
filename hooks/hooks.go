package hooks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/agentloom/loomfs/policy"
)

// Scope names the scope a call runs in, as the platform's ids.
type Scope struct {
	Space    string `json:"space"`
	Agent    string `json:"agent"`
	Session  string `json:"session"`
	Run      string `json:"run,omitempty"`
	Instance string `json:"instance,omitempty"`
}

// Call is what a before hook is told of a call. Input is a copy of the
// call's arguments after their first validation (a JSON object with the
// schema's required fields).
type Call struct {
	Tool    string          `json:"tool_name"`
	Input   json.RawMessage `json:"tool_input"`
	CallID  string          `json:"call_id,omitempty"`
	TraceID string          `json:"trace_id,omitempty"`
	Scope   Scope           `json:"scope"`
}

// Outcome is what an after hook is told: the call and its result, or the
// code and message of its refusal.
type Outcome struct {
	Call
	Result  json.RawMessage `json:"tool_response,omitempty"`
	Code    string          `json:"error_code,omitempty"`
	Message string          `json:"error_message,omitempty"`
}

// Verdict is a before hook's answer: allow (the zero value), deny with
// Deny's reason, or, for a hook registered with Rewrite, allow with Input
// as the call's new arguments.
type Verdict struct {
	Deny  string
	Input json.RawMessage
}

// Before is a tool.before hook.
type Before struct {
	// Name says which hook decided, in audit records and messages.
	Name string
	// Tools are the tools it runs for; empty means every tool.
	Tools []string
	// Rewrite trusts the hook to give new arguments; an untrusted hook
	// that returns some fails.
	Rewrite bool
	// Timeout bounds one run (DefaultTimeout when zero), within the
	// call's own budget.
	Timeout time.Duration
	Func    func(ctx context.Context, c Call) (Verdict, error)
}

// After is a tool.after hook. What it returns is logged; it can't change
// the outcome.
type After struct {
	Name    string
	Tools   []string
	Timeout time.Duration
	Func    func(ctx context.Context, o Outcome) error
}

// DefaultTimeout bounds a hook that sets no timeout.
const DefaultTimeout = policy.DefaultHookTimeout

// Chain is the hooks of one tool door, run in order. A nil or empty Chain
// runs nothing and costs a length check.
type Chain struct {
	Before []Before
	After  []After
}

// Decision is what the before hooks decided: the input the call goes on
// with (the original when none rewrote it), the hook that rewrote it, or
// the hook that denied it.
type Decision struct {
	Input       json.RawMessage
	RewrittenBy string
	DeniedBy    string
}

// RunBefore runs the before hooks for c in order. A hook's rewritten
// input is what the next hook sees. A denial, or a hook that fails
// (errors, panics, times out, or rewrites untrusted), ends the chain with
// a denied_by_hook refusal; a failure's detail goes in the error's Err,
// for the operator's log.
func (ch *Chain) RunBefore(ctx context.Context, c Call) (Decision, error) {
	d := Decision{Input: c.Input}
	if ch == nil {
		return d, nil
	}
	for i := range ch.Before {
		h := &ch.Before[i]
		if !runsFor(h.Tools, c.Tool) {
			continue
		}
		c.Input = slices.Clone(d.Input)
		v, err := within(ctx, h.Timeout, func(ctx context.Context) (Verdict, error) { return h.Func(ctx, c) })
		switch {
		case err != nil:
			d.DeniedBy = h.Name
			return d, failed(h.Name, c.Tool, err)
		case v.Deny != "":
			d.DeniedBy = h.Name
			return d, Denied(h.Name, v.Deny)
		case v.Input != nil && !h.Rewrite:
			d.DeniedBy = h.Name
			return d, failed(h.Name, c.Tool, fmt.Errorf("%w: it is not trusted to", errRewrite))
		case v.Input != nil:
			var obj map[string]json.RawMessage
			if json.Unmarshal(v.Input, &obj) != nil || obj == nil {
				d.DeniedBy = h.Name
				return d, failed(h.Name, c.Tool, fmt.Errorf("%w: not a JSON object", errRewrite))
			}
			d.Input, d.RewrittenBy = slices.Clone(v.Input), h.Name
		}
	}
	return d, nil
}

// RunAfter runs the after hooks for o, each within its timeout, and
// returns what failed; the outcome is the call's whatever they do.
func (ch *Chain) RunAfter(ctx context.Context, o Outcome) error {
	if ch == nil {
		return nil
	}
	var errs []error
	for i := range ch.After {
		h := &ch.After[i]
		if !runsFor(h.Tools, o.Tool) {
			continue
		}
		oc := o
		oc.Input, oc.Result = slices.Clone(o.Input), slices.Clone(o.Result)
		_, err := within(ctx, h.Timeout, func(ctx context.Context) (struct{}, error) { return struct{}{}, h.Func(ctx, oc) })
		if err != nil {
			errs = append(errs, fmt.Errorf("after hook %q: %w", h.Name, err))
		}
	}
	return errors.Join(errs...)
}

// Empty reports whether the chain runs nothing.
func (ch *Chain) Empty() bool { return ch == nil || len(ch.Before)+len(ch.After) == 0 }

// Denied is the refusal of a call a hook denied, with its reason.
func Denied(hook, reason string) *policy.Error {
	return policy.Errorf(policy.DeniedByHook, "%s (the platform's hook %q denied this call; the same call will be denied again: change what it asks, or do something else)",
		policy.MaskHostPaths(reason), hook)
}

// failed is the refusal of a call whose hook failed: it fails closed.
func failed(hook, tool string, err error) *policy.Error {
	return &policy.Error{Code: policy.DeniedByHook, Err: err,
		Message: fmt.Sprintf("the platform's hook %q failed (%s), so %s was denied and nothing was done; retry later, and tell the operator if it persists", hook, failure(err), tool)}
}

// failure says how a hook failed, in words that carry no host detail.
func failure(err error) string {
	var p panicked
	switch {
	case errors.As(err, &p):
		return "it panicked"
	case errors.Is(err, context.DeadlineExceeded):
		return "it timed out"
	case errors.Is(err, context.Canceled):
		return "the call was cancelled while it ran"
	case errors.Is(err, errExit):
		return "it exited with an error"
	case errors.Is(err, errRewrite):
		return "it gave arguments it may not give"
	}
	return "it returned an error"
}

func runsFor(tools []string, tool string) bool {
	return len(tools) == 0 || slices.Contains(tools, tool)
}

// errRewrite is a rewrite a hook may not make: untrusted, or not a JSON
// object.
var errRewrite = errors.New("rewrote the call's arguments")

type panicked struct{ v any }

func (p panicked) Error() string { return fmt.Sprintf("panic: %v", p.v) }

// within runs f with a context bounded by timeout and ctx, and returns
// when either ends: a hook that ignores its context is left running, and
// the call goes on (denied) without it. A panic is an error.
func within[T any](ctx context.Context, timeout time.Duration, f func(context.Context) (T, error)) (T, error) {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		defer func() {
			if p := recover(); p != nil {
				r.err = panicked{p}
			}
			done <- r
		}()
		r.v, r.err = f(ctx)
	}()
	select {
	case r := <-done:
		if r.err == nil && ctx.Err() != nil {
			// Answered, but after its time: not trusted.
			var zero T
			return zero, ctx.Err()
		}
		return r.v, r.err
	case <-ctx.Done():
		var zero T
		return zero, ctx.Err()
	}
}
