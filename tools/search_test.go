package tools

import (
	"fmt"
	"math/rand"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
)

// matchPartsRef is the backtracking matcher globs used to run on: the
// reference for what a match is, exponential in the number of "**".
func matchPartsRef(pat, name []string) bool {
	for len(pat) > 0 {
		if pat[0] == "**" {
			for i := 0; i <= len(name); i++ {
				if matchPartsRef(pat[1:], name[i:]) {
					return true
				}
			}
			return false
		}
		if len(name) == 0 {
			return false
		}
		if ok, _ := path.Match(pat[0], name[0]); !ok {
			return false
		}
		pat, name = pat[1:], name[1:]
	}
	return len(name) == 0
}

func TestGlobMatch(t *testing.T) {
	cases := []struct {
		pattern, name string
		want          bool
	}{
		{"*.go", "a.go", true},
		{"*.go", "d/a.go", false},
		{"**/*.go", "a.go", true},
		{"**/*.go", "d/e/a.go", true},
		{"d/**", "d", true},
		{"d/**", "d/e/f", true},
		{"d/**/f", "d/f", true},
		{"d/**/f", "d/x/y/f", true},
		{"d/**/f", "d/x/y/g", false},
		{"**/**/f", "f", true},
		{"**", "", true},
		{"a/*/c", "a/b/c", true},
		{"a/*/c", "a/c", false},
	}
	for _, c := range cases {
		if got := globMatch(c.pattern, c.name); got != c.want {
			t.Errorf("globMatch(%q, %q) = %v, want %v", c.pattern, c.name, got, c.want)
		}
	}
	// The same answers as the backtracking matcher, on random small cases.
	rng := rand.New(rand.NewSource(1))
	comps := []string{"**", "*", "a", "b", "?", "[ab]", "a*"}
	names := []string{"a", "b", "ab", "c"}
	for range 20000 {
		pat := make([]string, 1+rng.Intn(5))
		for i := range pat {
			pat[i] = comps[rng.Intn(len(comps))]
		}
		name := make([]string, 1+rng.Intn(6))
		for i := range name {
			name[i] = names[rng.Intn(len(names))]
		}
		p, n := strings.Join(pat, "/"), strings.Join(name, "/")
		if got, want := globMatch(p, n), matchPartsRef(pat, name); got != want {
			t.Fatalf("globMatch(%q, %q) = %v, the reference says %v", p, n, got, want)
		}
	}
}

// TestGlobManyDoubleStarsOnADeepTree: "**/" repeated on a 40-level tree
// answers within the call's budget, in workspace_glob and in grep's glob
// (a backtracking matcher took 20 s for 8 of them and never ended for 12).
func TestGlobManyDoubleStarsOnADeepTree(t *testing.T) {
	tb, dir := newBox(t, nil)
	deep := filepath.Join(dir, strings.Repeat("d/", 40))
	if err := os.MkdirAll(deep, 0o700); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(deep, "leaf.txt"), []byte("needle\n"), 0o600)
	budget := tb.WS.Policy().Limits.GrepBudget
	for _, n := range []int{8, 10, 12} {
		for _, shape := range []struct{ seg, tail string }{
			{"**/", "nothing"}, {"**/", "leaf.txt"}, {"**/d/", "nothing"}, {"**/d/", "leaf.txt"},
		} {
			tail := shape.tail
			pattern := strings.Repeat(shape.seg, n) + tail
			want := 0
			if tail == "leaf.txt" {
				want = 1
			}
			start := time.Now()
			g := mustCall(t, tb, Glob, map[string]any{"pattern": pattern})
			took := time.Since(start)
			if len(g["matches"].([]any)) != want {
				t.Fatalf("glob %q: %v", pattern, g)
			}
			start = time.Now()
			r := mustCall(t, tb, Grep, map[string]any{"pattern": "needle", "glob": pattern})
			tookGrep := time.Since(start)
			if len(r["matches"].([]any)) != want {
				t.Fatalf("grep with glob %q: %v", pattern, r)
			}
			t.Logf("%d %q then %s on 40 levels: glob %v, grep %v", n, shape.seg, tail, took, tookGrep)
			if took > budget || tookGrep > budget {
				t.Fatalf("%q took %v (glob) and %v (grep), over the budget of %v", pattern, took, tookGrep, budget)
			}
		}
	}
	// As many as fit in a path's length.
	start := time.Now()
	g := mustCall(t, tb, Glob, map[string]any{"pattern": strings.Repeat("**/", 1300) + "leaf.txt"})
	if len(g["matches"].([]any)) != 1 || time.Since(start) > budget {
		t.Fatalf("1300 \"**/\": %v after %v", g, time.Since(start))
	}
	_, err := call(t, tb, Glob, map[string]any{"pattern": strings.Repeat("**/", 1400) + "leaf.txt"})
	wantCode(t, err, policy.InvalidInput)
}

