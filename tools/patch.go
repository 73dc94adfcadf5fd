package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
//
// A model trained on Codex's apply_patch gets Codex's result: "*** Add
// File:" over an existing file and "*** Move to:" onto one replace it,
// and "*** Delete File:" of an emulated link removes the link, as
// workspace_delete does. Only an expected_sha256 the call gives for a
// path holds it back (a mismatch is a conflict with the current hash).
// Where Codex stops midway and leaves the files it already changed, this
// door writes nothing. Every refusal names the patch line and the file
// header it belongs to, says that nothing was written, and never sends a
// model that read nothing back to re-read.

// PatchFile is what a patch did to one file.
type PatchFile struct {
	Path string `json:"path"`
	// Action is add, update, move or delete.
	Action    string `json:"action"`
	MovedFrom string `json:"moved_from,omitempty"`
	// Replaced says an add or a move replaced a file that was there.
	Replaced bool   `json:"replaced,omitempty"`
	SHA256   string `json:"sha256,omitempty"`
	Bytes    int64  `json:"bytes"`
	Added    int    `json:"lines_added"`
	Removed  int    `json:"lines_removed"`
}

// PatchResult is what workspace_apply_patch returns.
type PatchResult struct {
	Files []PatchFile `json:"files"`
	// Bytes is what the patch wrote in all.
	Bytes int64 `json:"bytes"`
}

// patchPart is one file's part of a patch, its paths as the tools name
// them (to for a move's destination).
type patchPart struct {
	patch.File
	rel, to string
}

// patchCall is one workspace_apply_patch call's state: the hashes the
// files must have (given by the call, or bound by a confirmation) and
// which of them the call gave itself.
type patchCall struct {
	t        *Toolbox
	expected map[string]string
	given    map[string]bool
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
		return nil, policy.Errorf(policy.InvalidPatch, "%s", nothingWritten(err.Error()))
	}
	// Every path as the tools would name it, checked for its operation.
	claimed := map[string]int{} // path → the patch line of its part
	claim := func(rel string, line int) error {
		if first, ok := claimed[rel]; ok {
			return policy.Errorf(policy.InvalidInput, "%s is also changed by the part at patch line %d; give each file one part", rel, first)
		}
		claimed[rel] = line
		return nil
	}
	var parts []patchPart
	for _, f := range files {
		p, err := resolvePart(t, f, claim)
		if err != nil {
			return nil, refusal(f, err)
		}
		parts = append(parts, p)
	}
	c := &patchCall{t: t, expected: map[string]string{}, given: map[string]bool{}}
	for raw, sum := range in.Expected {
		rel, err := t.WS.Policy().Target(policy.OpStat, raw)
		if err != nil {
			return nil, withMessage(err, "expected_sha256: %s", nothingWritten(policy.AsError(err).Message))
		}
		if _, ok := claimed[rel.Rel]; !ok {
			return nil, policy.Errorf(policy.InvalidInput, "expected_sha256 names %s, which the patch does not change; take it out of expected_sha256. Nothing was written.", rel.Rel)
		}
		c.expected[rel.Rel], c.given[rel.Rel] = sum, true
	}
	if err := c.confirm(ctx, parts, input, in.Confirm); err != nil {
		return nil, err
	}

	var changes []store.FileChange
	out := PatchResult{Files: []PatchFile{}}
	for _, p := range parts {
		pf, cs, err := c.plan(ctx, p)
		if policy.CodeOf(err) == policy.PatchFailed {
			return nil, err // hunkRefusal named the hunk's line
		}
		if err != nil {
			return nil, refusal(p.File, err)
		}
		changes = append(changes, cs...)
		out.Files = append(out.Files, pf)
	}
	res, err := t.WS.ApplyChanges(ctx, changes)
	if err != nil {
		return nil, c.storeRefusal(err, parts)
	}
	byPath := map[string]store.WriteResult{}
	for i, ch := range changes {
		if !ch.Delete {
			byPath[ch.Path] = res[i]
		}
	}
	for i := range out.Files {
		f := &out.Files[i]
		if r, ok := byPath[f.Path]; ok && f.Action != string(patch.Delete) {
			f.SHA256, f.Bytes = r.SHA256, r.Bytes
			out.Bytes += r.Bytes
		}
	}
	for _, ch := range changes {
		t.changed(ch.Path)
	}
	return out, nil
}

