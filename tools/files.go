package tools

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

const defaultReadLines = 2000

// Entry is one object in a listing or a stat result.
type Entry struct {
	Name  string `json:"name,omitempty"`
	Path  string `json:"path,omitempty"`
	Type  string `json:"type"`
	Size  int64  `json:"size"`
	Mode  string `json:"mode,omitempty"`
	MTime string `json:"mtime"`
	// SHA256 is set by stat for regular files within the text limit.
	SHA256 string `json:"sha256,omitempty"`
	// Target is an emulated symbolic link's target: the tools never
	// follow it, programs in the projection do.
	Target string `json:"target,omitempty"`
	// Refused says why a listed object can't be used (symlink, hard link…).
	Refused string `json:"refused,omitempty"`
}

func entryOf(ws *store.Workspace, rel string, info store.Info) Entry {
	e := Entry{
		Type:  info.Kind.String(),
		Size:  info.Size,
		MTime: info.ModTime.UTC().Format(time.RFC3339),
	}
	if info.Kind == policy.KindLink {
		// A link loomfs made: listed with its target, never followed. One
		// it can't read (hard-linked, or marked on the host with no valid
		// target) has no target and says why; in a write-only subtree the
		// target, what the link holds, is not shown.
		if ws.Policy().Check(policy.OpRead, rel) != nil {
			return e
		}
		target, _, err := ws.ReadLink(rel)
		if err != nil {
			e.Refused = string(policy.CodeOf(err))
		}
		e.Target = target
		return e
	}
	if info.Kind != policy.KindDir || info.OtherMount {
		if err := policy.CheckObject(policy.OpRead, rel, info.Object()); err != nil {
			e.Refused = string(policy.CodeOf(err))
		}
	}
	return e
}

func handleList(ctx context.Context, t *Toolbox, input json.RawMessage) (any, error) {
	var in struct {
		Path  string `json:"path"`
		Limit int    `json:"limit"`
	}
	if err := decode(input, &in); err != nil {
		return nil, err
	}
	pol := t.WS.Policy()
	limit, err := bound("limit", in.Limit, pol.Limits.ListEntries)
	if err != nil {
		return nil, err
	}
	rel, err := t.resolve(policy.OpList, orDot(in.Path))
	if err != nil {
		return nil, err
	}
	infos, err := t.WS.ReadDir(ctx, rel)
	if err != nil {
		return nil, err
	}
	out := ListResult{Path: rel, Entries: []Entry{}}
	named := infos[:0]
	for _, info := range infos {
		if !policy.Addressable(policy.Join(rel, info.Name)) {
			out.SkippedDeep++
			continue
		}
		named = append(named, info)
	}
	out.Total = len(named)
	for _, info := range named {
		if len(out.Entries) == limit {
			out.Truncated = true
			break
		}
		e := entryOf(t.WS, policy.Join(rel, info.Name), info)
		e.Name = info.Name
		out.Entries = append(out.Entries, e)
	}
	return out, nil
}

func handleStat(ctx context.Context, t *Toolbox, input json.RawMessage) (any, error) {
	var in struct {
		Path string `json:"path"`
	}
	if err := decode(input, &in); err != nil {
		return nil, err
	}
	rel, err := t.resolve(policy.OpStat, in.Path)
	if err != nil {
		return nil, err
	}
	info, err := t.WS.Lstat(rel)
	if err != nil {
		return nil, err
	}
	e := entryOf(t.WS, rel, info)
	e.Path = rel
	e.Mode = fmt.Sprintf("%04o", info.Perm)
	if info.Kind == policy.KindLink {
		e.Mode = "0777" // as lstat shows a symlink, in the projection too
	}
	if info.Kind == policy.KindRegular && e.Refused == "" && t.WS.Policy().Check(policy.OpRead, rel) == nil {
		h, err := t.WS.HashFile(rel)
		if err != nil {
			return nil, err
		}
		e.SHA256 = h
	}
	return e, nil
}

func handleRead(ctx context.Context, t *Toolbox, input json.RawMessage) (any, error) {
	var in struct {
		Path   string `json:"path"`
		Offset int    `json:"offset"`
		Limit  int    `json:"limit"`
	}
	if err := decode(input, &in); err != nil {
		return nil, err
	}
	if in.Offset < 0 || in.Limit < 0 {
		return nil, policy.Errorf(policy.InvalidInput, "offset and limit must be positive (offset is the first line, 1-based)")
	}
	rel, err := t.resolve(policy.OpRead, in.Path)
	if err != nil {
		return nil, err
	}
	data, sum, err := t.WS.ReadFile(ctx, rel)
	if err != nil {
		return nil, err
	}
	lines := splitLines(data)
	first := max(in.Offset, 1)
	limit := in.Limit
	if limit == 0 {
		limit = defaultReadLines
	}
	out := ReadResult{Path: rel, SHA256: sum, TotalLines: len(lines), Offset: first}
	if first > len(lines) && len(lines) > 0 {
		return nil, policy.Errorf(policy.InvalidInput, "offset %d is past the end: %s has %d lines", first, rel, len(lines))
	}
	end := min(first-1+limit, len(lines))
	if first <= len(lines) {
		out.Content = strings.Join(lines[first-1:end], "")
		out.Lines = end - first + 1
	}
	out.Truncated = end < len(lines)
	out.Binary = bytes.IndexByte(data, 0) >= 0
	out.Content = strings.ToValidUTF8(out.Content, "\uFFFD")
	return out, nil
}