// TestSearchBudget: glob and grep stop at the call's budget, and say that
// budget stopped them.
func TestSearchBudget(t *testing.T) {
	pol := policy.Default()
	pol.Limits.GrepBudget = time.Nanosecond
	tb, _ := newBox(t, pol)
	mustCall(t, tb, Write, map[string]any{"path": "a.txt", "content": "needle\n"})
	for _, c := range []struct {
		tool string
		in   map[string]any
	}{
		{Glob, map[string]any{"pattern": "**/*"}},
		{Grep, map[string]any{"pattern": "needle"}},
		{Grep, map[string]any{"pattern": `(\w+) \1`}},
	} {
		_, err := call(t, tb, c.tool, c.in)
		pe := wantCode(t, err, policy.Timeout)
		if !strings.Contains(pe.Message, "call's time budget of 1ns") || strings.Contains(pe.Message, "per-match") {
			t.Fatalf("%s %v: %s", c.tool, c.in, pe.Message)
		}
	}
}

// TestGrepTruncationFlagged: a result cut by the match cap says so, and
// how many matching lines it left out.
func TestGrepTruncationFlagged(t *testing.T) {
	tb, _ := newBox(t, nil)
	mustCall(t, tb, Write, map[string]any{"path": "many.txt", "content": strings.Repeat("match\n", 600)})
	mustCall(t, tb, Write, map[string]any{"path": "more.txt", "content": strings.Repeat("match\n", 8)})
	cases := []struct {
		name     string
		in       map[string]any
		returned int
		omitted  int
	}{
		{"default cap of 500", map[string]any{"pattern": "match"}, 500, 108},
		{"limit 10", map[string]any{"pattern": "match", "limit": 10}, 10, 598},
		{"one file under the default cap", map[string]any{"pattern": "match", "path": "many.txt"}, 500, 100},
		{"one file within the limit", map[string]any{"pattern": "match", "path": "more.txt", "limit": 8}, 8, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := mustCall(t, tb, Grep, c.in)
			if got := len(r["matches"].([]any)); got != c.returned {
				t.Fatalf("%d matches, want %d", got, c.returned)
			}
			if r["truncated"] != (c.omitted > 0) || r["matches_omitted"] != float64(c.omitted) {
				t.Fatalf("truncated %v, matches_omitted %v; want %v and %d", r["truncated"], r["matches_omitted"], c.omitted > 0, c.omitted)
			}
		})
	}
}

// TestGrepTimeoutsNameTheirLimit: a backtracking pattern stopped by the
// per-match limit says that limit, not the call's budget.
func TestGrepTimeoutsNameTheirLimit(t *testing.T) {
	tb, _ := newBox(t, nil)
	mustCall(t, tb, Write, map[string]any{"path": "long.txt", "content": strings.Repeat("a", 5000) + "c\n"})
	start := time.Now()
	_, err := call(t, tb, Grep, map[string]any{"pattern": "(a+)+(?=b)"})
	pe := wantCode(t, err, policy.Timeout)
	if !strings.Contains(pe.Message, "per-match limit of 100ms") || !strings.Contains(pe.Message, "long.txt") || strings.Contains(pe.Message, "budget") {
		t.Fatalf("message does not name the per-match limit: %s", pe.Message)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("stopped after %v", d)
	}
}

// plantDeepTree makes, on the host, a chain of directories whose paths go
// past policy.MaxPathBytes (what an agent can't make through the tools),
// with a matching file at the bottom. It returns the deepest directory
// the tools can still name.
func plantDeepTree(t *testing.T, dir string) string {
	t.Helper()
	name := strings.Repeat("n", 200)
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	var lastNamed []string
	var parts []string
	for range 30 {
		if err := unix.Mkdirat(fd, name, 0o700); err != nil {
			t.Fatal(err)
		}
		next, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		fd = next
		parts = append(parts, name)
		if len(strings.Join(parts, "/")) <= policy.MaxPathBytes {
			lastNamed = append([]string(nil), parts...)
		}
	}
	f, err := unix.Openat(fd, "deep.txt", unix.O_WRONLY|unix.O_CREAT, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	unix.Write(f, []byte("needle\n"))
	unix.Close(f)
	unix.Close(fd)
	return strings.Join(lastNamed, "/")
}

// TestDeepTreeSkippedAndCounted: a tree planted deeper than the tools can
// name is skipped and counted by whole-tree searches, never a failure.
func TestDeepTreeSkippedAndCounted(t *testing.T) {
	tb, dir := newBox(t, nil)
	mustCall(t, tb, Write, map[string]any{"path": "top.txt", "content": "needle\n"})
	named := plantDeepTree(t, dir)

	r := mustCall(t, tb, Grep, map[string]any{"pattern": "needle"})
	if ms := r["matches"].([]any); len(ms) != 1 || ms[0].(map[string]any)["path"] != "top.txt" || r["skipped_deep"] != 1.0 {
		t.Fatalf("grep: %v", r)
	}
	g := mustCall(t, tb, Glob, map[string]any{"pattern": "**/*"})
	if g["skipped_deep"] != 1.0 {
		t.Fatalf("glob: skipped_deep %v", g["skipped_deep"])
	}
	for _, m := range g["matches"].([]any) {
		if len(m.(string)) > policy.MaxPathBytes {
			t.Fatalf("glob returned a path of %d bytes", len(m.(string)))
		}
	}
	l := mustCall(t, tb, List, map[string]any{"path": named})
	if l["skipped_deep"] != 1.0 || len(l["entries"].([]any)) != 0 || l["total"] != 0.0 {
		t.Fatalf("list: %v", l)
	}
	for _, res := range []map[string]any{r, g, l} {
		if s := fmt.Sprint(res); len(s) > 64<<10 {
			t.Fatalf("result of %d bytes", len(s))
		}
	}
}
