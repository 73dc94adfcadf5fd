package patch

import (
	"fmt"
	"strings"
)

// HunkError says that a hunk does not apply: which one (0-based), what
// was looked for, and the closest lines found, so a model can fix its
// patch.
type HunkError struct {
	Hunk int
	// Line is the hunk's line in the patch.
	Line int
	Msg  string
	// Closest are the file's lines most like the hunk's, from line
	// ClosestLine (1-based); none when the file is empty.
	Closest     []string
	ClosestLine int
}

func (e *HunkError) Error() string {
	s := fmt.Sprintf("hunk %d (patch line %d): %s", e.Hunk+1, e.Line, e.Msg)
	if len(e.Closest) > 0 {
		s += fmt.Sprintf("; the closest lines are at line %d:\n%s", e.ClosestLine, strings.Join(e.Closest, "\n"))
	}
	return s
}

// Apply applies an update's hunks to text and returns the new text,
// which ends with a newline, as Codex writes it. Each hunk is sought
// after the one before, its Context line first; a file in CRLF keeps its
// line ends.
func Apply(text string, hunks []Hunk) (string, error) {
	crlf := strings.Contains(text, "\r\n")
	if crlf {
		text = strings.ReplaceAll(text, "\r\n", "\n")
	}
	lines := strings.Split(text, "\n")
	if len(lines) > 0 && lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	type replacement struct {
		at, n int
		with  []string
	}
	var reps []replacement
	at := 0
	for i, h := range hunks {
		if h.Context != "" {
			idx := Seek(lines, []string{h.Context}, at, false)
			if idx < 0 {
				return "", closest(&HunkError{Hunk: i, Line: h.Line, Msg: fmt.Sprintf("its context line %q is not in the file (after line %d)", clip(h.Context), at)}, lines, []string{h.Context})
			}
			at = idx + 1
		}
		if len(h.Old) == 0 {
			// Nothing to anchor on: Codex appends at the end.
			reps = append(reps, replacement{len(lines), 0, h.New})
			continue
		}
		old, repl := h.Old, h.New
		idx := Seek(lines, old, at, h.EOF)
		if idx < 0 && old[len(old)-1] == "" {
			// A trailing empty line may stand for the final newline.
			old = old[:len(old)-1]
			if len(repl) > 0 && repl[len(repl)-1] == "" {
				repl = repl[:len(repl)-1]
			}
			idx = Seek(lines, old, at, h.EOF)
		}
		if idx < 0 {
			where := "the file"
			if at > 0 {
				where = fmt.Sprintf("the file after line %d", at)
			}
			return "", closest(&HunkError{Hunk: i, Line: h.Line, Msg: fmt.Sprintf("its %d expected lines are not in %s (matched exactly, then ignoring trailing and surrounding whitespace, then typographic punctuation)", len(h.Old), where)}, lines, h.Old)
		}
		reps = append(reps, replacement{idx, len(old), h.spelled(lines[idx:idx+len(old)], repl)})
		at = idx + len(old)
	}
	// Codex applies them sorted by place, last first.
	for i := 1; i < len(reps); i++ {
		for j := i; j > 0 && reps[j].at < reps[j-1].at; j-- {
			reps[j], reps[j-1] = reps[j-1], reps[j]
		}
	}
	out := make([]string, 0, len(lines))
	cur := 0
	for _, r := range reps {
		if r.at < cur {
			return "", &HunkError{Hunk: 0, Msg: "two hunks change the same lines"}
		}
		out = append(out, lines[cur:r.at]...)
		out = append(out, r.with...)
		cur = r.at + r.n
	}
	out = append(out, lines[cur:]...)
	nl := "\n"
	if crlf {
		nl = "\r\n"
	}
	if len(out) == 0 {
		return "", nil
	}
	return strings.Join(out, nl) + nl, nil
}

// spelled returns repl with each context line as found in the file.
func (h *Hunk) spelled(found, repl []string) []string {
	if len(h.keep) != len(h.New) {
		return repl
	}
	out := make([]string, len(repl))
	for j, l := range repl {
		if k := h.keep[j]; k >= 0 && k < len(found) {
			l = found[k]
		}
		out[j] = l
	}
	return out
}

// Seek finds pattern in lines at or after start and returns where it
// begins, or -1. It tries with decreasing strictness, as Codex's
// seek_sequence: exact, then ignoring trailing whitespace, then ignoring
// surrounding whitespace, then with typographic dashes, quotes and spaces
// read as their ASCII forms. With eof it first tries the end of the file.
func Seek(lines, pattern []string, start int, eof bool) int {
	if len(pattern) == 0 {
		return start
	}
	if len(pattern) > len(lines) {
		return -1
	}
	from := start
	if eof {
		from = len(lines) - len(pattern)
	}
	for _, eq := range []func(a, b string) bool{
		func(a, b string) bool { return a == b },
		func(a, b string) bool { return strings.TrimRight(a, " \t\r\v\f") == strings.TrimRight(b, " \t\r\v\f") },
		func(a, b string) bool { return strings.TrimSpace(a) == strings.TrimSpace(b) },
		func(a, b string) bool { return normalise(a) == normalise(b) },
	} {
		for _, s := range []int{from, start} {
			if i := seekWith(lines, pattern, s, eq); i >= 0 {
				return i
			}
			if s == start {
				break
			}
		}
	}
	return -1
}

func seekWith(lines, pattern []string, start int, eq func(a, b string) bool) int {
	for i := max(start, 0); i+len(pattern) <= len(lines); i++ {
		ok := true
		for j, p := range pattern {
			if !eq(lines[i+j], p) {
				ok = false
				break
			}
		}
		if ok {
			return i
		}
	}
	return -1
}

// normalise trims s and reads typographic punctuation as ASCII.
func normalise(s string) string {
	return strings.Map(func(r rune) rune {
		switch r {
		case '\u2010', '\u2011', '\u2012', '\u2013', '\u2014', '\u2015', '\u2212':
			return '-'
		case '\u2018', '\u2019', '\u201A', '\u201B':
			return '\''
		case '\u201C', '\u201D', '\u201E', '\u201F':
			return '"'
		case '\u00A0', '\u2002', '\u2003', '\u2004', '\u2005', '\u2006', '\u2007', '\u2008', '\u2009', '\u200A', '\u202F', '\u205F', '\u3000':
			return ' '
		}
		return r
	}, strings.TrimSpace(s))
}

// closestMaxLines bounds the lines a HunkError quotes.
const closestMaxLines = 12

// closest fills e with the window of lines most like want: the most lines
// equal after trimming, the first such window on a tie.
func closest(e *HunkError, lines, want []string) error {
	if len(lines) == 0 {
		return e
	}
	n := min(len(want), len(lines))
	trimmed := make([]string, len(want))
	for i, w := range want {
		trimmed[i] = strings.TrimSpace(w)
	}
	best, bestAt := -1, 0
	for i := 0; i+n <= len(lines); i++ {
		score := 0
		for j := 0; j < n; j++ {
			if strings.TrimSpace(lines[i+j]) == trimmed[j] {
				score++
			}
		}
		if score > best {
			best, bestAt = score, i
		}
	}
	if best <= 0 {
		return e
	}
	end := min(bestAt+min(n, closestMaxLines), len(lines))
	e.Closest = append([]string(nil), lines[bestAt:end]...)
	e.ClosestLine = bestAt + 1
	return e
}
