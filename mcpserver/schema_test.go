package mcpserver

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
	"github.com/agentloom/loomfs/tools"
)

// toolSchema is a definition's input schema, parsed and compiled.
type toolSchema struct {
	name     string
	schema   *jsonschema.Schema
	resolved *jsonschema.Resolved
}

func toolSchemas(t *testing.T) []toolSchema {
	t.Helper()
	var out []toolSchema
	for _, d := range tools.Definitions(policy.Default()) {
		var s jsonschema.Schema
		if err := json.Unmarshal(d.InputSchema, &s); err != nil {
			t.Fatalf("%s: schema is not JSON Schema: %v", d.Name, err)
		}
		r, err := s.Resolve(nil)
		if err != nil {
			t.Fatalf("%s: schema does not compile: %v", d.Name, err)
		}
		out = append(out, toolSchema{d.Name, &s, r})
	}
	return out
}

// validValue returns a value the property schema p accepts.
func validValue(t *testing.T, ts toolSchema, prop string) any {
	t.Helper()
	p := ts.schema.Properties[prop]
	var cands []any
	switch p.Type {
	case "string":
		cands = []any{"gen.txt", "", strings.Repeat("0", 64)}
	case "integer":
		if p.Minimum != nil {
			cands = append(cands, int(*p.Minimum))
		}
		cands = append(cands, 1)
	case "boolean":
		cands = []any{false}
	case "array":
		cands = []any{[]any{map[string]any{"old_text": "gen", "new_text": "other"}}, []any{"gen.txt"}}
	case "object":
		cands = []any{map[string]any{}}
	}
	cands = append(p.Enum, cands...)
	r, err := p.Resolve(nil)
	if err != nil {
		t.Fatalf("%s.%s: property schema does not compile: %v", ts.name, prop, err)
	}
	for _, c := range cands {
		if r.Validate(c) == nil {
			return c
		}
	}
	t.Fatalf("%s.%s: no generated value of type %q passes the schema", ts.name, prop, p.Type)
	return nil
}

// wrongType returns a value of another JSON type than p wants.
func wrongType(p *jsonschema.Schema) any {
	switch p.Type {
	case "string":
		return 7
	case "integer":
		return "seven"
	case "boolean":
		return "yes"
	case "array", "object":
		return "not a list or an object"
	}
	return []any{}
}

// minimal returns an input with every required property set validly.
func minimal(t *testing.T, ts toolSchema) map[string]any {
	in := map[string]any{}
	for _, r := range ts.schema.Required {
		in[r] = validValue(t, ts, r)
	}
	if ts.name == tools.Edit {
		// One of the two forms is required (anyOf).
		in["old_text"] = "gen.txt"
		in["new_text"] = "other" // must differ from old_text
	}
	if ts.name == tools.ApplyPatch {
		in["patch"] = "*** Begin Patch\n*** Add File: gen/new.txt\n+x\n*** End Patch"
	}
	return in
}

