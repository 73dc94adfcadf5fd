package tools

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentloom/loomfs/hooks"
	"github.com/agentloom/loomfs/policy"
)

// denySecrets is the reason both deny hooks give.
const denySecrets = "no writes under secrets/"

// denyShell is a command hook's program: exit 2 with the reason on stderr
// for a call whose path is under secrets/.
const denyShell = `grep -q '"path":"secrets/' && { echo "` + denySecrets + `" >&2; exit 2; }; exit 0`

// outcomes is an after hook that keeps what it is told.
type outcomes struct {
	mu   sync.Mutex
	seen []hooks.Outcome
}

func (o *outcomes) hook() hooks.After {
	return hooks.After{Name: "keep", Func: func(_ context.Context, oc hooks.Outcome) error {
		o.mu.Lock()
		defer o.mu.Unlock()
		o.seen = append(o.seen, oc)
		return nil
	}}
}

func (o *outcomes) last(t *testing.T) hooks.Outcome {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.seen) == 0 {
		t.Fatal("the after hook saw no outcome")
	}
	return o.seen[len(o.seen)-1]
}

func goHook(name string, rewrite bool, f func(ctx context.Context, c hooks.Call) (hooks.Verdict, error)) hooks.Before {
	return hooks.Before{Name: name, Tools: []string{Write}, Rewrite: rewrite, Timeout: 500 * time.Millisecond, Func: f}
}

// rewriteTo is a trusted hook that gives the call new arguments.
func rewriteTo(input string) hooks.Before {
	return goHook("rewrite", true, func(context.Context, hooks.Call) (hooks.Verdict, error) {
		return hooks.Verdict{Input: json.RawMessage(input)}, nil
	})
}

// TestHooks: the platform's hooks on the tool door (issue 48). Each before
// hook gives its documented outcome, recorded in the audit with its name;
// the after hook sees every outcome; the policy checks rewritten
// arguments as the model's, and no hook reaches another scope.
func TestHooks(t *testing.T) {
	pol, _ := policy.Preset("standard") // data/ is read-only
	for _, tc := range []struct {
		name   string
		hook   hooks.Before
		path   string
		code   policy.Code // "" allowed
		msg    string      // in the message
		record string      // the audit record's detail
		wrote  string      // the file the call made, if any
	}{
		{"a Go hook allows a write elsewhere", goHook("go-deny", false, denyUnderSecrets), "notes.txt", "", "", "", "notes.txt"},
		{"a Go hook denies a write to secrets/", goHook("go-deny", false, denyUnderSecrets), "secrets/key", policy.DeniedByHook, denySecrets, "hook=go-deny", ""},
		{"a command hook denies a write to secrets/", hooks.CommandBefore(policy.HookCommand{Tools: []string{Write}, Command: []string{"sh", "-c", denyShell}, Timeout: 5 * time.Second}),
			"secrets/key", policy.DeniedByHook, denySecrets, "hook=command:sh", ""},
		{"a command hook allows a write elsewhere", hooks.CommandBefore(policy.HookCommand{Command: []string{"sh", "-c", denyShell}, Timeout: 5 * time.Second}),
			"notes.txt", "", "", "", "notes.txt"},
		{"a rewrite into a read-only place is refused by the policy", rewriteTo(`{"path":"data/x","content":"x"}`), "notes.txt", policy.ReadOnly, "data/x is read-only", "rewritten_by=rewrite", ""},
		{"a rewrite out of the scope is refused by the policy", rewriteTo(`{"path":"../../other/main/x","content":"x"}`), "notes.txt", policy.InvalidPath, "", "rewritten_by=rewrite", ""},
		{"a rewrite naming a scope is refused by the schema", rewriteTo(`{"path":"x","content":"x","scope":"sp/ag/other"}`), "notes.txt", policy.InvalidInput, `unknown field "scope"`, "rewritten_by=rewrite", ""},
		{"a rewrite that drops a required field is refused", rewriteTo(`{"path":"x"}`), "notes.txt", policy.InvalidInput, `"content" is required`, "rewritten_by=rewrite", ""},
		{"a trusted rewrite within the rules is made", rewriteTo(`{"path":"src/moved.txt","content":"x"}`), "notes.txt", "", "", "rewritten_by=rewrite", "src/moved.txt"},
		{"an untrusted rewrite fails closed", goHook("sly", false, func(context.Context, hooks.Call) (hooks.Verdict, error) {
			return hooks.Verdict{Input: json.RawMessage(`{"path":"x","content":"y"}`)}, nil
		}), "notes.txt", policy.DeniedByHook, `hook "sly" failed (it gave arguments it may not give)`, "hook=sly", ""},
		{"a Go hook past its timeout fails closed", goHook("slow", false, func(ctx context.Context, c hooks.Call) (hooks.Verdict, error) {
			time.Sleep(2 * time.Second) // ignores its context
			return hooks.Verdict{}, nil
		}), "notes.txt", policy.DeniedByHook, "it timed out", "hook=slow", ""},
		{"a command hook past its timeout fails closed", hooks.CommandBefore(policy.HookCommand{Command: []string{"sleep", "30"}, Timeout: 300 * time.Millisecond}),
			"notes.txt", policy.DeniedByHook, "it timed out", "hook=command:sleep", ""},
		{"a hook that panics fails closed", goHook("boom", false, func(context.Context, hooks.Call) (hooks.Verdict, error) { panic("hook bug") }),
			"notes.txt", policy.DeniedByHook, "it panicked", "hook=boom", ""},
		{"a hook that errs fails closed", goHook("err", false, func(context.Context, hooks.Call) (hooks.Verdict, error) {
			return hooks.Verdict{}, errors.New("policy server at /srv/x unreachable")
		}), "notes.txt", policy.DeniedByHook, "it returned an error", "hook=err", ""},
		{"a command hook that exits 1 fails closed", hooks.CommandBefore(policy.HookCommand{Command: []string{"sh", "-c", "echo /etc/hook.conf broken >&2; exit 1"}, Timeout: 5 * time.Second}),
			"notes.txt", policy.DeniedByHook, "it exited with an error", "hook=command:sh", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb, dir := newBox(t, pol)
			sink := &memSink{}
			after := &outcomes{}
			tb.Audit = sink
			tb.Hooks = &hooks.Chain{Before: []hooks.Before{tc.hook}, After: []hooks.After{after.hook()}}
			in, _ := json.Marshal(map[string]any{"path": tc.path, "content": "secret\n"})
			begun := time.Now()
			res, err := tb.Call(context.Background(), Write, "call-1", in)
			if took := time.Since(begun); took > 3*time.Second {
				t.Errorf("the call took %v", took)
			}
			if tc.code == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
			} else {
				pe := wantCode(t, err, tc.code)
				if !strings.Contains(pe.Message, tc.msg) {
					t.Errorf("message %q lacks %q", pe.Message, tc.msg)
				}
				if strings.Contains(pe.Message, "/srv/") || strings.Contains(pe.Message, "/etc/") {
					t.Errorf("message %q shows a host path", pe.Message)
				}
			}
			// The outcome record names the hook that decided.
			ev := sink.take()
			rec := ev[len(ev)-1]
			if tc.record != "" {
				k, v, _ := strings.Cut(tc.record, "=")
				if rec.Detail[k] != v {
					t.Errorf("audit record %+v: want %s", rec, tc.record)
				}
			}
			if string(tc.code) != rec.Code {
				t.Errorf("audit record code %q, want %q", rec.Code, tc.code)
			}
			if tc.code == policy.DeniedByHook && len(ev) != 1 {
				t.Errorf("a denied change has %d records, want its refusal alone: %+v", len(ev), ev)
			}
			// The after hook saw the outcome, in the call's scope.
			o := after.last(t)
			if o.Code != string(tc.code) || (tc.code == "" && string(o.Result) != string(res)) {
				t.Errorf("after hook saw code %q result %s; want %q, %s", o.Code, o.Result, tc.code, res)
			}
			if o.Scope != (hooks.Scope{Space: "sp", Agent: "ag", Session: "se"}) || o.CallID != "call-1" || o.Tool != Write {
				t.Errorf("after hook saw %+v", o.Call)
			}
			for _, p := range []string{"notes.txt", "secrets/key", "data/x", "x", "src/moved.txt"} {
				_, err := os.Stat(filepath.Join(dir, p))
				if made := err == nil; made != (p == tc.wrote) {
					t.Errorf("%s made: %v", p, made)
				}
			}
		})
	}
}

