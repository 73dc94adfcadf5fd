package policy_test

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/agentloom/loomfs/policy"
)

// pathTestCase is one model-supplied path and what SPEC §3.1 says of it.
// Every case runs against every operation that takes a path (see
// TestPathCases), the way os.Root's rootTestCases do.
type pathTestCase struct {
	name string
	raw  string
	// want is the cleaned path; "" means the path is refused (invalid_path,
	// or name_too_long for one over the bounds) in every scope.
	want string
	// mainOnly: refused in a main scope, accepted as want in a child scope.
	mainOnly bool
}

var (
	name255  = strings.Repeat("n", policy.MaxNameBytes)
	name256  = strings.Repeat("n", policy.MaxNameBytes+1)
	path4096 = longPath(policy.MaxPathBytes)
	path4097 = longPath(policy.MaxPathBytes + 1)
)

// longPath returns a path of exactly n bytes made of legal components.
func longPath(n int) string {
	var b strings.Builder
	for b.Len() < n {
		if b.Len() > 0 {
			b.WriteByte('/')
		}
		c := min(200, n-b.Len())
		b.WriteString(strings.Repeat("p", c))
	}
	s := b.String()
	if len(s) != n || strings.HasSuffix(s, "/") {
		panic("longPath: bad construction")
	}
	return s
}

