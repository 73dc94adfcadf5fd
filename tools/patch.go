package tools

import (
	"context"
	"encoding/json"
	"errors"
	"strings"

	"github.com/agentloom/loomfs/patch"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// workspace_apply_patch: a multi-file patch (package patch) applied all
// or nothing. Every path is checked as its write or delete would be, and
// every hunk against the file as it is, before anything is written; the
// store then puts the files in place under an intent record, so a crash
// midway is finished at the next lock take (store/intent.go).

// PatchFile is what a patch did to one file.
type PatchFile struct {
	Path string `json:"path"`
	// Action is add, update, move or delete.
	Action    string `json:"action"`
	MovedFrom string `json:"moved_from,omitempty"`
	SHA256    string `json:"sha256,omitempty"`
	Bytes     int64  `json:"bytes"`
	Added     int    `json:"lines_added"`
	Removed   int    `json:"lines_removed"`
}

// PatchResult is what workspace_apply_patch returns.
type PatchResult struct {
	Files []PatchFile `json:"files"`
	// Bytes is what the patch wrote in all.
	Bytes int64 `json:"bytes"`
}

func handleApplyPatch(ctx context.Context, t *Toolbox, input json.RawMessage) (any, error) {
	var in struct {
		Patch    string            `json:"patch"`
		Expected map[string]string `json:"expected_sha256"`
		Confirm  string            `json:"confirm_token"`
	}
	if err := decode(input, &in); err != nil {
		return nil, err
	}
	files, err := patch.Parse(in.Patch)
	if err != nil {
		return nil, policy.Errorf(policy.InvalidPatch, "%v", err)
	}
	// Every path as the tools would name it, checked for its operation.
	type part struct {
		patch.File
		rel, to string
	}
	var parts []part
	touched := map[string]bool{}
	claim := func(rel string) error {
		if touched[rel] {
			return policy.Errorf(policy.InvalidInput, "%s appears twice in the patch; give each file one part", rel)
		}
		touched[rel] = true
		return nil
	}
	for _, f := range files {
		p := part{File: f}
		op := policy.OpWrite
		if f.Action == patch.Delete || f.MoveTo != "" {
			op = policy.OpDelete
		}
		if p.rel, err = t.resolve(op, f.Path); err != nil {
			return nil, err
		}
		if err := claim(p.rel); err != nil {
			return nil, err
		}
		if f.Action == patch.Update {
			if err := t.WS.Policy().Check(policy.OpRead, p.rel); err != nil {
				return nil, err
			}
		}
		if f.MoveTo != "" {
			if p.to, err = t.resolve(policy.OpWrite, f.MoveTo); err != nil {
				return nil, err
			}
			if err := claim(p.to); err != nil {
				return nil, err
			}
		}
		parts = append(parts, p)
	}
	expected := map[string]string{}
	for raw, sum := range in.Expected {
		rel, err := t.WS.Policy().Target(policy.OpStat, raw)
		if err != nil {
			return nil, err
		}
		if !touched[rel.Rel] {
			return nil, policy.Errorf(policy.InvalidInput, "expected_sha256 names %s, which the patch does not change", rel.Rel)
		}
		expected[rel.Rel] = sum
	}
	// Confirmation where the policy asks for it: one token for the whole
	// patch, bound to its text and to the first such file's content.
	for _, p := range parts {
		op, rel := policy.OpWrite, p.rel
		if p.Action == patch.Delete {
			op = policy.OpDelete
		}
		if _, ok := t.WS.Policy().NeedsConfirm(op, rel); !ok {
			continue
		}
		confirmed, err := t.confirm(ctx, ApplyPatch, op, rel, input, in.Confirm)
		if err != nil {
			return nil, err
		}
		if confirmed != nil {
			if sum, ok := expected[rel]; ok && sum != *confirmed {
				return nil, t.WS.ConflictError(rel, *confirmed)
			}
			expected[rel] = *confirmed
		}
		break
	}

	var changes []store.FileChange
	out := PatchResult{Files: []PatchFile{}}
	for _, p := range parts {
		pf := PatchFile{Path: p.rel, Action: string(p.Action)}
		switch p.Action {
		case patch.Add:
			if _, err := t.WS.Lstat(p.rel); err == nil {
				return nil, policy.Errorf(policy.Exists, "%s already exists (patch line %d); update it with '*** Update File:' instead", p.rel, p.Line)
			} else if policy.CodeOf(err) != policy.NotFound {
				return nil, err
			}
			if err := checkExpected(t, expected, p.rel, ""); err != nil {
				return nil, err
			}
			changes = append(changes, store.FileChange{Path: p.rel, Data: []byte(p.Content)})
			pf.Added = strings.Count(p.Content, "\n")
		case patch.Delete:
			sum, _, err := t.WS.ContentHash(p.rel)
			if err != nil {
				return nil, err
			}
			if err := checkExpected(t, expected, p.rel, sum); err != nil {
				return nil, err
			}
			changes = append(changes, store.FileChange{Path: p.rel, Delete: true, Expected: sum})
		case patch.Update:
			data, sum, err := t.WS.ReadFile(ctx, p.rel)
			if err != nil {
				return nil, err
			}
			if err := checkExpected(t, expected, p.rel, sum); err != nil {
				return nil, err
			}
			text := string(data)
			if len(p.Hunks) > 0 {
				if text, err = patch.Apply(text, p.Hunks); err != nil {
					var he *patch.HunkError
					if errors.As(err, &he) {
						return nil, policy.Errorf(policy.PatchFailed, "%s: %v. Nothing was written; re-read the file and fix the hunk", p.rel, err)
					}
					return nil, err
				}
			}
			for _, h := range p.Hunks {
				pf.Added += h.Added
				pf.Removed += h.Removed
			}
			if p.to == "" {
				changes = append(changes, store.FileChange{Path: p.rel, Data: []byte(text), Expected: sum})
				break
			}
			if err := checkExpected(t, expected, p.to, ""); err != nil {
				return nil, err
			}
			changes = append(changes,
				store.FileChange{Path: p.rel, Delete: true, Expected: sum},
				store.FileChange{Path: p.to, Data: []byte(text)})
			pf.Action, pf.Path, pf.MovedFrom = "move", p.to, p.rel
		}
		out.Files = append(out.Files, pf)
	}
	res, err := t.WS.ApplyChanges(ctx, changes)
	if err != nil {
		return nil, err
	}
	byPath := map[string]store.WriteResult{}
	for i, c := range changes {
		if !c.Delete {
			byPath[c.Path] = res[i]
		}
	}
	for i := range out.Files {
		f := &out.Files[i]
		if r, ok := byPath[f.Path]; ok && f.Action != string(patch.Delete) {
			f.SHA256, f.Bytes = r.SHA256, r.Bytes
			out.Bytes += r.Bytes
		}
	}
	for _, c := range changes {
		t.changed(c.Path)
	}
	return out, nil
}

// checkExpected holds a file to the expected_sha256 the call gave for
// it; cur is its hash now, "" for none.
func checkExpected(t *Toolbox, expected map[string]string, rel, cur string) error {
	want, ok := expected[rel]
	if !ok || want == cur {
		return nil
	}
	return t.WS.ConflictError(rel, cur)
}

// patchExpectedProp is the schema of workspace_apply_patch's expected_sha256.
var patchExpectedProp = prop{
	"type":                 "object",
	"description":          "Optional: path → the sha256 the file must still have (from a read or stat), \"\" for a file that must not exist. A mismatch fails with code conflict and nothing is written.",
	"additionalProperties": prop{"type": "string", "pattern": "^([0-9a-f]{64})?$"},
}

// patchDetail is what a patch's audit record says beyond its bytes: each
// file's action, path (and where it came from) and new sha256.
func patchDetail(res json.RawMessage) map[string]any {
	var r PatchResult
	if json.Unmarshal(res, &r) != nil {
		return nil
	}
	files := make([]map[string]any, 0, len(r.Files))
	for _, f := range r.Files {
		m := map[string]any{"action": f.Action, "path": f.Path}
		if f.MovedFrom != "" {
			m["moved_from"] = f.MovedFrom
		}
		if f.SHA256 != "" {
			m["sha256"] = f.SHA256
		}
		files = append(files, m)
	}
	return map[string]any{"files": files}
}
