package hooks

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/agentloom/loomfs/policy"
)

// FromPolicy returns the chain of the policy's command hooks, named
// "command:<program>", each run as Command runs it. Tool names are checked
// against known, so a misspelt one is an error at start, not a hook that
// never runs.
func FromPolicy(h policy.Hooks, known []string) (*Chain, error) {
	ch := &Chain{}
	check := func(c policy.HookCommand) error {
		for _, t := range c.Tools {
			if !runsFor(known, t) {
				return fmt.Errorf("hook %v: unknown tool %q (known: %s)", c.Command, t, strings.Join(known, ", "))
			}
		}
		return nil
	}
	for _, c := range h.Before {
		if err := check(c); err != nil {
			return nil, err
		}
		ch.Before = append(ch.Before, CommandBefore(c))
	}
	for _, c := range h.After {
		if err := check(c); err != nil {
			return nil, err
		}
		ch.After = append(ch.After, CommandAfter(c))
	}
	return ch, nil
}

// Join returns a chain running a's hooks, then b's.
func Join(a, b *Chain) *Chain {
	out := &Chain{}
	for _, c := range []*Chain{a, b} {
		if c != nil {
			out.Before = append(out.Before, c.Before...)
			out.After = append(out.After, c.After...)
		}
	}
	return out
}

// MaxReasonBytes bounds what is kept of a command hook's stderr (a deny's
// reason) and stdout (a rewrite).
const MaxReasonBytes = 4 << 10

// hookEnv is all a command hook's environment holds: it runs on the host,
// never in the sandbox, and is handed none of loomfs's own variables.
var hookEnv = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"}

var errExit = errors.New("exit status other than 0 or 2")

// stdin is the JSON a command hook reads, in Claude Code's shape.
type stdin struct {
	Event string `json:"hook_event_name"` // PreToolUse or PostToolUse
	Outcome
}

// CommandBefore is a before hook that runs c.Command with the call as
// JSON on stdin: exit 0 allows (a trusted hook's stdout may hold
// {"hookSpecificOutput":{"updatedInput":{...}}}, the call's new
// arguments), exit 2 denies with stderr as the reason, anything else
// fails.
func CommandBefore(c policy.HookCommand) Before {
	return Before{Name: commandName(c), Tools: c.Tools, Rewrite: c.Rewrite, Timeout: c.Timeout,
		Func: func(ctx context.Context, call Call) (Verdict, error) {
			out, reason, err := run(ctx, c.Command, stdin{Event: "PreToolUse", Outcome: Outcome{Call: call}})
			if err != nil || reason != "" {
				return Verdict{Deny: reason}, err
			}
			var v struct {
				Specific struct {
					Input json.RawMessage `json:"updatedInput"`
				} `json:"hookSpecificOutput"`
			}
			if len(bytes.TrimSpace(out)) == 0 {
				return Verdict{}, nil
			}
			if err := json.Unmarshal(out, &v); err != nil {
				return Verdict{}, fmt.Errorf("its output is not JSON: %w", err)
			}
			return Verdict{Input: v.Specific.Input}, nil
		}}
}

// CommandAfter is an after hook that runs c.Command with the outcome as
// JSON on stdin; any exit but 0 is logged.
func CommandAfter(c policy.HookCommand) After {
	return After{Name: commandName(c), Tools: c.Tools, Timeout: c.Timeout,
		Func: func(ctx context.Context, o Outcome) error {
			_, reason, err := run(ctx, c.Command, stdin{Event: "PostToolUse", Outcome: o})
			if err == nil && reason != "" {
				err = fmt.Errorf("exit status 2: %s", reason)
			}
			return err
		}}
}

func commandName(c policy.HookCommand) string { return "command:" + c.Command[0] }

// run runs argv without a shell, in its own process group (killed whole
// when ctx ends), with in as JSON on stdin. It returns stdout, and the
// reason of an exit 2 (stderr, or a default when the hook wrote none).
func run(ctx context.Context, argv []string, in any) (stdout []byte, denied string, err error) {
	payload, err := json.Marshal(in)
	if err != nil {
		return nil, "", err
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = hookEnv
	cmd.Dir = "/"
	cmd.Stdin = bytes.NewReader(payload)
	var out, errb capped
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	err = cmd.Run()
	if ctx.Err() != nil {
		return nil, "", ctx.Err()
	}
	var ee *exec.ExitError
	switch {
	case err == nil:
		return out.Bytes(), "", nil
	case errors.As(err, &ee) && ee.ExitCode() == 2:
		reason := strings.TrimSpace(errb.String())
		if reason == "" {
			reason = "denied (the hook gave no reason)"
		}
		return nil, reason, nil
	case errors.As(err, &ee):
		return nil, "", fmt.Errorf("%w: %v: %s", errExit, err, strings.TrimSpace(errb.String()))
	}
	return nil, "", fmt.Errorf("run %s: %w", argv[0], err)
}

// capped keeps the first MaxReasonBytes written to it and drops the rest.
type capped struct{ bytes.Buffer }

func (c *capped) Write(p []byte) (int, error) {
	if room := MaxReasonBytes - c.Len(); room > 0 {
		c.Buffer.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}
