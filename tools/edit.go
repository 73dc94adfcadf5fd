package tools

import (
	"context"
	"encoding/json"
	"strings"

	"github.com/agentloom/loomfs/policy"
)

// Multi-edit: workspace_edit with edits, several replacements applied in
// order to one base, all or nothing.

// EditStep is one replacement of a multi-edit.
type EditStep struct {
	OldText    string  `json:"old_text"`
	NewText    *string `json:"new_text"`
	ReplaceAll bool    `json:"replace_all"`
}

// MaxEdits bounds the edits of one call.
const MaxEdits = 100

// editsProp is the schema of workspace_edit's edits.
var editsProp = prop{
	"type":        "array",
	"minItems":    1,
	"maxItems":    MaxEdits,
	"description": "Several replacements, applied in order (each to the text the ones before it left), all or none. Each has old_text, new_text and replace_all, as the single-edit fields.",
	"items": prop{
		"type":                 "object",
		"required":             []string{"old_text", "new_text"},
		"additionalProperties": false,
		"properties": map[string]prop{
			"old_text":    {"type": "string", "minLength": 1, "description": "Exact text to find (whitespace matters)."},
			"new_text":    {"type": "string", "description": "Replacement text; must differ from old_text."},
			"replace_all": {"type": "boolean", "description": "Replace every occurrence instead of requiring exactly one."},
		},
	},
}

// editSchema requires of workspace_edit's input old_text and new_text,
// or edits, or both.
func editSchema(s json.RawMessage) json.RawMessage {
	var m map[string]any
	if err := json.Unmarshal(s, &m); err != nil {
		panic(err)
	}
	m["anyOf"] = []any{
		map[string]any{"required": []string{"old_text", "new_text"}},
		map[string]any{"required": []string{"edits"}},
	}
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

func handleEdits(ctx context.Context, t *Toolbox, input json.RawMessage, path string, edits []EditStep, expected *string, token string) (any, error) {
	if len(edits) == 0 || len(edits) > MaxEdits {
		return nil, policy.Errorf(policy.InvalidInput, "edits has %d entries; give 1 to %d", len(edits), MaxEdits)
	}
	for i, e := range edits {
		switch {
		case e.OldText == "":
			return nil, policy.Errorf(policy.InvalidInput, "edits[%d]: old_text is empty; give the exact text to replace", i)
		case e.NewText == nil:
			return nil, policy.Errorf(policy.InvalidInput, "edits[%d]: new_text is required", i)
		case e.OldText == *e.NewText:
			return nil, policy.Errorf(policy.NoChange, "edits[%d]: old_text and new_text are the same; the edit would change nothing", i)
		}
	}
	pol := t.WS.Policy()
	rel, err := t.resolve(policy.OpWrite, path)
	if err != nil {
		return nil, err
	}
	if err := pol.Check(policy.OpRead, rel); err != nil {
		return nil, err
	}
	confirmed, err := t.confirm(ctx, Edit, policy.OpWrite, rel, input, token)
	if err != nil {
		return nil, err
	}
	if expected == nil {
		expected = confirmed
	}
	data, sum, err := t.WS.ReadFile(ctx, rel)
	if err != nil {
		return nil, err
	}
	if expected != nil && *expected != sum {
		return nil, t.WS.ConflictError(rel, sum)
	}
	text, total := string(data), 0
	for i, e := range edits {
		n := strings.Count(text, e.OldText)
		switch {
		case n == 0:
			return nil, policy.Errorf(policy.NoMatch, "edits[%d]: old_text was not found in %s after the edits before it; nothing was written: re-read the file and copy the text exactly (whitespace and line ends matter)", i, rel)
		case n > 1 && !e.ReplaceAll:
			pe := policy.Errorf(policy.AmbiguousEdit, "edits[%d]: old_text occurs %d times in %s after the edits before it; nothing was written: add surrounding text to make it unique, or set replace_all", i, n, rel)
			pe.Count = n
			return nil, pe
		}
		if e.ReplaceAll {
			text = strings.ReplaceAll(text, e.OldText, *e.NewText)
		} else {
			text = strings.Replace(text, e.OldText, *e.NewText, 1)
			n = 1
		}
		total += n
	}
	res, err := t.WS.WriteFile(ctx, rel, []byte(text), &sum)
	if err != nil {
		return nil, err
	}
	t.changed(rel)
	return EditResult{Path: rel, Replacements: total, SHA256: res.SHA256, Bytes: res.Bytes}, nil
}
