package tools

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"path"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/dlclark/regexp2"
	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

const maxContext = 10

// globPattern is a glob split into its components, where "**" matches any
// number of directories.
type globPattern []string

// newGlob splits pattern; a run of "**" matches what one does.
func newGlob(pattern string) globPattern {
	var g globPattern
	for _, c := range strings.Split(pattern, "/") {
		if c == "**" && len(g) > 0 && g[len(g)-1] == "**" {
			continue
		}
		g = append(g, c)
	}
	return g
}

// match reports whether the slash-separated path name matches. It keeps the
// set of name prefixes the pattern so far can match, one pattern component
// at a time, so it makes at most len(pattern)×len(name) component matches
// however many "**" there are; trying each split recursively, as a
// backtracking matcher does, is exponential in the number of "**" on a deep
// tree (an agent can make one).
func (g globPattern) match(name string) bool {
	parts := strings.Split(name, "/")
	// ok[j]: the pattern so far matches parts[:j].
	ok := make([]bool, len(parts)+1)
	next := make([]bool, len(parts)+1)
	ok[0] = true
	for _, p := range g {
		if p == "**" {
			seen := false
			for j, o := range ok {
				seen = seen || o
				next[j] = seen
			}
		} else {
			next[0] = false
			for j := 1; j <= len(parts); j++ {
				next[j] = false
				if ok[j-1] {
					next[j], _ = path.Match(p, parts[j-1])
				}
			}
		}
		ok, next = next, ok
	}
	return ok[len(parts)]
}

// globMatch matches a slash-separated path against a glob.
func globMatch(pattern, name string) bool { return newGlob(pattern).match(name) }

func checkGlob(pattern string) error {
	if pattern == "" {
		return policy.Errorf(policy.InvalidInput, "pattern is empty")
	}
	if len(pattern) > policy.MaxPathBytes {
		// As long as the longest path: enough, and it bounds a match's work.
		return policy.Errorf(policy.InvalidInput, "glob is %d bytes; the limit is %d", len(pattern), policy.MaxPathBytes)
	}
	if strings.HasPrefix(pattern, "/") {
		return policy.Errorf(policy.InvalidInput, "glob %q is absolute; give a pattern relative to path", pattern)
	}
	for _, c := range strings.Split(pattern, "/") {
		if c == ".." {
			return policy.Errorf(policy.InvalidInput, "glob %q contains \"..\"; patterns stay inside the workspace", pattern)
		}
		if _, err := path.Match(c, ""); err != nil {
			return policy.Errorf(policy.InvalidInput, "glob %q is malformed: %v", pattern, err)
		}
	}
	return nil
}

// relTo returns p relative to base (both cleaned workspace paths).
func relTo(base, p string) string {
	if base == "." {
		return p
	}
	return strings.TrimPrefix(p, base+"/")
}

func handleGlob(ctx context.Context, t *Toolbox, input json.RawMessage) (any, error) {
	var in struct {
		Pattern string `json:"pattern"`
		Path    string `json:"path"`
		Limit   int    `json:"limit"`
	}
	if err := decode(input, &in); err != nil {
		return nil, err
	}
	pol := t.WS.Policy()
	limit, err := bound("limit", in.Limit, pol.Limits.GlobResults)
	if err != nil {
		return nil, err
	}
	if err := checkGlob(in.Pattern); err != nil {
		return nil, err
	}
	base, err := t.resolve(policy.OpList, orDot(in.Path))
	if err != nil {
		return nil, err
	}
	budget := pol.Limits.GrepBudget
	ctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	pattern := strings.TrimPrefix(path.Clean(in.Pattern), "./")
	glob := newGlob(pattern)
	deep := strings.Contains(pattern, "**")
	depth := strings.Count(pattern, "/") + 1
	var matches []string
	visited, walkCut, skippedDeep, refused := 0, false, 0, 0
	err = t.WS.Walk(ctx, base, func(rel string, info store.Info) error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		visited++
		if visited > pol.Limits.WalkEntries {
			walkCut = true
			return errStop
		}
		if !policy.Addressable(rel) {
			skippedDeep++
			return store.SkipDir
		}
		if info.OtherMount {
			refused++ // never matched: not even its name belongs to the scope
			return nil
		}
		r := relTo(base, rel)
		if glob.match(r) {
			matches = append(matches, rel)
		}
		if info.Kind == policy.KindDir && !deep && strings.Count(r, "/")+1 >= depth {
			return store.SkipDir
		}
		return nil
	})
	if err != nil && err != errStop {
		if ctx.Err() != nil {
			return nil, budgetErr(Glob, budget)
		}
		return nil, err
	}
	sort.Strings(matches)
	out := GlobResult{Pattern: in.Pattern, Path: base, Matches: []string{}, Total: len(matches), Truncated: walkCut, SkippedDeep: skippedDeep, SkippedRefused: refused}
	if len(matches) > limit {
		matches, out.Truncated = matches[:limit], true
	}
	out.Matches = append(out.Matches, matches...)
	return out, nil
}