var pathTestCases = []pathTestCase{
	// Absolute paths.
	{name: "absolute path", raw: "/etc/passwd"},
	{name: "absolute path: the root", raw: "/"},
	{name: "absolute path: double slash", raw: "//etc"},
	{name: "absolute path: slash dot", raw: "/."},

	// ".." components, in every spelling.
	{name: "dot-dot component alone", raw: ".."},
	{name: "dot-dot component with trailing slash", raw: "../"},
	{name: "dot-dot component in the middle", raw: "a/../b"},
	{name: "dot-dot component at the end", raw: "a/.."},
	{name: "dot-dot component at the end with trailing slash", raw: "a/../"},
	{name: "dot-dot component at the start", raw: "../x"},
	{name: "dot-dot component after dot", raw: "./.."},
	{name: "dot-dot component after dot in the middle", raw: "a/./../.."},
	{name: "dot-dot component climbing as deep as it went down", raw: "a/b/c/../../../.."},
	{name: "dot-dot component repeated", raw: "../../../../../../etc/passwd"},

	// NUL and backslash.
	{name: "NUL byte", raw: "a\x00b"},
	{name: "NUL byte alone", raw: "\x00"},
	{name: "NUL byte truncating a dot-dot", raw: "..\x00/x"},
	{name: "NUL byte after a legal name", raw: "notes.txt\x00.png"},
	{name: "backslash", raw: `a\b`},
	{name: "backslash dot-dot", raw: `..\..\etc`},
	{name: "backslash at the end", raw: `a\`},

	// Control characters.
	{name: "control character: newline", raw: "a\nb"},
	{name: "control character: newline at the end", raw: "notes\n"},
	{name: "control character: tab", raw: "a\tb"},
	{name: "control character: carriage return", raw: "a\rb"},
	{name: "control character: escape sequence", raw: "\x1b[31mred"},
	{name: "control character: DEL", raw: "a\x7fb"},
	{name: "control character: C1 U+0085 next line", raw: "a\u0085b"},
	{name: "control character: C1 U+009B CSI", raw: "\u009b31m"},
	{name: "control character: C1 U+0080", raw: "x/\u0080"},
	{name: "control character: C1 U+009F", raw: "\u009f"},

	// Invalid UTF-8.
	{name: "invalid UTF-8: stray byte", raw: "a\xffb"},
	{name: "invalid UTF-8: truncated sequence", raw: "\xe2\x82"},
	{name: "invalid UTF-8: overlong encoding of slash", raw: "a\xc0\xafb"},
	{name: "invalid UTF-8: overlong encoding of dot", raw: "\xc0\xae\xc0\xae"},
	{name: "invalid UTF-8: UTF-16 surrogate half", raw: "\xed\xa0\x80"},
	{name: "invalid UTF-8: deeper component", raw: "ok/\x80"},

	// Empty and over-long.
	{name: "empty path", raw: ""},
	{name: "empty component", raw: "a//b"},
	{name: "empty component: two trailing slashes", raw: "a//"},
	{name: "empty component: dot then two slashes", raw: ".//a"},
	{name: "over-long component (256 bytes)", raw: name256},
	{name: "over-long component (256 bytes) deeper", raw: "a/" + name256},
	{name: "over-long path (4097 bytes)", raw: path4097},
	{name: "over-long path (4097 bytes) with trailing slash", raw: path4096 + "/"},

	// Reserved names.
	{name: "ready sentinel at the top", raw: ".workspace_ready"},
	{name: "ready sentinel at the top after dot", raw: "./.workspace_ready/"},
	{name: "subagents at the top of a main scope", raw: "subagents", want: "subagents", mainOnly: true},
	{name: "subagents at the top of a main scope with trailing slash", raw: "subagents/", want: "subagents", mainOnly: true},
	{name: "subagents at the top of a main scope under it", raw: "subagents/sub-1/out.txt", want: "subagents/sub-1/out.txt", mainOnly: true},
	{name: "subagents at the top of a main scope after dot", raw: "./subagents/x", want: "subagents/x", mainOnly: true},
	{name: "agentloom prefix at the top", raw: ".agentloom-volume"},
	{name: "agentloom prefix: temporary file", raw: ".agentloom-tmp-0123456789abcdef"},
	{name: "agentloom prefix: prefix alone", raw: ".agentloom-"},
	{name: "agentloom prefix deeper", raw: "a/b/.agentloom-locks"},
	{name: "agentloom prefix as a directory", raw: ".agentloom-x/y"},
	{name: "agentloom prefix in upper case", raw: ".AGENTLOOM-LOCKS"},
	{name: "agentloom prefix in mixed case deeper", raw: "src/.AgentLoom-audit/log"},
	{name: "tilde alone", raw: "~"},
	{name: "tilde home", raw: "~/x"},
	{name: "tilde user", raw: "~root/.ssh"},
	{name: "tilde after dot", raw: "./~"},
	{name: "tilde after dot with path", raw: "./~/.ssh/id_rsa"},

	// Accepted forms.
	{name: "dot is the workspace root", raw: ".", want: "."},
	{name: "dot with trailing slash is the workspace root", raw: "./", want: "."},
	{name: "dots only are the workspace root", raw: "././.", want: "."},
	{name: "dot prefix is dropped", raw: "./a", want: "a"},
	{name: "one trailing slash is dropped", raw: "a/", want: "a"},
	{name: "dot components are dropped", raw: "a/./b/.", want: "a/b"},
	{name: "nested path", raw: "src/pkg/main.go", want: "src/pkg/main.go"},
	{name: "unicode names", raw: "日本語/ファイル.txt", want: "日本語/ファイル.txt"},
	{name: "unicode names: emoji", raw: "🙂/😀.md", want: "🙂/😀.md"},
	{name: "unicode names: combining accent", raw: "cafe\u0301", want: "cafe\u0301"},
	{name: "unicode names: no-break space is not a control character", raw: "a\u00a0b", want: "a\u00a0b"},
	{name: "names with spaces", raw: "my notes/draft 1.txt", want: "my notes/draft 1.txt"},
	{name: "names with spaces only", raw: " / ", want: " / "},
	{name: "three dots is a name", raw: "...", want: "..."},
	{name: "dot-dot inside a name", raw: "a..b/..c/d..", want: "a..b/..c/d.."},
	{name: "hidden file", raw: ".env", want: ".env"},
	{name: "agentloom without the dash", raw: ".agentloom", want: ".agentloom"},
	{name: "agentloom prefix not at the start of a name", raw: "x.agentloom-y", want: "x.agentloom-y"},
	{name: "tilde below the top", raw: "a/~", want: "a/~"},
	{name: "tilde inside a name", raw: "backup~", want: "backup~"},
	{name: "dash first", raw: "-rf", want: "-rf"},
	{name: "subagents below the top of a main scope", raw: "x/subagents", want: "x/subagents"},
	{name: "subagents as part of a longer name", raw: "subagents2", want: "subagents2"},
	{name: "ready sentinel below the top", raw: "a/.workspace_ready", want: "a/.workspace_ready"},
	{name: "component of 255 bytes", raw: name255, want: name255},
	{name: "path of 4096 bytes", raw: path4096, want: path4096},
}

// TestPathCases runs every case against every operation that takes a
// model-supplied path: CleanPath in both kinds of scope, Policy.Path for
// every Op, and CheckName for single names (the FUSE door's question).
func TestPathCases(t *testing.T) {
	ops := allOps()
	for _, tc := range pathTestCases {
		t.Run(tc.name, func(t *testing.T) {
			for _, main := range []bool{true, false} {
				want := tc.want
				if tc.mainOnly && main {
					want = ""
				}
				scope := scopeName(main)

				got, err := policy.CleanPath(tc.raw, main)
				checkClean(t, "CleanPath/"+scope, tc.raw, got, err, want)
				if want != "" {
					again, err := policy.CleanPath(got, main)
					if err != nil || again != got {
						t.Errorf("CleanPath/%s: not idempotent: CleanPath(%q) = %q, %v", scope, got, again, err)
					}
				}

				pol := policy.Default().WithScope(main)
				for _, op := range ops {
					got, err := pol.Path(op, tc.raw)
					if want == "" {
						checkClean(t, "Path/"+scope+"/"+op.String(), tc.raw, got, err, "")
						continue
					}
					if got != want {
						t.Errorf("Path/%s/%s(%q) = %q, want %q", scope, op, tc.raw, got, want)
					}
					if want == "." && (op == policy.OpCreate || op == policy.OpRename) {
						if policy.CodeOf(err) != policy.Exists {
							t.Errorf("Path/%s/%s(%q): err %v, want code exists", scope, op, tc.raw, err)
						}
						continue
					}
					if err != nil {
						t.Errorf("Path/%s/%s(%q): unexpected error %v", scope, op, tc.raw, err)
					}
				}

				// A single name the tools refuse can't be created by the
				// filesystem either (SPEC §3.1), and vice versa.
				if tc.raw != "." && !strings.Contains(tc.raw, "/") {
					err := policy.CheckName(".", tc.raw, main)
					if want == "" && !pathRefusal(err) {
						t.Errorf("CheckName/%s(%q) = %v, want invalid_path", scope, tc.raw, err)
					}
					if want != "" && err != nil {
						t.Errorf("CheckName/%s(%q): unexpected error %v", scope, tc.raw, err)
					}
				}
			}
		})
	}
}

// checkClean checks one answer of a path operation: want "" means refused
// with invalid_path and a message that is safe to show.
func checkClean(t *testing.T, what, raw, got string, err error, want string) {
	t.Helper()
	if want != "" {
		if err != nil || got != want {
			t.Errorf("%s(%q) = %q, %v; want %q", what, raw, got, err, want)
		}
		return
	}
	if err == nil {
		t.Errorf("%s(%q) = %q, accepted; want invalid_path", what, raw, got)
		return
	}
	var pe *policy.Error
	if !errors.As(err, &pe) || !pathRefusal(err) {
		t.Errorf("%s(%q): err %#v, want *policy.Error with code invalid_path", what, raw, err)
		return
	}
	if long := len(raw) > policy.MaxPathBytes || hasLongName(raw); long != (pe.Code == policy.NameTooLong) {
		t.Errorf("%s(%q): code %s; name_too_long is for names and paths over the bounds only", what, raw, pe.Code)
	}
	if got != "" {
		t.Errorf("%s(%q) returned %q together with an error", what, raw, got)
	}
	checkMessage(t, what, pe.Message)
}

// pathRefusal reports whether err refuses a path as SPEC §3.1 says:
// invalid_path, or name_too_long for a name or path over the bounds.
func pathRefusal(err error) bool {
	c := policy.CodeOf(err)
	return c == policy.InvalidPath || c == policy.NameTooLong
}

// hasLongName reports whether a component of raw is over MaxNameBytes.
func hasLongName(raw string) bool {
	for _, c := range strings.Split(raw, "/") {
		if len(c) > policy.MaxNameBytes {
			return true
		}
	}
	return false
}

// checkMessage checks that a refusal can be shown to a model and written
// to a log: it says what was wrong and never echoes control bytes.
func checkMessage(t *testing.T, what, msg string) {
	t.Helper()
	if !strings.HasPrefix(msg, "invalid path") {
		t.Errorf("%s: message %q does not start with \"invalid path\"", what, msg)
	}
	if !utf8.ValidString(msg) {
		t.Errorf("%s: message %q is not valid UTF-8", what, msg)
	}
	for _, r := range msg {
		if isControl(r) {
			t.Errorf("%s: message %q echoes control character U+%04X", what, msg, r)
			break
		}
	}
	if len(msg) > 1024 {
		t.Errorf("%s: message is %d bytes; a refusal must not echo a huge path", what, len(msg))
	}
}

func isControl(r rune) bool {
	return r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0)
}

func scopeName(main bool) string {
	if main {
		return "main"
	}
	return "child"
}

func allOps() []policy.Op {
	return []policy.Op{policy.OpStat, policy.OpList, policy.OpRead, policy.OpWrite, policy.OpCreate, policy.OpDelete, policy.OpRename, policy.OpSetattr}
}

// TestRefusalShowsThePath: a refused path is shown in the message as the
// model sent it, backslashes and quotes included, so it can see what to
// fix; a control character in it is shown as "?", never echoed.
func TestRefusalShowsThePath(t *testing.T) {
	for _, tc := range []struct {
		name, raw, shown string
	}{
		{"backslash", `a\b`, `"a\b"`},
		{"backslash dot-dot", `..\..\etc`, `"..\..\etc"`},
		{"backslash at the end", `a\`, `"a\"`},
		{"backslash before a dot-dot", `x\y/../z`, `"x\y/../z"`},
		{"double quote", `say "hi"/..`, `"say "hi"/.."`},
		{"absolute path", `/etc/passwd`, `"/etc/passwd"`},
		{"control character behind a dot-dot", "../a\nb", `"../a?b"`},
		{"C1 control character behind a dot-dot", "../a\u0085b", `"../a?b"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := policy.CleanPath(tc.raw, true)
			if !pathRefusal(err) {
				t.Fatalf("CleanPath(%q) = %v, want invalid_path", tc.raw, err)
			}
			msg := policy.AsError(err).Message
			if !strings.HasPrefix(msg, "invalid path "+tc.shown+": ") {
				t.Errorf("CleanPath(%q): message %q, want it to show the path as %s", tc.raw, msg, tc.shown)
			}
			checkMessage(t, tc.name, msg)
		})
	}
}

// TestCheckName covers the FUSE door's question for a name created in a
// directory, beyond the single names of pathTestCases.
func TestCheckName(t *testing.T) {
	tests := []struct {
		name   string
		dir    string
		entry  string
		main   bool
		refuse bool
		long   bool // refused as name_too_long (ENAMETOOLONG)
	}{
		{name: "plain name at the top", dir: ".", entry: "a.txt", main: true},
		{name: "subagents at the top of a main scope", dir: ".", entry: "subagents", main: true, refuse: true},
		{name: "subagents at the top of a child scope", dir: ".", entry: "subagents", main: false},
		{name: "subagents below the top of a main scope", dir: "x", entry: "subagents", main: true},
		{name: "agentloom prefix deeper", dir: "a/b", entry: ".agentloom-tmp-1", main: false, refuse: true},
		{name: "agentloom prefix in upper case", dir: "a", entry: ".AGENTLOOM-X", main: false, refuse: true},
		{name: "name with a slash", dir: ".", entry: "a/b", main: false, refuse: true},
		{name: "empty name", dir: "a", entry: "", main: false, refuse: true},
		{name: "dot-dot", dir: "a", entry: "..", main: false, refuse: true},
		{name: "control character: newline", dir: "a", entry: "x\n", main: false, refuse: true},
		{name: "control character: C1 U+0085", dir: "a", entry: "x\u0085", main: false, refuse: true},
		{name: "tilde at the top", dir: ".", entry: "~", main: false, refuse: true},
		{name: "tilde below the top", dir: "a", entry: "~", main: false},
		{name: "over-long component (256 bytes)", dir: "a", entry: name256, main: false, refuse: true, long: true},
		{name: "component of 255 bytes", dir: "a", entry: name255, main: false},
		{name: "over-long path (4097 bytes) once joined", dir: path4096[:policy.MaxPathBytes-2], entry: "xy", main: false, refuse: true, long: true},
		{name: "path of 4096 bytes once joined", dir: path4096[:policy.MaxPathBytes-3], entry: "xy", main: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := policy.CheckName(tc.dir, tc.entry, tc.main)
			if tc.refuse {
				want := policy.InvalidPath
				if tc.long {
					want = policy.NameTooLong
				}
				if policy.CodeOf(err) != want {
					t.Fatalf("CheckName(%q, %q) = %v, want %s", tc.dir, tc.entry, err, want)
				}
				checkMessage(t, "CheckName", err.Error())
				return
			}
			if err != nil {
				t.Fatalf("CheckName(%q, %q): unexpected error %v", tc.dir, tc.entry, err)
			}
			// What the filesystem may create, the tools can address.
			p := policy.Join(tc.dir, tc.entry)
			if got, err := policy.CleanPath(p, tc.main); err != nil || got != p {
				t.Errorf("CheckName accepted %q but CleanPath(%q) = %q, %v", tc.entry, p, got, err)
			}
		})
	}
}

func TestVisible(t *testing.T) {
	for name, want := range map[string]bool{
		"a":                 true,
		".env":              true,
		".agentloom":        true,
		".agentloom-volume": false,
		".agentloom-":       false,
		".AgentLoom-tmp-1":  false,
		"subagents":         true,
	} {
		if got := policy.Visible(name); got != want {
			t.Errorf("Visible(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestSplitJoin(t *testing.T) {
	tests := []struct{ rel, dir, name string }{
		{"a", ".", "a"},
		{"a/b", "a", "b"},
		{"a/b/c", "a/b", "c"},
		{".", ".", "."},
	}
	for _, tc := range tests {
		dir, name := policy.Split(tc.rel)
		if dir != tc.dir || name != tc.name {
			t.Errorf("Split(%q) = %q, %q; want %q, %q", tc.rel, dir, name, tc.dir, tc.name)
		}
		if tc.rel != "." {
			if got := policy.Join(dir, name); got != tc.rel {
				t.Errorf("Join(Split(%q)) = %q", tc.rel, got)
			}
		}
	}
	if got := policy.Join("", "a"); got != "a" {
		t.Errorf(`Join("", "a") = %q, want "a"`, got)
	}
}

// TestTargetTrailingSlash: a trailing slash names a directory, so a file
// there is refused with not_dir, never read or replaced without the slash.
func TestTargetTrailingSlash(t *testing.T) {
	cases := []struct {
		name, raw string
		op        policy.Op
		kind      policy.Kind
		found     bool
		want      policy.Code // "" accepted
	}{
		{"file without slash", "tf.txt", policy.OpRead, policy.KindRegular, true, ""},
		{"file with trailing slash", "tf.txt/", policy.OpRead, policy.KindRegular, true, policy.NotDir},
		{"file with trailing slash dot", "tf.txt/.", policy.OpWrite, policy.KindRegular, true, policy.NotDir},
		{"file below with trailing slash", "a/tf.txt/", policy.OpStat, policy.KindRegular, true, policy.NotDir},
		{"symlink with trailing slash", "ln/", policy.OpDelete, policy.KindSymlink, true, policy.NotDir},
		{"directory with trailing slash", "d/", policy.OpList, policy.KindDir, true, ""},
		{"new file with trailing slash", "new.txt/", policy.OpWrite, 0, false, policy.NotDir},
		{"new directory with trailing slash", "new/", policy.OpCreate, 0, false, ""},
		{"missing file with trailing slash", "gone/", policy.OpRead, 0, false, ""},
		{"root with trailing slash", "./", policy.OpList, policy.KindDir, true, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tg, err := policy.Default().Target(c.op, c.raw)
			if err != nil {
				t.Fatalf("Target(%q): %v", c.raw, err)
			}
			if want := strings.TrimSuffix(strings.TrimSuffix(c.raw, "."), "/"); tg.Rel != want && tg.Rel != "." {
				t.Fatalf("Target(%q).Rel = %q, want %q", c.raw, tg.Rel, want)
			}
			err = tg.CheckKind(c.op, c.kind, c.found)
			if got := policy.CodeOf(err); got != c.want {
				t.Fatalf("CheckKind(%q) = %v, want %q", c.raw, err, c.want)
			}
			if err != nil && !strings.Contains(err.Error(), "trailing slash") {
				t.Fatalf("message does not say what to do: %v", err)
			}
		})
	}
}
