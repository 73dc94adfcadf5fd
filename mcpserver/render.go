package mcpserver

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/tools"
)

// render is the text a model reads beside the structured result: the
// shapes it knows from a terminal (cat -n, grep -n, ls), with the figures
// it needs next (sha256, truncation and how to continue) in words. A result
// it can't decode is shown as its JSON.
func render(name string, res json.RawMessage) string {
	r, ok := renderers[name]
	if !ok {
		return string(res)
	}
	text, err := r(res)
	if err != nil {
		return string(res)
	}
	return text
}

var renderers = map[string]func(json.RawMessage) (string, error){
	tools.List:    renderList,
	tools.Stat:    renderStat,
	tools.Glob:    renderGlob,
	tools.Grep:    renderGrep,
	tools.Read:    renderRead,
	tools.Write:   renderWrite,
	tools.Edit:    renderEdit,
	tools.Mkdir:   renderMkdir,
	tools.Delete:  renderDelete,
	tools.Command: renderCommand,
}

func plural(n int, one, many string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, one)
	}
	return fmt.Sprintf("%d %s", n, many)
}

// renderRead numbers the lines like cat -n: "    12\tline".
func renderRead(res json.RawMessage) (string, error) {
	var r tools.ReadResult
	if err := json.Unmarshal(res, &r); err != nil {
		return "", err
	}
	var b strings.Builder
	if r.TotalLines == 0 {
		fmt.Fprintf(&b, "%s: empty file, sha256 %s\n", r.Path, r.SHA256)
		return b.String(), nil
	}
	last := r.Offset + r.Lines - 1
	fmt.Fprintf(&b, "%s: lines %d-%d of %d, sha256 %s\n", r.Path, r.Offset, last, r.TotalLines, r.SHA256)
	if r.Binary {
		b.WriteString("(binary file: it contains NUL bytes)\n")
	}
	n := r.Offset
	for line := range strings.Lines(r.Content) {
		fmt.Fprintf(&b, "%6d\t%s", n, line)
		if !strings.HasSuffix(line, "\n") {
			b.WriteString("\n(no newline at end of file)\n")
		}
		n++
	}
	if r.Truncated && last < r.TotalLines {
		fmt.Fprintf(&b, "(%s; continue with offset %d)\n", plural(r.TotalLines-last, "more line", "more lines"), last+1)
	}
	return b.String(), nil
}

// renderGrep lists matches as "path:line: text", context lines as
// "path-line- text", groups apart by "--" as grep does.
func renderGrep(res json.RawMessage) (string, error) {
	var r tools.GrepResult
	if err := json.Unmarshal(res, &r); err != nil {
		return "", err
	}
	var b strings.Builder
	withContext := false
	for _, m := range r.Matches {
		withContext = withContext || len(m.Before) > 0 || len(m.After) > 0
	}
	for i, m := range r.Matches {
		if withContext && i > 0 {
			b.WriteString("--\n")
		}
		for j, t := range m.Before {
			fmt.Fprintf(&b, "%s-%d- %s\n", m.Path, m.Line-len(m.Before)+j, t)
		}
		fmt.Fprintf(&b, "%s:%d: %s\n", m.Path, m.Line, m.Text)
		for j, t := range m.After {
			fmt.Fprintf(&b, "%s-%d- %s\n", m.Path, m.Line+1+j, t)
		}
	}
	if len(r.Matches) == 0 {
		b.WriteString("no matches")
	} else {
		fmt.Fprintf(&b, "%s in %s", plural(len(r.Matches), "matching line", "matching lines"), plural(r.FilesMatched, "file", "files"))
	}
	fmt.Fprintf(&b, " (%s searched", plural(r.FilesSearched, "file", "files"))
	for _, s := range []struct {
		n    int
		what string
	}{{r.SkippedBinary, "binary"}, {r.SkippedLarge, "too large"}, {r.SkippedRefused, "refused"}, {r.SkippedDeep, "too deep to name"}} {
		if s.n > 0 {
			fmt.Fprintf(&b, ", %d skipped as %s", s.n, s.what)
		}
	}
	b.WriteString(")\n")
	switch {
	case r.MatchesOmitted > 0:
		fmt.Fprintf(&b, "(truncated: %s not shown; narrow the pattern, path or glob)\n", plural(r.MatchesOmitted, "more matching line", "more matching lines"))
	case r.Truncated:
		b.WriteString("(truncated: results were cut; narrow the pattern, path or glob)\n")
	}
	return b.String(), nil
}

// renderList shows one entry a line, directories with a trailing "/".
func renderList(res json.RawMessage) (string, error) {
	var r tools.ListResult
	if err := json.Unmarshal(res, &r); err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s\n", r.Path, plural(r.Total, "entry", "entries"))
	for _, e := range r.Entries {
		b.WriteString(entryLine(e.Name, e))
	}
	if r.Truncated {
		fmt.Fprintf(&b, "(%d shown of %d; list a subdirectory or use workspace_glob)\n", len(r.Entries), r.Total)
	}
	return b.String(), nil
}