var errStop = errors.New("stop walking")

// GrepMatch is one matching line.
type GrepMatch struct {
	Path   string   `json:"path"`
	Line   int      `json:"line"`
	Text   string   `json:"text"`
	Before []string `json:"before,omitempty"`
	After  []string `json:"after,omitempty"`
}

// matcher finds the next matching line in a buffer.
type matcher interface {
	// next returns the start of the first match at or after off, or -1.
	next(b []byte, off int) (int, error)
}

// re2 is Go's linear-time engine: the default.
type re2 struct{ re *regexp.Regexp }

func (m re2) next(b []byte, off int) (int, error) {
	loc := m.re.FindIndex(b[off:])
	if loc == nil {
		return -1, nil
	}
	return off + loc[0], nil
}

// backtracking is regexp2, used only for what RE2 lacks (backreferences,
// lookaround): line by line, lines capped, each match timed out, and the
// whole call bounded by a deadline.
type backtracking struct {
	re       *regexp2.Regexp
	maxLine  int
	deadline time.Time
}

// The two limits that stop a search, told apart so the answer names the
// one that did.
var (
	errMatchLimit = errors.New("a match ran past the per-match limit")
	errBudget     = errors.New("the call's time budget ran out")
)

func (m backtracking) next(b []byte, off int) (int, error) {
	for off < len(b) {
		end := bytes.IndexByte(b[off:], '\n')
		if end < 0 {
			end = len(b)
		} else {
			end += off
		}
		line := b[off:end]
		if len(line) <= m.maxLine {
			if time.Now().After(m.deadline) {
				return -1, errBudget
			}
			ok, err := m.re.MatchString(string(line))
			if err != nil {
				if time.Now().After(m.deadline) {
					return -1, errBudget
				}
				return -1, errMatchLimit
			}
			if ok {
				return off, nil
			}
		}
		off = end + 1
	}
	return -1, nil
}

func compile(pattern string, ignoreCase bool, l policy.Limits, deadline time.Time) (matcher, error) {
	if pattern == "" {
		return nil, policy.Errorf(policy.InvalidInput, "pattern is empty")
	}
	flags := "(?m)"
	if ignoreCase {
		flags = "(?mi)"
	}
	re, err := regexp.Compile(flags + pattern)
	if err == nil {
		return re2{re}, nil
	}
	opts := regexp2.RegexOptions(regexp2.Multiline)
	if ignoreCase {
		opts |= regexp2.IgnoreCase
	}
	re2x, err2 := regexp2.Compile(pattern, opts)
	if err2 != nil {
		return nil, policy.Errorf(policy.InvalidInput, "pattern does not compile: %v", err)
	}
	// No single match outlasts the call's budget either.
	re2x.MatchTimeout = max(min(l.RegexTimeout, time.Until(deadline)), time.Millisecond)
	return backtracking{re: re2x, maxLine: l.GrepLine, deadline: deadline}, nil
}

