package patch

import (
	"fmt"
	"strconv"
	"strings"
)

// Action is what a patch does to one file.
type Action string

// The actions a patch may take.
const (
	Add    Action = "add"
	Update Action = "update"
	Delete Action = "delete"
)

// File is one file's part of a patch.
type File struct {
	Action Action
	Path   string
	// MoveTo is where an update moves the file ("" for no move).
	MoveTo string
	// Content is an added file's whole text.
	Content string
	Hunks   []Hunk
	// Line is the patch line (1-based) where this file's part starts, and
	// Header that line as written ("*** Update File: a.go", "--- a/a.go"),
	// so a refusal can name the part a model wrote.
	Line   int
	Header string
}

// Hunk is one run of changed lines with the context around them.
type Hunk struct {
	// Context is the line after "@@ " that narrows down where the hunk
	// is (a function or class header), "" for none.
	Context string
	// Old is the lines the hunk expects (context and removed), New what
	// replaces them (context and added).
	Old, New []string
	// EOF says Old ends the file.
	EOF bool
	// Added and Removed count the hunk's "+" and "-" lines.
	Added, Removed int
	// Line is the patch line (1-based) where the hunk starts.
	Line int
	// keep maps each New line that is context to its index in Old (-1
	// for an added line), so a context line found only by loose matching
	// keeps the file's own spelling.
	keep []int
}

// context adds a context line.
func (h *Hunk) context(l string) {
	h.keep = append(h.keep, len(h.Old))
	h.Old, h.New = append(h.Old, l), append(h.New, l)
}

// added adds an added line.
func (h *Hunk) added(l string) {
	h.keep = append(h.keep, -1)
	h.New = append(h.New, l)
	h.Added++
}

// Limits on what Parse accepts, so a hostile patch costs bounded work.
const (
	MaxFiles = 1000
	MaxHunks = 10000
)

// Error is a patch that can't be parsed: the line (1-based), the header
// of the file part it is in ("" outside one) and why.
type Error struct {
	Line   int
	Header string
	Msg    string
}

func (e *Error) Error() string {
	switch {
	case e.Line == 0:
		return "invalid patch: " + e.Msg
	case e.Header == "":
		return fmt.Sprintf("invalid patch at line %d: %s", e.Line, e.Msg)
	}
	return fmt.Sprintf("invalid patch at line %d (in %s): %s", e.Line, clip(e.Header), e.Msg)
}

const (
	beginMarker  = "*** Begin Patch"
	endMarker    = "*** End Patch"
	addMarker    = "*** Add File: "
	deleteMarker = "*** Delete File: "
	updateMarker = "*** Update File: "
	moveMarker   = "*** Move to: "
	eofMarker    = "*** End of File"
)

// Parse reads a patch in Codex's apply_patch format ("*** Begin Patch"
// … "*** End Patch") or as a unified diff ("--- a/…", "+++ b/…", "@@").
// Line numbers in files and errors count from the text's first line,
// blank lines and a heredoc opener included, as the model wrote it.
func Parse(text string) ([]File, error) {
	text = strings.ReplaceAll(text, "\r\n", "\n")
	trimmed := strings.TrimSpace(text)
	// base is the number of lines before the first one kept.
	base := strings.Count(text[:strings.Index(text, trimmed)], "\n")
	lines := strings.Split(trimmed, "\n")
	if len(lines) == 0 || lines[0] == "" {
		return nil, &Error{Msg: "the patch is empty"}
	}
	first := strings.TrimSpace(lines[0])
	// A heredoc around the patch, as some models write it for a shell.
	if (first == "<<EOF" || first == "<<'EOF'" || first == `<<"EOF"`) && len(lines) >= 4 && strings.HasSuffix(lines[len(lines)-1], "EOF") {
		lines = lines[1 : len(lines)-1]
		first = strings.TrimSpace(lines[0])
		base++
	}
	var files []File
	var err error
	if first == beginMarker {
		files, err = parseCodex(lines, base)
	} else {
		files, err = parseUnified(lines, base)
	}
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, &Error{Line: base + len(lines), Msg: "the patch changes no file; put '*** Add File:', '*** Update File:' or '*** Delete File:' parts before '" + endMarker + "'"}
	}
	if len(files) > MaxFiles {
		return nil, &Error{Msg: fmt.Sprintf("the patch changes %d files; at most %d per patch", len(files), MaxFiles)}
	}
	n := 0
	for _, f := range files {
		n += len(f.Hunks)
	}
	if n > MaxHunks {
		return nil, &Error{Msg: fmt.Sprintf("the patch has %d hunks; at most %d per patch", n, MaxHunks)}
	}
	return files, nil
}

