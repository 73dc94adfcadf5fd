package tools

import (
	"context"
	"encoding/json"

	"go.uber.org/zap"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/hooks"
	"github.com/agentloom/loomfs/policy"
)

// before runs the tool.before hooks on a call whose arguments passed their
// first check, and returns the input the call goes on with and its top
// fields. A denial, or a failed hook, is the call's refusal, its record
// naming the hook; a rewrite is checked again here, and by the handler's
// own decoding and the policy as the model's input would be. The scope is
// the Toolbox's: no hook can name another.
func (t *Toolbox) before(ctx context.Context, name, callID string, input json.RawMessage, ev *audit.Event) (json.RawMessage, map[string]json.RawMessage, error) {
	d, err := t.Hooks.RunBefore(ctx, t.hookCall(ctx, name, callID, input))
	if err != nil {
		ev.Detail = map[string]any{"hook": d.DeniedBy}
		if pe := policy.AsError(err); pe.Err != nil {
			t.log().Warn("tool hook failed", zap.String("hook", d.DeniedBy), zap.String("tool", name),
				zap.String("call_id", callID), zap.Error(pe.Err))
		}
		fields, _ := topFields(name, input)
		return input, fields, err
	}
	if d.RewrittenBy != "" {
		ev.Detail = map[string]any{"rewritten_by": d.RewrittenBy}
	}
	fields, err := topFields(name, d.Input)
	return d.Input, fields, err
}

// after runs the tool.after hooks on a call's outcome, as the model gets
// it; they can't change it, and what fails of them is logged.
func (t *Toolbox) after(ctx context.Context, name, callID string, input, res json.RawMessage, err error) {
	o := hooks.Outcome{Call: t.hookCall(ctx, name, callID, input), Result: res}
	if err != nil {
		pe := policy.Public(err)
		o.Code, o.Message = string(pe.Code), pe.Message
	}
	if herr := t.Hooks.RunAfter(ctx, o); herr != nil {
		t.log().Warn("tool after hook failed", zap.String("tool", name), zap.String("call_id", callID), zap.Error(herr))
	}
}

func (t *Toolbox) hookCall(ctx context.Context, name, callID string, input json.RawMessage) hooks.Call {
	sc := t.WS.Scope()
	return hooks.Call{Tool: name, Input: input, CallID: callID, TraceID: t.traceID(ctx),
		Scope: hooks.Scope{Space: sc.Space, Agent: sc.Agent, Session: sc.Session, Run: sc.Run, Instance: sc.Instance}}
}