// resolvePart checks f's paths against the policy, each for what the
// patch does to it, and claims them.
func resolvePart(t *Toolbox, f patch.File, claim func(rel string, line int) error) (patchPart, error) {
	p := patchPart{File: f}
	op := policy.OpWrite
	if f.Action == patch.Delete || f.MoveTo != "" {
		op = policy.OpDelete
	}
	var err error
	if p.rel, err = t.resolve(op, f.Path); err != nil {
		return p, err
	}
	if err := claim(p.rel, f.Line); err != nil {
		return p, err
	}
	if f.Action == patch.Update {
		if err := t.WS.Policy().Check(policy.OpRead, p.rel); err != nil {
			return p, err
		}
	}
	if f.MoveTo != "" {
		if p.to, err = t.resolve(policy.OpWrite, f.MoveTo); err != nil {
			return p, err
		}
		if p.to == p.rel {
			return p, policy.Errorf(policy.InvalidInput, "the file is moved to itself; leave out the '*** Move to:' line")
		}
		if err := claim(p.to, f.Line); err != nil {
			return p, err
		}
	}
	return p, nil
}

// confirm asks for confirmation where the policy wants it: one token for
// the whole patch, bound to its text and to the first such file's
// content, which then must still be what was confirmed.
func (c *patchCall) confirm(ctx context.Context, parts []patchPart, input json.RawMessage, token string) error {
	type target struct {
		part patchPart
		op   policy.Op
		rel  string
	}
	var targets []target
	for _, p := range parts {
		switch {
		case p.Action == patch.Delete:
			targets = append(targets, target{p, policy.OpDelete, p.rel})
		case p.to != "":
			// A move deletes its source and may overwrite its destination.
			targets = append(targets, target{p, policy.OpDelete, p.rel}, target{p, policy.OpWrite, p.to})
		default:
			targets = append(targets, target{p, policy.OpWrite, p.rel})
		}
	}
	for _, tg := range targets {
		if _, ok := c.t.WS.Policy().NeedsConfirm(tg.op, tg.rel); !ok {
			continue
		}
		confirmed, err := c.t.confirm(ctx, ApplyPatch, tg.op, tg.rel, input, token)
		if err != nil {
			if policy.CodeOf(err) == policy.ConfirmationRequired {
				return err
			}
			return refusal(tg.part.File, err)
		}
		if confirmed != nil {
			if sum, ok := c.expected[tg.rel]; ok && sum != *confirmed {
				return refusal(tg.part.File, c.conflict(tg.rel, *confirmed))
			}
			c.expected[tg.rel] = *confirmed
		}
		return nil
	}
	return nil
}