// parseCodex follows Codex's grammar (codex-rs/apply-patch, parser.rs),
// as leniently as Codex: markers may carry surrounding whitespace, blank
// lines may separate hunks, and the first hunk of a file needs no "@@".
// base is the number of patch lines before lines[0].
func parseCodex(lines []string, base int) ([]File, error) {
	last := strings.TrimSpace(lines[len(lines)-1])
	if len(lines) < 2 || last != endMarker {
		return nil, &Error{Line: base + len(lines), Msg: "the last line of the patch must be '" + endMarker + "'"}
	}
	body := lines[1 : len(lines)-1]
	var files []File
	for i := 0; i < len(body); {
		lineNo := base + i + 2
		head := strings.TrimSpace(body[i])
		switch {
		case head == "":
			i++
		case strings.HasPrefix(head, addMarker):
			f := File{Action: Add, Path: strings.TrimSpace(strings.TrimPrefix(head, addMarker)), Line: lineNo, Header: head}
			var b strings.Builder
			i++
			for ; i < len(body) && strings.HasPrefix(body[i], "+"); i++ {
				b.WriteString(body[i][1:])
				b.WriteByte('\n')
			}
			f.Content = b.String()
			files = append(files, f)
		case strings.HasPrefix(head, deleteMarker):
			files = append(files, File{Action: Delete, Path: strings.TrimSpace(strings.TrimPrefix(head, deleteMarker)), Line: lineNo, Header: head})
			i++
		case strings.HasPrefix(head, updateMarker):
			f := File{Action: Update, Path: strings.TrimSpace(strings.TrimPrefix(head, updateMarker)), Line: lineNo, Header: head}
			i++
			if i < len(body) && strings.HasPrefix(strings.TrimSpace(body[i]), moveMarker) {
				f.MoveTo = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(body[i]), moveMarker))
				i++
			}
			for i < len(body) {
				if strings.TrimSpace(body[i]) == "" {
					i++
					continue
				}
				if strings.HasPrefix(body[i], "*") {
					break
				}
				h, n, err := parseCodexHunk(body[i:], base+i+2, len(f.Hunks) == 0)
				if err != nil {
					err.Header = head
					return nil, err
				}
				f.Hunks = append(f.Hunks, h)
				i += n
			}
			if len(f.Hunks) == 0 && f.MoveTo == "" {
				return nil, &Error{Line: lineNo, Header: head, Msg: fmt.Sprintf("the update of %q has no hunks; give it an '@@' hunk of ' ' (context), '-' (removed) and '+' (added) lines", f.Path)}
			}
			files = append(files, f)
		default:
			return nil, &Error{Line: lineNo, Msg: fmt.Sprintf("%q is not a file header; valid headers: '*** Add File: PATH', '*** Delete File: PATH', '*** Update File: PATH'", clip(head))}
		}
	}
	return files, nil
}

// parseCodexHunk reads one hunk at the start of lines and says how many
// lines it took.
func parseCodexHunk(lines []string, lineNo int, first bool) (Hunk, int, *Error) {
	h := Hunk{Line: lineNo}
	start := 0
	switch {
	case lines[0] == "@@" || strings.TrimSpace(lines[0]) == "@@":
		start = 1
	case strings.HasPrefix(lines[0], "@@ "):
		h.Context = strings.TrimPrefix(lines[0], "@@ ")
		start = 1
	case !first:
		return h, 0, &Error{Line: lineNo, Msg: fmt.Sprintf("expected a hunk to start with '@@', got %q", clip(lines[0]))}
	}
	n := 0
	for _, l := range lines[start:] {
		if strings.TrimSpace(l) == eofMarker {
			if n == 0 {
				break
			}
			h.EOF = true
			n++
			break
		}
		if l == "" {
			h.context("")
			n++
			continue
		}
		switch l[0] {
		case ' ':
			h.context(l[1:])
		case '+':
			h.added(l[1:])
		case '-':
			h.Old = append(h.Old, l[1:])
			h.Removed++
		default:
			if n == 0 {
				return h, 0, &Error{Line: lineNo + start, Msg: fmt.Sprintf("unexpected line %q in a hunk: every line starts with ' ' (context), '+' (added) or '-' (removed)", clip(l))}
			}
			return h, start + n, nil
		}
		n++
	}
	if n == 0 {
		return h, 0, &Error{Line: lineNo, Msg: "the hunk has no lines"}
	}
	return h, start + n, nil
}

