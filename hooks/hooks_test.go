package hooks

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/agentloom/loomfs/policy"
)

// A command hook gets the call as JSON on stdin in Claude Code's shape,
// runs with a minimal environment outside any shell it did not ask for,
// and a trusted one rewrites by its stdout.
func TestCommandHook(t *testing.T) {
	t.Setenv("AGENT_LOOM_SECRET", "must-not-leak")
	call := Call{Tool: "workspace_write", Input: json.RawMessage(`{"path":"a","content":"b"}`), CallID: "c1", TraceID: "t1",
		Scope: Scope{Space: "sp", Agent: "ag", Session: "se"}}
	// The hook denies with what it saw, so the test reads it back.
	seen := CommandBefore(policy.HookCommand{Command: []string{"sh", "-c", `{ cat; echo; env; } >&2; exit 2`}, Timeout: 5 * time.Second})
	_, err := (&Chain{Before: []Before{seen}}).RunBefore(context.Background(), call)
	msg := policy.AsError(err).Message
	for _, want := range []string{`"hook_event_name":"PreToolUse"`, `"tool_name":"workspace_write"`, `"tool_input":{"path":"a","content":"b"}`,
		`"call_id":"c1"`, `"scope":{"space":"sp","agent":"ag","session":"se"}`, "LANG=C.UTF-8"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the hook did not see %s:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "must-not-leak") || strings.Count(msg, "=") != 3 { // PATH, LANG and the shell's PWD

		t.Errorf("the hook's environment holds loomfs's: %s", msg)
	}

	rw := CommandBefore(policy.HookCommand{Rewrite: true, Timeout: 5 * time.Second,
		Command: []string{"echo", `{"hookSpecificOutput":{"updatedInput":{"path":"b","content":"c"}}}`}})
	d, err := (&Chain{Before: []Before{rw}}).RunBefore(context.Background(), call)
	if err != nil || string(d.Input) != `{"path":"b","content":"c"}` || d.RewrittenBy != "command:echo" {
		t.Errorf("rewrite: %+v %v", d, err)
	}
	// No shell: the argument is one word, not a command line.
	lit := CommandBefore(policy.HookCommand{Command: []string{"echo", "; exit 2"}, Timeout: 5 * time.Second})
	if _, err := (&Chain{Before: []Before{lit}}).RunBefore(context.Background(), call); err == nil || policy.AsError(err).Err == nil || !strings.Contains(policy.AsError(err).Err.Error(), "not JSON") {
		t.Errorf("echo '; exit 2' ran as a shell line or passed: %v", err)
	}
}

// A command hook past its timeout is killed with every process it
// started, and the call is answered at its timeout.
func TestCommandHookTimeoutKillsItsGroup(t *testing.T) {
	h := CommandBefore(policy.HookCommand{Command: []string{"sh", "-c", "sleep 30 & sleep 30 & wait"}, Timeout: 200 * time.Millisecond})
	begun := time.Now()
	_, err := (&Chain{Before: []Before{h}}).RunBefore(context.Background(), Call{Tool: "workspace_write", Input: json.RawMessage(`{}`)})
	if took := time.Since(begun); took > 2*time.Second {
		t.Errorf("answered after %v", took)
	}
	if pe := policy.AsError(err); pe.Code != policy.DeniedByHook || !strings.Contains(pe.Message, "timed out") {
		t.Fatalf("got %v", err)
	}
}

func TestFromPolicyRefusesUnknownTool(t *testing.T) {
	_, err := FromPolicy(policy.Hooks{Before: []policy.HookCommand{{Tools: []string{"workspace_wirte"}, Command: []string{"x"}}}}, []string{"workspace_write"})
	if err == nil || !strings.Contains(err.Error(), `unknown tool "workspace_wirte"`) {
		t.Fatalf("got %v", err)
	}
	ch, err := FromPolicy(policy.Hooks{}, []string{"workspace_write"})
	if err != nil || !Join(nil, ch).Empty() {
		t.Fatalf("no hooks: %+v %v", ch, err)
	}
}