// plan checks one part against the files as they are and returns what it
// does and the store changes that do it.
func (c *patchCall) plan(ctx context.Context, p patchPart) (PatchFile, []store.FileChange, error) {
	t := c.t
	pf := PatchFile{Path: p.rel, Action: string(p.Action)}
	switch p.Action {
	case patch.Add:
		cur, err := c.replaced(p.rel)
		if err != nil {
			return pf, nil, err
		}
		pf.Added, pf.Replaced = strings.Count(p.Content, "\n"), cur != ""
		return pf, []store.FileChange{{Path: p.rel, Data: []byte(p.Content), Expected: cur}}, nil
	case patch.Delete:
		info, err := t.WS.Lstat(p.rel)
		if policy.CodeOf(err) == policy.NotFound {
			return pf, nil, policy.Errorf(policy.NotFound, "%s does not exist; take its '*** Delete File:' part out of the patch", p.rel)
		}
		if err != nil {
			return pf, nil, err
		}
		switch info.Kind {
		case policy.KindDir:
			return pf, nil, policy.Errorf(policy.IsDir, "%s is a directory; a patch deletes files only (workspace_delete removes an empty directory)", p.rel)
		case policy.KindLink:
			// The link itself goes, as with workspace_delete.
			if err := policy.CheckObject(policy.OpDelete, p.rel, info.Object()); err != nil {
				return pf, nil, err
			}
			if c.given[p.rel] {
				return pf, nil, policy.Errorf(policy.InvalidInput, "%s is a symbolic link, which has no sha256; take it out of expected_sha256", p.rel)
			}
			return pf, []store.FileChange{{Path: p.rel, Delete: true, Link: true}}, nil
		}
		sum, _, err := t.WS.ContentHash(p.rel)
		if err != nil {
			return pf, nil, err
		}
		if err := c.check(p.rel, sum); err != nil {
			return pf, nil, err
		}
		return pf, []store.FileChange{{Path: p.rel, Delete: true, Expected: sum}}, nil
	}
	data, sum, err := t.WS.ReadFile(ctx, p.rel)
	if policy.CodeOf(err) == policy.NotFound {
		return pf, nil, policy.Errorf(policy.NotFound, "%s does not exist; to create it, use '*** Add File: %s' with each line as a '+' line", p.rel, p.rel)
	}
	if err != nil {
		return pf, nil, err
	}
	if err := c.check(p.rel, sum); err != nil {
		return pf, nil, err
	}
	text := string(data)
	if len(p.Hunks) > 0 {
		if text, err = patch.Apply(text, p.Hunks); err != nil {
			return pf, nil, hunkRefusal(p, err)
		}
	}
	for _, h := range p.Hunks {
		pf.Added += h.Added
		pf.Removed += h.Removed
	}
	if p.to == "" {
		return pf, []store.FileChange{{Path: p.rel, Data: []byte(text), Expected: sum}}, nil
	}
	cur, err := c.replaced(p.to)
	if err != nil {
		return pf, nil, err
	}
	pf.Action, pf.Path, pf.MovedFrom, pf.Replaced = "move", p.to, p.rel, cur != ""
	return pf, []store.FileChange{
		{Path: p.rel, Delete: true, Expected: sum},
		{Path: p.to, Data: []byte(text), Expected: cur},
	}, nil
}

// replaced returns the sha256 of the file an add or a move would replace
// at rel, "" for none, held to the call's expected_sha256. What a write
// may not replace (a directory, a link, a special file) is refused as
// workspace_write refuses it.
func (c *patchCall) replaced(rel string) (string, error) {
	info, err := c.t.WS.Lstat(rel)
	switch {
	case policy.CodeOf(err) == policy.NotFound:
		return "", c.check(rel, "")
	case err != nil:
		return "", err
	case info.Kind == policy.KindDir:
		return "", policy.Errorf(policy.IsDir, "%s is a directory; a patch writes files only", rel)
	}
	sum, _, err := c.t.WS.ContentHash(rel)
	if err != nil {
		return "", err
	}
	return sum, c.check(rel, sum)
}

// check holds rel to the hash the call expects of it, if any; cur is its
// hash now, "" for no file.
func (c *patchCall) check(rel, cur string) error {
	want, ok := c.expected[rel]
	if !ok || want == cur {
		return nil
	}
	if !c.given[rel] {
		// Bound by the confirmation moments ago.
		return c.changedMeanwhile(rel, cur)
	}
	return c.conflict(rel, cur)
}

// conflict is the answer to an expected_sha256 the call gave that does
// not match: the current hash (unless the file can't be read back here)
// and the one step that fixes the call.
func (c *patchCall) conflict(rel, cur string) error {
	e := policy.AsError(c.t.WS.ConflictError(rel, cur))
	if cur == "" {
		return withMessage(e, "%s does not exist, but expected_sha256 names a version of it; if the patch is meant to create it, take it out of expected_sha256", rel)
	}
	if c.expected[rel] == "" {
		if e.SHA256 == "" {
			return withMessage(e, "%s exists, but expected_sha256 gives \"\" (must not exist); to replace it, take it out of expected_sha256", rel)
		}
		return withMessage(e, "%s exists (current sha256 %s), but expected_sha256 gives \"\" (must not exist); to replace it, give that sha256 or take it out of expected_sha256", rel, e.SHA256)
	}
	return e // "changed since you read it": the call named a version it read
}