func handleGrep(ctx context.Context, t *Toolbox, input json.RawMessage) (any, error) {
	var in struct {
		Pattern    string `json:"pattern"`
		Path       string `json:"path"`
		Glob       string `json:"glob"`
		IgnoreCase bool   `json:"ignore_case"`
		Context    int    `json:"context"`
		Limit      int    `json:"limit"`
	}
	if err := decode(input, &in); err != nil {
		return nil, err
	}
	pol := t.WS.Policy()
	l := pol.Limits
	limit, err := bound("limit", in.Limit, l.GrepMatches)
	if err != nil {
		return nil, err
	}
	if in.Context < 0 || in.Context > maxContext {
		return nil, policy.Errorf(policy.InvalidInput, "context must be 0–%d lines", maxContext)
	}
	var glob func(rel string) bool
	if in.Glob != "" {
		if err := checkGlob(in.Glob); err != nil {
			return nil, err
		}
		glob = grepGlob(in.Glob)
	}
	budget := l.GrepBudget
	ctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	deadline, _ := ctx.Deadline()
	m, err := compile(in.Pattern, in.IgnoreCase, l, deadline)
	if err != nil {
		return nil, err
	}
	base, err := t.resolve(policy.OpRead, orDot(in.Path))
	if err != nil {
		return nil, err
	}

	// Collect candidate files first (a bounded walk), then search them in
	// parallel; results are put back in path order.
	type file struct {
		rel  string
		size int64
	}
	var files []file
	var out GrepResult
	info, err := t.WS.Lstat(base)
	if err != nil {
		return nil, err
	}
	if info.Kind == policy.KindLink || info.Kind == policy.KindSymlink {
		return nil, policy.CheckObject(policy.OpRead, base, info.Object()) // never followed
	}
	if info.Kind == policy.KindRegular {
		files = append(files, file{base, info.Size})
	} else {
		visited := 0
		err = t.WS.Walk(ctx, base, func(rel string, info store.Info) error {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			visited++
			if visited > l.WalkEntries {
				out.Truncated = true
				return errStop
			}
			if !policy.Addressable(rel) {
				out.SkippedDeep++
				return store.SkipDir
			}
			if info.Kind != policy.KindRegular || info.OtherMount {
				if info.Kind != policy.KindDir || info.OtherMount {
					out.SkippedRefused++
				}
				return nil
			}
			if glob != nil && !glob(relTo(base, rel)) {
				return nil
			}
			if pol.Check(policy.OpRead, rel) != nil || policy.CheckObject(policy.OpRead, rel, info.Object()) != nil {
				out.SkippedRefused++
				return nil
			}
			if l.CheckText(rel, info.Size) != nil {
				out.SkippedLarge++
				return nil
			}
			files = append(files, file{rel, info.Size})
			return nil
		})
		if err != nil && err != errStop {
			if ctx.Err() != nil {
				return nil, budgetErr(Grep, budget)
			}
			return nil, err
		}
	}

	results := make([][]GrepMatch, len(files))
	found := make([]int, len(files))  // matching lines, returned or not
	flags := make([]byte, len(files)) // 1 binary, 2 large, 3 refused
	var mu sync.Mutex
	var scanned int64
	var firstErr error
	next := 0
	var wg sync.WaitGroup
	workers := min(runtime.GOMAXPROCS(0), 8)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 0, 64<<10)
			for {
				mu.Lock()
				if next >= len(files) || firstErr != nil || scanned >= l.GrepScan {
					if next < len(files) && scanned >= l.GrepScan {
						out.Truncated = true
					}
					mu.Unlock()
					return
				}
				i := next
				next++
				scanned += files[i].size
				mu.Unlock()
				ms, n, flag, err := grepFile(ctx, t.WS, files[i].rel, m, in.Context, limit, &buf, l)
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
				results[i], found[i], flags[i] = ms, n, flag
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		var ml *matchLimitError
		switch {
		case errors.As(firstErr, &ml):
			return nil, policy.Errorf(policy.Timeout, "search stopped: the pattern ran past its per-match limit of %s on a line of %s (backreferences and lookaround use a backtracking engine, which can take exponential time); simplify the pattern or narrow path/glob", l.RegexTimeout, ml.rel)
		case firstErr == errBudget || ctx.Err() != nil:
			return nil, budgetErr(Grep, budget)
		}
		return nil, firstErr
	}
	out.Pattern, out.Path, out.Matches = in.Pattern, base, []GrepMatch{}
	for i, ms := range results {
		switch flags[i] {
		case 1:
			out.SkippedBinary++
		case 2:
			out.SkippedLarge++
		case 3:
			out.SkippedRefused++
		}
		if ms != nil {
			out.FilesMatched++
		}
		for _, mt := range ms {
			if len(out.Matches) == limit {
				break
			}
			out.Matches = append(out.Matches, mt)
		}
		out.MatchesOmitted += found[i]
		if flags[i] == 0 || ms != nil {
			out.FilesSearched++
		}
	}
	// Matching lines found beyond the cap; the search may also have
	// stopped early (the scan or walk cap), leaving more unknown.
	out.MatchesOmitted -= len(out.Matches)
	out.Truncated = out.Truncated || out.MatchesOmitted > 0
	out.BytesScanned = min(scanned, l.GrepScan)
	return out, nil
}

// matchLimitError says a backtracking match on a line of rel ran past the
// per-match limit.
type matchLimitError struct{ rel string }

func (e *matchLimitError) Error() string { return errMatchLimit.Error() + " in " + e.rel }