func denyUnderSecrets(_ context.Context, c hooks.Call) (hooks.Verdict, error) {
	var in struct{ Path string }
	json.Unmarshal(c.Input, &in)
	if strings.HasPrefix(in.Path, "secrets/") {
		return hooks.Verdict{Deny: denySecrets}, nil
	}
	return hooks.Verdict{}, nil
}

// The after hooks see a call refused before the before hooks run (its
// input invalid); the before hooks don't.
func TestAfterHookSeesInvalidInput(t *testing.T) {
	tb, _ := newBox(t, nil)
	after := &outcomes{}
	before := 0
	tb.Hooks = &hooks.Chain{
		Before: []hooks.Before{{Name: "count", Func: func(context.Context, hooks.Call) (hooks.Verdict, error) { before++; return hooks.Verdict{}, nil }}},
		After:  []hooks.After{after.hook()},
	}
	_, err := call(t, tb, Write, map[string]any{"path": "a.txt"})
	wantCode(t, err, policy.InvalidInput)
	if o := after.last(t); o.Code != string(policy.InvalidInput) || before != 0 {
		t.Fatalf("after hook saw %+v; before hooks ran %d times", o, before)
	}
}

// An after hook can't change the outcome: one that fails or panics leaves
// the call's result as it was, and a before hook's copy of the input is
// its own.
func TestAfterHookChangesNothing(t *testing.T) {
	tb, dir := newBox(t, nil)
	tb.Hooks = &hooks.Chain{
		Before: []hooks.Before{{Name: "scribble", Func: func(_ context.Context, c hooks.Call) (hooks.Verdict, error) {
			for i := range c.Input {
				c.Input[i] = ' '
			}
			return hooks.Verdict{}, nil
		}}},
		After: []hooks.After{
			{Name: "fails", Func: func(context.Context, hooks.Outcome) error { return errors.New("after hook failed") }},
			{Name: "panics", Func: func(_ context.Context, o hooks.Outcome) error {
				for i := range o.Result {
					o.Result[i] = 'x'
				}
				panic("after hook bug")
			}},
		},
	}
	m := mustCall(t, tb, Write, map[string]any{"path": "a.txt", "content": "kept\n"})
	if m["bytes"] != float64(5) {
		t.Fatalf("result %v", m)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "a.txt")); err != nil || string(b) != "kept\n" {
		t.Fatalf("a.txt = %q, %v", b, err)
	}
}