func entryLine(name string, e tools.Entry) string {
	switch {
	case e.Type == "dir":
		return fmt.Sprintf("%s/\n", name)
	case e.Refused != "":
		return fmt.Sprintf("%s  (%s, refused: %s)\n", name, e.Type, e.Refused)
	case e.Type == "file":
		return fmt.Sprintf("%s  %s\n", name, policy.Bytes(e.Size))
	default:
		return fmt.Sprintf("%s  (%s)\n", name, e.Type)
	}
}

func renderStat(res json.RawMessage) (string, error) {
	var e tools.Entry
	if err := json.Unmarshal(res, &e); err != nil {
		return "", err
	}
	s := fmt.Sprintf("%s: %s, %s, mode %s, modified %s", e.Path, e.Type, policy.Bytes(e.Size), e.Mode, e.MTime)
	if e.SHA256 != "" {
		s += ", sha256 " + e.SHA256
	}
	if e.Refused != "" {
		s += ", refused: " + e.Refused
	}
	return s + "\n", nil
}

func renderGlob(res json.RawMessage) (string, error) {
	var r tools.GlobResult
	if err := json.Unmarshal(res, &r); err != nil {
		return "", err
	}
	s := "no paths match\n"
	if len(r.Matches) > 0 {
		s = strings.Join(r.Matches, "\n") + "\n"
	}
	if r.Truncated {
		s += fmt.Sprintf("(truncated: %d shown; narrow the pattern)\n", len(r.Matches))
	}
	if r.SkippedDeep > 0 {
		s += fmt.Sprintf("(%s skipped: paths too deep to name)\n", plural(r.SkippedDeep, "entry", "entries"))
	}
	return s, nil
}

func renderWrite(res json.RawMessage) (string, error) {
	var r tools.WriteResult
	if err := json.Unmarshal(res, &r); err != nil {
		return "", err
	}
	verb := "replaced"
	if r.Created {
		verb = "created"
	}
	return fmt.Sprintf("%s %s: %s, sha256 %s\n", verb, r.Path, plural(int(r.Bytes), "byte", "bytes"), r.SHA256), nil
}

func renderEdit(res json.RawMessage) (string, error) {
	var r tools.EditResult
	if err := json.Unmarshal(res, &r); err != nil {
		return "", err
	}
	return fmt.Sprintf("edited %s: %s, sha256 %s\n", r.Path, plural(r.Replacements, "replacement", "replacements"), r.SHA256), nil
}

func renderMkdir(res json.RawMessage) (string, error) {
	var r tools.MkdirResult
	if err := json.Unmarshal(res, &r); err != nil {
		return "", err
	}
	if r.Created {
		return fmt.Sprintf("created directory %s\n", r.Path), nil
	}
	return fmt.Sprintf("directory %s already exists\n", r.Path), nil
}

func renderDelete(res json.RawMessage) (string, error) {
	var r tools.DeleteResult
	if err := json.Unmarshal(res, &r); err != nil {
		return "", err
	}
	return fmt.Sprintf("deleted %s\n", r.Path), nil
}

func renderCommand(res json.RawMessage) (string, error) {
	var r tools.CommandResult
	if err := json.Unmarshal(res, &r); err != nil {
		return "", err
	}
	var b strings.Builder
	if r.TimedOut {
		fmt.Fprintf(&b, "timed out after %d ms; the container was killed\n", r.DurationMS)
	} else {
		fmt.Fprintf(&b, "exit code %d (%d ms)\n", r.ExitCode, r.DurationMS)
	}
	for _, s := range []struct {
		name, text string
		cut        bool
	}{{"stdout", r.Stdout, r.StdoutTruncated}, {"stderr", r.Stderr, r.StderrTruncated}} {
		if s.text == "" && !s.cut {
			continue
		}
		fmt.Fprintf(&b, "--- %s ---\n%s", s.name, s.text)
		if !strings.HasSuffix(s.text, "\n") {
			b.WriteString("\n")
		}
		if s.cut {
			fmt.Fprintf(&b, "(%s truncated)\n", s.name)
		}
	}
	if ev := r.PolicyEvents; ev.Total > 0 {
		fmt.Fprintf(&b, "--- refused by the workspace policy: %s ---\n", plural(ev.Total, "operation", "operations"))
		for _, e := range ev.Events {
			fmt.Fprintf(&b, "%s %s: %s (%s): %s\n", e.Op, e.Path, e.Errno, e.Code, e.Message)
		}
		if ev.Dropped > 0 {
			fmt.Fprintf(&b, "(%d more not listed)\n", ev.Dropped)
		}
	}
	return b.String(), nil
}