// budgetErr answers a search stopped by the call's time budget.
func budgetErr(tool string, budget time.Duration) error {
	return policy.Errorf(policy.Timeout, "%s stopped: it ran past the call's time budget of %s; narrow path or the pattern", tool, budget)
}

// grepGlob returns the glob filter for files: by name when the glob has no
// "/", by path below the search root otherwise.
func grepGlob(glob string) func(rel string) bool {
	if !strings.Contains(glob, "/") {
		return func(rel string) bool {
			_, name := policy.Split(rel)
			ok, _ := path.Match(glob, name)
			return ok
		}
	}
	return newGlob(glob).match
}

// grepFile searches one file. It opens the file with the same checks as
// every read and reads at most the text limit.
// It returns at most limit matches and how many lines matched in all.
func grepFile(ctx context.Context, ws *store.Workspace, rel string, m matcher, nctx, limit int, buf *[]byte, l policy.Limits) ([]GrepMatch, int, byte, error) {
	if ctx.Err() != nil {
		return nil, 0, 0, errBudget
	}
	f, info, err := ws.Open(policy.OpRead, rel, unix.O_RDONLY)
	if err != nil {
		switch policy.CodeOf(err) {
		case policy.NotFound:
			return nil, 0, 0, nil // removed meanwhile
		case policy.SymlinkRefused, policy.HardlinkRefused, policy.SpecialFileRefused, policy.PermissionDenied:
			return nil, 0, 3, nil
		}
		return nil, 0, 0, err
	}
	defer f.Close()
	if l.CheckText(rel, info.Size) != nil {
		return nil, 0, 2, nil
	}
	b := (*buf)[:0]
	if int64(cap(b)) < info.Size+1 {
		b = make([]byte, 0, info.Size+1)
	}
	// One byte past the limit, so growth since the fstat is caught.
	b, err = readAll(f, b, l.TextBytes+1)
	*buf = b
	if err != nil {
		return nil, 0, 0, policy.FromErrno(err, "read", rel)
	}
	if l.CheckText(rel, int64(len(b))) != nil {
		return nil, 0, 2, nil
	}
	head := b
	if len(head) > 8192 {
		head = head[:8192]
	}
	if bytes.IndexByte(head, 0) >= 0 {
		return nil, 0, 1, nil
	}
	// Past the cap, matching lines are still counted, so a cut result can
	// say how many it left out.
	var out []GrepMatch
	n := 0
	off := 0
	lineNo, lineOff := 1, 0 // line number of position lineOff
	for off <= len(b) {
		at, err := m.next(b, off)
		if err == errMatchLimit {
			return nil, 0, 0, &matchLimitError{rel}
		}
		if err != nil {
			return nil, 0, 0, err
		}
		if at < 0 {
			break
		}
		start := bytes.LastIndexByte(b[:at], '\n') + 1
		end := bytes.IndexByte(b[at:], '\n')
		if end < 0 {
			end = len(b)
		} else {
			end += at
		}
		n++
		off = end + 1
		if len(out) == limit {
			continue
		}
		lineNo += bytes.Count(b[lineOff:start], []byte{'\n'})
		lineOff = start
		gm := GrepMatch{Path: rel, Line: lineNo, Text: clip(b[start:end])}
		if nctx > 0 {
			gm.Before, gm.After = around(b, start, end, nctx)
		}
		out = append(out, gm)
	}
	return out, n, 0, nil
}

func readAll(r io.Reader, b []byte, maxBytes int64) ([]byte, error) {
	for int64(len(b)) < maxBytes {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
	return b, nil
}

// clip bounds one reported line so a minified file can't flood a result.
func clip(line []byte) string {
	const maxText = 1000
	s := strings.TrimRight(string(line), "\r")
	if len(s) > maxText {
		s = strings.ToValidUTF8(s[:maxText], "") + "…[line cut]"
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

func around(b []byte, start, end, n int) (before, after []string) {
	s := start
	for i := 0; i < n && s > 0; i++ {
		p := bytes.LastIndexByte(b[:s-1], '\n') + 1
		before = append([]string{clip(b[p : s-1])}, before...)
		s = p
	}
	e := end
	for i := 0; i < n && e < len(b); i++ {
		q := bytes.IndexByte(b[e+1:], '\n')
		if q < 0 {
			q = len(b)
		} else {
			q += e + 1
		}
		if e+1 >= len(b) {
			break
		}
		after = append(after, clip(b[e+1:q]))
		e = q
	}
	return before, after
}