// splitLines splits keeping line ends, so joining gives the text back.
func splitLines(b []byte) []string {
	var out []string
	s := string(b)
	for s != "" {
		i := strings.IndexByte(s, '\n')
		if i < 0 {
			out = append(out, s)
			break
		}
		out = append(out, s[:i+1])
		s = s[i+1:]
	}
	return out
}

func handleWrite(ctx context.Context, t *Toolbox, input json.RawMessage) (any, error) {
	var in struct {
		Path     string  `json:"path"`
		Content  *string `json:"content"`
		Expected *string `json:"expected_sha256"`
		Confirm  string  `json:"confirm_token"`
		Parents  *bool   `json:"parents"`
	}
	if err := decode(input, &in); err != nil {
		return nil, err
	}
	if in.Content == nil {
		return nil, policy.Errorf(policy.InvalidInput, "content is required (use \"\" for an empty file)")
	}
	rel, err := t.resolve(policy.OpWrite, in.Path)
	if err != nil {
		return nil, err
	}
	// Overwriting where the policy asks for confirmation (confirm.go).
	confirmed, err := t.confirm(ctx, Write, policy.OpWrite, rel, input, in.Confirm)
	if err != nil {
		return nil, err
	}
	if in.Expected == nil {
		in.Expected = confirmed
	}
	// Missing parents are made as workspace_mkdir with parents makes them,
	// each asked of the policy; "parents": false keeps the refusal.
	if dir, _ := policy.Split(rel); dir != "." && (in.Parents == nil || *in.Parents) {
		gone, err := missing(t.WS, dir)
		if err != nil {
			return nil, err
		}
		if gone {
			if _, err := t.WS.Mkdir(ctx, dir, true); err != nil {
				return nil, err
			}
			t.changed(dir)
		}
	}
	res, err := t.WS.WriteFile(ctx, rel, []byte(*in.Content), in.Expected)
	if err != nil {
		return nil, err
	}
	t.changed(rel)
	return WriteResult{Path: rel, Bytes: res.Bytes, SHA256: res.SHA256, Created: res.Created}, nil
}

// missing reports whether nothing is at the cleaned path rel. What is
// there, refused or not, is for the call that follows to answer; the
// storage failing to say is returned, since taken for "something is
// there" it would end as that call's not_found.
func missing(ws *store.Workspace, rel string) (bool, error) {
	_, err := ws.Lstat(rel)
	switch {
	case err == nil || policy.Refused(err):
		return false, nil
	case policy.CodeOf(err) == policy.NotFound:
		return true, nil
	}
	return false, err
}

func handleEdit(ctx context.Context, t *Toolbox, input json.RawMessage) (any, error) {
	var in struct {
		Path       string     `json:"path"`
		OldText    string     `json:"old_text"`
		NewText    *string    `json:"new_text"`
		ReplaceAll bool       `json:"replace_all"`
		Edits      []EditStep `json:"edits"`
		Expected   *string    `json:"expected_sha256"`
		Confirm    string     `json:"confirm_token"`
	}
	if err := decode(input, &in); err != nil {
		return nil, err
	}
	if in.Edits != nil {
		// Multi-edit (edit.go); old_text and new_text, if given too, are
		// its first edit.
		steps := in.Edits
		if in.OldText != "" || in.NewText != nil {
			steps = append([]EditStep{{OldText: in.OldText, NewText: in.NewText, ReplaceAll: in.ReplaceAll}}, steps...)
		}
		return handleEdits(ctx, t, input, in.Path, steps, in.Expected, in.Confirm)
	}
	if in.NewText == nil {
		return nil, policy.Errorf(policy.InvalidInput, "input field \"new_text\" is required (or give edits); see the tool's input schema")
	}
	if in.OldText == "" {
		return nil, policy.Errorf(policy.InvalidInput, "old_text is empty; give the exact text to replace")
	}
	if in.OldText == *in.NewText {
		return nil, policy.Errorf(policy.NoChange, "old_text and new_text are the same; the edit would change nothing")
	}
	pol := t.WS.Policy()
	rel, err := t.resolve(policy.OpWrite, in.Path)
	if err != nil {
		return nil, err
	}
	if err := pol.Check(policy.OpRead, rel); err != nil {
		return nil, err
	}
	// Changing a file where the policy asks for confirmation (confirm.go).
	confirmed, err := t.confirm(ctx, Edit, policy.OpWrite, rel, input, in.Confirm)
	if err != nil {
		return nil, err
	}
	if in.Expected == nil {
		in.Expected = confirmed
	}
	data, sum, err := t.WS.ReadFile(ctx, rel)
	if err != nil {
		return nil, err
	}
	if in.Expected != nil && *in.Expected != sum {
		e := policy.Errorf(policy.Conflict, "%s changed since you read it (current sha256 %s); re-read the file and retry", rel, sum)
		e.SHA256 = sum
		return nil, e
	}
	text := string(data)
	n := strings.Count(text, in.OldText)
	switch {
	case n == 0:
		return nil, policy.Errorf(policy.NoMatch, "old_text was not found in %s; re-read the file and copy the text exactly (whitespace and line ends matter)", rel)
	case n > 1 && !in.ReplaceAll:
		e := policy.Errorf(policy.AmbiguousEdit, "old_text occurs %d times in %s; add surrounding text to make it unique, or set replace_all", n, rel)
		e.Count = n
		return nil, e
	}
	if in.ReplaceAll {
		text = strings.ReplaceAll(text, in.OldText, *in.NewText)
	} else {
		text = strings.Replace(text, in.OldText, *in.NewText, 1)
	}
	res, err := t.WS.WriteFile(ctx, rel, []byte(text), &sum)
	if err != nil {
		return nil, err
	}
	t.changed(rel)
	return EditResult{Path: rel, Replacements: n, SHA256: res.SHA256, Bytes: res.Bytes}, nil
}