// parseUnified reads a unified diff (git's or diff -u's). Its hunks keep
// no line numbers: they are located by their lines, like Codex's. base is
// the number of patch lines before lines[0].
func parseUnified(lines []string, base int) ([]File, error) {
	var files []File
	for i := 0; i < len(lines); {
		if !strings.HasPrefix(lines[i], "--- ") {
			// diff --git, index, mode lines and any commentary
			i++
			continue
		}
		head := strings.TrimSpace(lines[i])
		if i+1 >= len(lines) || !strings.HasPrefix(lines[i+1], "+++ ") {
			return nil, &Error{Line: base + i + 1, Header: head, Msg: "a '--- ' line must be followed by a '+++ ' line"}
		}
		from, to := diffPath(lines[i][4:]), diffPath(lines[i+1][4:])
		f := File{Line: base + i + 1, Header: head}
		switch {
		case from == "" && to == "":
			return nil, &Error{Line: base + i + 1, Header: head, Msg: "both sides of the file header are /dev/null"}
		case from == "":
			// "--- /dev/null" names no file: the part is its "+++ " line.
			f.Action, f.Path = Add, to
			f.Line, f.Header = base+i+2, strings.TrimSpace(lines[i+1])
		case to == "":
			f.Action, f.Path = Delete, from
		default:
			f.Action, f.Path = Update, from
			if to != from {
				f.MoveTo = to
			}
		}
		i += 2
		for i < len(lines) && strings.HasPrefix(lines[i], "@@") {
			h, n, err := parseUnifiedHunk(lines[i:], base+i+1)
			if err != nil {
				err.Header = head
				return nil, err
			}
			f.Hunks = append(f.Hunks, h)
			i += n
		}
		switch f.Action {
		case Add:
			var b strings.Builder
			for _, h := range f.Hunks {
				for _, l := range h.New {
					b.WriteString(l)
					b.WriteByte('\n')
				}
			}
			f.Content, f.Hunks = b.String(), nil
		case Delete:
			f.Hunks = nil
		case Update:
			if len(f.Hunks) == 0 && f.MoveTo == "" {
				return nil, &Error{Line: f.Line, Header: head, Msg: fmt.Sprintf("the diff of %q has no hunks; give it an '@@ -LINE,COUNT +LINE,COUNT @@' hunk", f.Path)}
			}
		}
		files = append(files, f)
	}
	if len(files) == 0 {
		return nil, &Error{Line: base + 1, Msg: "not a patch: expected '*** Begin Patch' (apply_patch format) or '--- a/PATH' and '+++ b/PATH' (unified diff)"}
	}
	return files, nil
}

// parseUnifiedHunk reads "@@ -l,n +l,n @@ context" and its lines. The
// counts say where the hunk ends; the line numbers are not used.
func parseUnifiedHunk(lines []string, lineNo int) (Hunk, int, *Error) {
	h := Hunk{Line: lineNo}
	oldN, newN, ok := hunkCounts(lines[0])
	if !ok {
		return h, 0, &Error{Line: lineNo, Msg: fmt.Sprintf("malformed hunk header %q; expected '@@ -LINE,COUNT +LINE,COUNT @@'", clip(lines[0]))}
	}
	n := 1
	for ; n < len(lines) && (oldN > 0 || newN > 0); n++ {
		l := lines[n]
		if strings.HasPrefix(l, `\`) { // \ No newline at end of file
			continue
		}
		if l == "" {
			l = " "
		}
		switch l[0] {
		case ' ':
			h.context(l[1:])
			oldN--
			newN--
		case '-':
			h.Old = append(h.Old, l[1:])
			h.Removed++
			oldN--
		case '+':
			h.added(l[1:])
			newN--
		default:
			return h, 0, &Error{Line: lineNo + n, Msg: fmt.Sprintf("the hunk ends early at %q: its header promised more lines", clip(l))}
		}
	}
	if oldN != 0 || newN != 0 {
		return h, 0, &Error{Line: lineNo, Msg: "the hunk has fewer lines than its header says"}
	}
	for n < len(lines) && strings.HasPrefix(lines[n], `\`) {
		n++
	}
	return h, n, nil
}

// hunkCounts reads the line counts of "@@ -l[,n] +l[,n] @@".
func hunkCounts(s string) (oldN, newN int, ok bool) {
	f := strings.Fields(s)
	if len(f) < 3 || f[0] != "@@" || !strings.HasPrefix(f[1], "-") || !strings.HasPrefix(f[2], "+") {
		return 0, 0, false
	}
	count := func(r string) (int, bool) {
		_, c, has := strings.Cut(r[1:], ",")
		if !has {
			return 1, true
		}
		n, err := strconv.Atoi(c)
		return n, err == nil && n >= 0 && n < 1<<24
	}
	oldN, ok1 := count(f[1])
	newN, ok2 := count(f[2])
	return oldN, newN, ok1 && ok2
}

// diffPath reads a unified diff header's path: "a/x" and "b/x" are x,
// /dev/null is "", and a tab-separated timestamp is dropped.
func diffPath(s string) string {
	s, _, _ = strings.Cut(s, "\t")
	s = strings.TrimSpace(s)
	if s == "/dev/null" {
		return ""
	}
	if strings.HasPrefix(s, "a/") || strings.HasPrefix(s, "b/") {
		return s[2:]
	}
	return s
}

func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
