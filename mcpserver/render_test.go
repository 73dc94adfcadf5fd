package mcpserver

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/tools"
)

func TestRender(t *testing.T) {
	sha := strings.Repeat("ab", 32)
	cases := []struct {
		name    string
		tool    string
		result  string
		want    []string
		notWant []string
	}{
		{"read numbers lines from the offset", tools.Read,
			`{"path":"a.txt","content":"two\nthree\n","sha256":"` + sha + `","total_lines":5,"offset":2,"lines":2,"truncated":true}`,
			[]string{"a.txt: lines 2-3 of 5, sha256 " + sha + "\n", "     2\ttwo\n     3\tthree\n", "2 more lines; continue with offset 4"}, nil},
		{"read of a last line without newline", tools.Read,
			`{"path":"a","content":"x","sha256":"` + sha + `","total_lines":1,"offset":1,"lines":1}`,
			[]string{"     1\tx\n(no newline at end of file)"}, []string{"continue with"}},
		{"read of an empty file", tools.Read, `{"path":"e","content":"","sha256":"` + sha + `","total_lines":0,"offset":1}`,
			[]string{"e: empty file, sha256 " + sha}, []string{"\t"}},
		{"read of a binary file says so", tools.Read, `{"path":"b","content":"a\u0000b\n","sha256":"x","total_lines":1,"offset":1,"lines":1,"binary":true}`,
			[]string{"binary file"}, nil},
		{"grep without context", tools.Grep,
			`{"matches":[{"path":"a.go","line":3,"text":"x := 1"},{"path":"b/c.go","line":10,"text":"x++"}],"files_searched":4,"files_matched":2,"skipped_binary":1}`,
			[]string{"a.go:3: x := 1\nb/c.go:10: x++\n", "2 matching lines in 2 files (4 files searched, 1 skipped as binary)"}, []string{"--"}},
		{"grep with context", tools.Grep,
			`{"matches":[{"path":"a","line":5,"text":"m","before":["b3","b4"],"after":["a6"]},{"path":"a","line":9,"text":"n"}],"files_searched":1,"files_matched":1,"truncated":true}`,
			[]string{"a-3- b3\na-4- b4\na:5: m\na-6- a6\n--\na:9: n\n", "truncated"}, nil},
		{"grep with no match", tools.Grep, `{"matches":[],"files_searched":3}`, []string{"no matches (3 files searched)"}, nil},
		{"list", tools.List,
			`{"path":".","entries":[{"name":"d","type":"dir","size":0,"mtime":"t"},{"name":"f","type":"file","size":2048,"mtime":"t"},{"name":"l","type":"symlink","size":3,"mtime":"t","refused":"symlink_refused"}],"total":4,"truncated":true}`,
			[]string{".: 4 entries\n", "d/\n", "f  2 KiB\n", "l  (symlink, refused: symlink_refused)\n", "3 shown of 4"}, nil},
		{"glob", tools.Glob, `{"matches":["a/x.go","b.go"],"total":2}`, []string{"a/x.go\nb.go\n"}, []string{"truncated"}},
		{"grep cut by the match cap", tools.Grep, `{"matches":[{"path":"a","line":1,"text":"m"}],"files_searched":1,"files_matched":1,"truncated":true,"matches_omitted":99,"skipped_deep":2}`,
			[]string{"2 skipped as too deep to name", "(truncated: 99 more matching lines not shown"}, nil},
		{"glob past a deep tree", tools.Glob, `{"matches":["a"],"total":1,"skipped_deep":1}`, []string{"a\n", "(1 entry skipped: paths too deep to name)"}, []string{"truncated"}},
		{"glob without matches", tools.Glob, `{"matches":[],"total":0}`, []string{"no paths match"}, nil},
		{"stat", tools.Stat, `{"path":"a","type":"file","size":14,"mode":"0600","mtime":"2025-01-01T00:00:00Z","sha256":"` + sha + `"}`,
			[]string{"a: file, 14 B, mode 0600, modified 2025-01-01T00:00:00Z, sha256 " + sha}, nil},
		{"write", tools.Write, `{"path":"a","bytes":14,"sha256":"` + sha + `","created":true}`, []string{"created a: 14 bytes, sha256 " + sha}, nil},
		{"edit", tools.Edit, `{"path":"a","replacements":1,"sha256":"` + sha + `","bytes":3}`, []string{"edited a: 1 replacement, sha256 " + sha}, nil},
		{"mkdir of an existing dir", tools.Mkdir, `{"path":"d","created":false}`, []string{"directory d already exists"}, nil},
		{"delete", tools.Delete, `{"path":"d","deleted":true}`, []string{"deleted d"}, nil},
		{"command", tools.Command, `{"exit_code":2,"stdout":"out","stderr":"err\n","stderr_truncated":true,"duration_ms":12}`,
			[]string{"exit code 2 (12 ms)\n", "--- stdout ---\nout\n", "--- stderr ---\nerr\n(stderr truncated)"}, nil},
		{"command with refusals", tools.Command,
			`{"exit_code":1,"duration_ms":5,"policy_events":{"events":[{"op":"write","path":"big","errno":"EDQUOT","code":"quota_exceeded","message":"quota exceeded: workspace total 1 KiB (used 1 KiB, write of 4 KiB refused)"}],"total":51,"dropped":50}}`,
			[]string{"--- refused by the workspace policy: 51 operations ---\n", "write big: EDQUOT (quota_exceeded): quota exceeded: workspace total 1 KiB (used 1 KiB, write of 4 KiB refused)\n", "(50 more not listed)"}, nil},
		{"command that timed out", tools.Command, `{"exit_code":-1,"timed_out":true,"duration_ms":1000}`, []string{"timed out after 1000 ms"}, []string{"stdout", "refused"}},
		{"unknown shape falls back to JSON", tools.Read, `[1,2]`, []string{"[1,2]"}, nil},
		{"unknown tool falls back to JSON", "other", `{"a":1}`, []string{`{"a":1}`}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := render(c.tool, json.RawMessage(c.result))
			for _, w := range c.want {
				if !strings.Contains(got, w) {
					t.Errorf("render lacks %q:\n%s", w, got)
				}
			}
			for _, w := range c.notWant {
				if strings.Contains(got, w) {
					t.Errorf("render has %q:\n%s", w, got)
				}
			}
		})
	}
}

func TestErrorResult(t *testing.T) {
	cases := []struct {
		name string
		err  error
		text string
	}{
		{"code and message", policy.Errorf(policy.NotFound, "a: no such file or directory"), "not_found: a: no such file or directory"},
		{"conflict names the sha256 once", &policy.Error{Code: policy.Conflict, Message: "a changed (current sha256 abc)", SHA256: "abc"}, "conflict: a changed (current sha256 abc)"},
		{"conflict with the sha256 only in the field", &policy.Error{Code: policy.Conflict, Message: "a changed", SHA256: "abc"}, "conflict: a changed (current sha256 abc)"},
		{"any other error is internal", errPlain("boom"), "internal: internal error: boom"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res := errorResult(c.err)
			if !res.IsError || text(res) != c.text {
				t.Fatalf("got %v %q, want %q", res.IsError, text(res), c.text)
			}
			b, _ := json.Marshal(res.StructuredContent)
			var m struct {
				Error policy.Error `json:"error"`
			}
			if err := json.Unmarshal(b, &m); err != nil || m.Error.Code != policy.CodeOf(c.err) || m.Error.Message == "" {
				t.Fatalf("structured content %s", b)
			}
		})
	}
}

type errPlain string

func (e errPlain) Error() string { return string(e) }