func handleMkdir(ctx context.Context, t *Toolbox, input json.RawMessage) (any, error) {
	var in struct {
		Path    string `json:"path"`
		Parents bool   `json:"parents"`
	}
	if err := decode(input, &in); err != nil {
		return nil, err
	}
	rel, err := t.resolve(policy.OpCreate, in.Path)
	if err != nil {
		return nil, err
	}
	created, err := t.WS.Mkdir(ctx, rel, in.Parents)
	if err != nil {
		return nil, err
	}
	t.changed(rel)
	return MkdirResult{Path: rel, Created: created}, nil
}

func handleDelete(ctx context.Context, t *Toolbox, input json.RawMessage) (any, error) {
	var in struct {
		Path     string  `json:"path"`
		Expected *string `json:"expected_sha256"`
		Confirm  string  `json:"confirm_token"`
	}
	if err := decode(input, &in); err != nil {
		return nil, err
	}
	rel, err := t.resolve(policy.OpDelete, in.Path)
	if err != nil {
		return nil, err
	}
	// Deleting where the policy asks for confirmation (confirm.go).
	confirmed, err := t.confirm(ctx, Delete, policy.OpDelete, rel, input, in.Confirm)
	if err != nil {
		return nil, err
	}
	if in.Expected == nil {
		in.Expected = confirmed
	}
	if err := t.WS.Remove(ctx, rel, in.Expected); err != nil {
		return nil, err
	}
	t.changed(rel)
	return DeleteResult{Path: rel, Deleted: true}, nil
}

func handleCommand(ctx context.Context, t *Toolbox, input json.RawMessage) (any, error) {
	var in struct {
		Command  string `json:"command"`
		TimeoutS *int   `json:"timeout_s"`
	}
	if err := decode(input, &in); err != nil {
		return nil, err
	}
	if strings.TrimSpace(in.Command) == "" {
		return nil, policy.Errorf(policy.InvalidInput, "command is empty")
	}
	timeout := defaultTimeout
	if in.TimeoutS != nil {
		timeout = *in.TimeoutS
	}
	if timeout < minTimeout || timeout > maxTimeout {
		return nil, policy.Errorf(policy.InvalidInput, "timeout_s %d is out of range: allowed %d–%d seconds", timeout, minTimeout, maxTimeout)
	}
	if t.Commands == nil {
		return nil, policy.Errorf(policy.SandboxUnavailable, "no sandbox is configured for this workspace, so commands can't run; use the file tools")
	}
	if err := t.WS.CheckQuarantine(); err != nil {
		return nil, err
	}
	res, err := t.Commands.RunCommand(ctx, t.WS, CommandRequest{Command: in.Command, Timeout: time.Duration(timeout) * time.Second, CallID: CallID(ctx)})
	if err != nil {
		return nil, err
	}
	t.changed(".")
	return res, nil
}

// resolve is every tool's first step: raw cleaned and op checked by the
// policy, then what the spelling asks of the object there ("notes.txt/"
// names a directory: not_dir for a file, never the file read or replaced).
func (t *Toolbox) resolve(op policy.Op, raw string) (string, error) {
	tg, err := t.WS.Policy().Target(op, raw)
	if err != nil || !tg.Dir {
		return tg.Rel, err
	}
	info, err := t.WS.Lstat(tg.Rel)
	switch {
	case err == nil:
		err = tg.CheckKind(op, info.Kind, true)
	case policy.CodeOf(err) == policy.NotFound:
		err = tg.CheckKind(op, 0, false)
	}
	if err != nil {
		return "", err
	}
	return tg.Rel, nil
}

func orDot(p string) string {
	if p == "" {
		return "."
	}
	return p
}

// bound checks an optional limit argument against its maximum.
func bound(name string, v, maxV int) (int, error) {
	switch {
	case v == 0:
		return maxV, nil
	case v < 0:
		return 0, policy.Errorf(policy.InvalidInput, "%s must be positive", name)
	case v > maxV:
		return maxV, nil
	}
	return v, nil
}
