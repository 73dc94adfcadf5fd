package process

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/sandbox"
	"github.com/agentloom/loomfs/store"
	"github.com/agentloom/loomfs/tools"
)

var _ tools.CommandRunner = (*Service)(nil)

// RunCommand implements tools.CommandRunner for "commands: session": the
// command runs as an exec in the scope's session sandbox, started if it
// is not running, instead of in a container of its own. The request is
// validated, timed, capped and answered as a one-shot command's, and what
// the command leaves running is killed when it ends (sandbox.Runner.Exec).
// The caller holds the scope lock.
func (s *Service) RunCommand(ctx context.Context, ws *store.Workspace, req tools.CommandRequest) (tools.CommandResult, error) {
	if err := ws.CheckQuarantine(); err != nil {
		return tools.CommandResult{}, err
	}
	b, err := s.sandbox(ctx, ws, req.CallID)
	if err != nil {
		return tools.CommandResult{}, err
	}
	return b.command(ctx, req)
}

// command runs one workspace_command in the sandbox.
func (b *Sandbox) command(ctx context.Context, req tools.CommandRequest) (tools.CommandResult, error) {
	b.mu.Lock()
	if b.stopping {
		b.mu.Unlock()
		return tools.CommandResult{}, policy.Errorf(policy.SandboxUnavailable, "%v; run the command again", errStopped)
	}
	b.cmds++ // counts as running for the idle timeout
	b.lastUse = time.Now()
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		b.cmds--
		b.lastUse = time.Now()
		b.mu.Unlock()
	}()

	var refused sandbox.Refusals
	if rp, ok := b.proj.(sandbox.ReusableProjection); ok {
		// The projection's records and refusals name this command while
		// it runs (a process of the session refusing meanwhile is counted
		// too), and it first catches up with the change journals, so the
		// command sees every change made before it.
		rp.Serve(sandbox.CallInfo{CallID: req.CallID, Run: b.scope.Run, Container: b.name, Refused: refused.Add, Trace: trace.SpanContextFromContext(ctx)})
		defer rp.Serve(sandbox.CallInfo{CallID: b.callID, Run: b.scope.Run, Container: b.name})
	}
	if err := b.proj.Probe(ctx); err != nil {
		b.Stop(ctx, "probe_failed", req.CallID)
		return tools.CommandResult{}, policy.Errorf(policy.SandboxUnavailable, "the workspace projection failed its health probe, so the command was not started: %v", err)
	}
	r := b.svc.cfg.Runner
	res, err := r.Exec(ctx, sandbox.ExecRequest{
		Container: b.id, Name: b.name, ID: newCommandID(), Command: req.Command, Timeout: req.Timeout,
		Record: func(op string, detail map[string]any) {
			detail["command"] = req.Command
			b.record(op, req.CallID, 0, detail)
		},
	})
	out := tools.CommandResult{
		ExitCode:        res.ExitCode,
		Stdout:          res.Stdout,
		Stderr:          res.Stderr,
		TimedOut:        res.TimedOut,
		StdoutTruncated: res.StdoutTruncated,
		StderrTruncated: res.StderrTruncated,
		Container:       b.name,
		DurationMS:      res.Duration.Milliseconds(),
		PolicyEvents:    refused.Events(),
	}
	switch {
	case err == nil && !b.alive():
		return out, policy.Errorf(policy.SandboxUnavailable, "the session sandbox stopped while the command ran; run it again")
	case err == nil:
		return out, nil
	case errors.Is(err, sandbox.ErrInvalidRequest):
		return out, policy.Errorf(policy.InvalidInput, "%v", err)
	case errors.Is(err, sandbox.ErrLeftRunning):
		// Only the container's removal proves the command is gone: stop
		// the sandbox (confirmed, or the scope is quarantined).
		if serr := b.Stop(ctx, "command_left_running", req.CallID); serr != nil {
			return tools.CommandResult{}, serr
		}
		if res.Cancelled {
			return out, policy.Errorf(policy.Cancelled, "the command was cancelled; the session sandbox was removed with it")
		}
		return out, nil
	case res.Cancelled:
		return out, policy.Errorf(policy.Cancelled, "the command was cancelled; its processes were killed")
	}
	// The engine failed the exec: the sandbox is not to be trusted again.
	if serr := b.Stop(ctx, "exec_failed", req.CallID); serr != nil {
		return tools.CommandResult{}, serr
	}
	return tools.CommandResult{}, policy.Errorf(policy.SandboxUnavailable, "run the command in the session sandbox: %s; run it again", policy.MaskHostPaths(err.Error()))
}

func newCommandID() string {
	var b [6]byte
	rand.Read(b[:])
	return "c-" + hex.EncodeToString(b[:])
}