// TestSchemasMatchHandlers: every tool's input schema compiles as JSON
// Schema, and the schema and the handler agree: inputs the schema accepts
// are not refused as invalid by the handler (so no property is advertised
// that the handler rejects), and inputs it refuses — a wrong type, an
// unknown field, a missing required field — are refused with a message
// that names the field, by the handler itself and at the MCP door, never
// with a panic.
func TestSchemasMatchHandlers(t *testing.T) {
	tb := newToolbox(t, nil)
	tb.Commands = instantRunner{}
	cs := connect(t, newServer(t, tb, Options{}), overPipe, nil)
	ctx := context.Background()

	type generated struct {
		name  string
		input map[string]any
		field string // the field a refusal must name; "" for valid inputs
	}
	for _, ts := range toolSchemas(t) {
		if ts.schema.Type != "object" || ts.schema.AdditionalProperties == nil {
			t.Errorf("%s: schema must be an object closed to unknown fields", ts.name)
		}
		var cases []generated
		cases = append(cases, generated{"minimal valid input", minimal(t, ts), ""})
		for _, p := range slices.Sorted(func(yield func(string) bool) {
			for k := range ts.schema.Properties {
				if !yield(k) {
					return
				}
			}
		}) {
			with := minimal(t, ts)
			with[p] = validValue(t, ts, p)
			if ts.name == tools.Edit && p == "new_text" {
				with[p] = "other"
			}
			cases = append(cases, generated{"valid " + p, with, ""})
			bad := minimal(t, ts)
			bad[p] = wrongType(ts.schema.Properties[p])
			cases = append(cases, generated{"wrong type for " + p, bad, p})
		}
		unknown := minimal(t, ts)
		unknown["no_such_field"] = 1
		cases = append(cases, generated{"unknown field", unknown, "no_such_field"})
		for _, r := range ts.schema.Required {
			missing := minimal(t, ts)
			delete(missing, r)
			cases = append(cases, generated{"missing required " + r, missing, r})
		}

		for _, c := range cases {
			t.Run(ts.name+"/"+c.name, func(t *testing.T) {
				raw, err := json.Marshal(c.input)
				if err != nil {
					t.Fatal(err)
				}
				var inst any
				json.Unmarshal(raw, &inst)
				schemaErr := ts.resolved.Validate(inst)
				_, handlerErr := tb.Call(ctx, ts.name, "", raw)
				res := callTool(t, cs, ts.name, c.input)

				if c.field == "" {
					if schemaErr != nil {
						t.Fatalf("generated valid input %s fails the schema: %v", raw, schemaErr)
					}
					if policy.CodeOf(handlerErr) == policy.InvalidInput {
						t.Fatalf("schema accepts %s but the handler refuses it: %v", raw, handlerErr)
					}
					if res.IsError && structured(t, res)["error"].(map[string]any)["code"] == string(policy.InvalidInput) {
						t.Fatalf("schema accepts %s but the MCP door refuses it: %s", raw, text(res))
					}
					return
				}
				if schemaErr == nil || !strings.Contains(schemaErr.Error(), c.field) {
					t.Errorf("schema accepts %s or does not name %q: %v", raw, c.field, schemaErr)
				}
				e := toolError(t, res, policy.InvalidInput)
				if msg := e["message"].(string); !strings.Contains(msg, c.field) || !strings.Contains(msg, ts.name) {
					t.Errorf("door refusal %q does not name the tool and %q", msg, c.field)
				}
				if handlerErr == nil {
					t.Fatalf("handler accepts %s, which its schema refuses", raw)
				}
				if pe := policy.AsError(handlerErr); pe.Code != policy.InvalidInput || !strings.Contains(pe.Message, c.field) {
					t.Errorf("handler refusal of %s: %s %q, want invalid_input naming %q", raw, pe.Code, pe.Message, c.field)
				}
			})
		}
	}

	t.Run("arguments that are not an object", func(t *testing.T) {
		for _, raw := range []string{`[1]`, `"path"`, `7`} {
			res := callTool(t, cs, tools.Read, json.RawMessage(raw))
			e := toolError(t, res, policy.InvalidInput)
			if !strings.Contains(e["message"].(string), "JSON object") {
				t.Errorf("%s: %v", raw, e)
			}
		}
	})
	t.Run("the session still answers", func(t *testing.T) {
		ok(t, callTool(t, cs, tools.List, map[string]any{}))
	})
}

// instantRunner answers every command at once.
type instantRunner struct{}

func (instantRunner) RunCommand(ctx context.Context, _ *store.Workspace, req tools.CommandRequest) (tools.CommandResult, error) {
	return tools.CommandResult{Stdout: fmt.Sprintf("ran %q\n", req.Command)}, nil
}

// TestDoorRefusalIsAudited: an edit without new_text, which the schema
// requires, is refused at the door — the file keeps its text — and the
// refusal is in the audit log like any other.
func TestDoorRefusalIsAudited(t *testing.T) {
	tb := newToolbox(t, nil)
	cs := connect(t, newServer(t, tb, Options{}), overPipe, nil)
	ok(t, callTool(t, cs, tools.Write, map[string]any{"path": "keep.txt", "content": "keep this\n"}))
	res := callTool(t, cs, tools.Edit, map[string]any{"path": "keep.txt", "old_text": "keep this"})
	if msg := toolError(t, res, policy.InvalidInput)["message"].(string); !strings.Contains(msg, "new_text") {
		t.Fatalf("refusal does not name new_text: %q", msg)
	}
	if got := readFile(t, tb, "keep.txt"); got != "keep this\n" {
		t.Fatalf("refused edit changed the file to %q", got)
	}
	e := recorderOf(tb).waitFor(t, 5*time.Second, "edit refused", func(e audit.Event) bool {
		return e.Op == tools.Edit && e.Result == "refused"
	})
	if e.Code != string(policy.InvalidInput) || e.Path != "keep.txt" || !strings.HasPrefix(e.CallID, "mcp-") || e.Source != audit.SourceTool || e.Scope != tb.WS.Scope().Hash() {
		t.Fatalf("audit record of the refusal: %+v", e)
	}
}