// changedMeanwhile is the conflict of a file some other writer (a command,
// a program in the workspace) changed while the patch was being checked:
// sending the same patch again is the step that fixes it.
func (c *patchCall) changedMeanwhile(rel, cur string) error {
	e := policy.AsError(c.t.WS.ConflictError(rel, cur))
	return withMessage(e, "%s was changed by another writer while the patch was being applied; send the patch again", rel)
}

// storeRefusal is the answer to a change set the store refused. It
// checked what this call checked a moment ago, so a conflict there is
// another writer's change in between, not a stale read of the model's.
// A change set the store committed and could not finish is finished at
// the next lock take, and its error is returned as it is.
func (c *patchCall) storeRefusal(err error, parts []patchPart) error {
	if c.t.WS.ChangeSetPending() {
		return err
	}
	var pe *policy.Error
	if !errors.As(err, &pe) {
		return err
	}
	// The part whose path the message starts with, the longest such ("a
	// changed since…", "a: quota exceeded…").
	var part *patchPart
	var rel string
	for i, p := range parts {
		for _, r := range []string{p.rel, p.to} {
			if r != "" && len(r) > len(rel) && (strings.HasPrefix(pe.Message, r+" ") || strings.HasPrefix(pe.Message, r+": ")) {
				part, rel = &parts[i], r
			}
		}
	}
	switch {
	case pe.Code == policy.Conflict && rel != "" && !c.given[rel]:
		err = c.changedMeanwhile(rel, pe.SHA256)
	case rel != "" && strings.HasPrefix(pe.Message, rel+": "):
		// The header names the file already.
		err = withMessage(pe, "%s", strings.TrimPrefix(pe.Message, rel+": "))
	}
	if part == nil {
		return withMessage(err, "%s", nothingWritten(pe.Message))
	}
	return refusal(part.File, err)
}

// refusal names the patch line and file header err belongs to and says
// that nothing was written. Errors that are not the policy's pass as
// they are: they are the operator's, and the tool door words them.
func refusal(f patch.File, err error) error {
	pe := policy.AsError(err)
	if pe.Code == policy.Internal {
		return err
	}
	return withMessage(pe, "patch line %d (%s): %s", f.Line, f.Header, nothingWritten(pe.Message))
}

// hunkRefusal is a hunk that does not apply: where it is in the patch,
// what was looked for, and the file's closest lines last, so the message
// ends with what the model compares its hunk with.
func hunkRefusal(p patchPart, err error) error {
	var he *patch.HunkError
	if !errors.As(err, &he) {
		return err
	}
	line := he.Line
	if line == 0 {
		line = p.Line
	}
	msg := fmt.Sprintf("patch line %d (hunk %d of %s): %s. Nothing was written; make the hunk's ' ' and '-' lines match the file's", line, he.Hunk+1, p.Header, strings.TrimSuffix(he.Msg, "."))
	if len(he.Closest) > 0 {
		msg += fmt.Sprintf(". The closest lines of %s are at line %d:\n%s", p.rel, he.ClosestLine, strings.Join(he.Closest, "\n"))
	}
	return policy.Errorf(policy.PatchFailed, "%s", msg)
}

// nothingWritten ends a refusal's message with the news that the patch
// changed nothing.
func nothingWritten(msg string) string {
	return strings.TrimRight(msg, ". ") + ". Nothing was written."
}

// withMessage is err with a new message and every other field kept (the
// code, the current sha256, a token).
func withMessage(err error, format string, args ...any) error {
	e := *policy.AsError(err)
	e.Message = fmt.Sprintf(format, args...)
	return &e
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
