package policy

import "time"

// Hooks are the policy file's command hooks of the tool door, in Claude
// Code's shape: each runs a program, given the call as JSON on stdin,
// before the tools it names run (Before: it may deny the call) or after
// (After: it sees the outcome). Package hooks runs them; the policy only
// says which.
type Hooks struct {
	Before []HookCommand
	After  []HookCommand
}

// HookCommand is one command hook.
type HookCommand struct {
	// Tools are the tool names it runs for; empty means every tool.
	Tools []string
	// Command is the program and its arguments, run without a shell
	// unless it is one ("sh", "-c", "...").
	Command []string
	// Timeout bounds one run (DefaultHookTimeout when zero); the call's
	// own budget bounds it too.
	Timeout time.Duration
	// Rewrite lets a before hook give the call new arguments; they are
	// validated and checked by the policy as the model's would be.
	Rewrite bool
}

// DefaultHookTimeout bounds a command hook that sets no timeout.
const DefaultHookTimeout = 5 * time.Second

// Empty reports whether there are no hooks.
func (h Hooks) Empty() bool { return len(h.Before) == 0 && len(h.After) == 0 }
