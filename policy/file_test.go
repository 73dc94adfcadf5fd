package policy_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentloom/loomfs/policy"
)

// standardFile spells the standard preset out in full, with its limits,
// plus a subtree of its own.
const standardFile = `# the seed-001 layout
version: 1
rules:
  - path: src/
    mode: rw
  - path: data/
    mode: ro
  - path: output/
    mode: wo
    confirm: [delete, overwrite]
  - path: output/drafts
    confirm: [delete]
  - path: logs/
    mode: rw
  - path: tmp/
    mode: rw
    max_bytes: 512 MiB
    max_files: 10_000
    clear_at_run_end: true
  - path: .meta/
    mode: hidden
limits:
  text_bytes: 2MiB
  file_bytes: 1 GiB
  scope_bytes: 5 GiB
  scope_files: 100000
  grep_scan: 128 MiB
  regex_timeout: 50ms
  grep_budget: 5s
  list_entries: 200
`

func TestLoadFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(p, []byte(standardFile), 0o600); err != nil {
		t.Fatal(err)
	}
	pol, err := policy.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	modes := map[string]policy.Mode{"src/a": policy.ModeRW, "data/x": policy.ModeRO, "output/r.csv": policy.ModeWO, "output/drafts/d": policy.ModeWO, ".meta/t": policy.ModeHidden, "other": policy.ModeRW}
	for rel, want := range modes {
		if got := pol.ModeOf(rel); got != want {
			t.Errorf("ModeOf(%s) = %s, want %s", rel, got, want)
		}
	}
	l := pol.Limits
	if l.TextBytes != 2<<20 || l.FileBytes != 1<<30 || l.ScopeBytes != 5<<30 || l.ScopeFiles != 100_000 || l.GrepScan != 128<<20 ||
		l.RegexTimeout != 50*time.Millisecond || l.GrepBudget != 5*time.Second || l.ListEntries != 200 {
		t.Errorf("limits %+v", l)
	}
	if l.GlobResults != policy.DefaultLimits().GlobResults {
		t.Errorf("a limit the file does not set is not the default: %d", l.GlobResults)
	}
	caps := pol.Caps("tmp/a/b")
	if len(caps) != 1 || caps[0].MaxBytes != 512<<20 || caps[0].MaxFiles != 10_000 {
		t.Errorf("caps of tmp/a/b: %+v", caps)
	}
	if got := pol.TemporaryDirs(); !slices.Equal(got, []string{"tmp"}) {
		t.Errorf("temporary dirs %v", got)
	}
	confirm := []struct {
		op   policy.Op
		rel  string
		want bool
	}{
		{policy.OpDelete, "output/r.csv", true},
		{policy.OpWrite, "output/r.csv", true},
		{policy.OpWrite, "output", true},
		{policy.OpDelete, "output/drafts/d", true},
		{policy.OpWrite, "output/drafts/d", true}, // the enclosing rule still holds
		{policy.OpDelete, "outputs/x", false},
		{policy.OpDelete, "src/a", false},
		{policy.OpCreate, "output/new", false},
	}
	for _, c := range confirm {
		if _, got := pol.NeedsConfirm(c.op, c.rel); got != c.want {
			t.Errorf("NeedsConfirm(%s, %s) = %v, want %v", c.op, c.rel, got, c.want)
		}
	}
}

// TestStandardPresetIsTheSeedLayout checks the built-in preset against
// SPEC §3.3 word for word.
func TestStandardPresetIsTheSeedLayout(t *testing.T) {
	pol, ok := policy.Preset("standard")
	if !ok {
		t.Fatal("no standard preset")
	}
	for rel, want := range map[string]policy.Mode{"src": policy.ModeRW, "data": policy.ModeRO, "output": policy.ModeWO, "logs": policy.ModeRW, "tmp": policy.ModeRW, ".meta": policy.ModeHidden} {
		if got := pol.ModeOf(rel); got != want {
			t.Errorf("standard: %s/ is %s, want %s", rel, got, want)
		}
	}
	if caps := pol.Caps("tmp/x"); len(caps) != 1 || caps[0].MaxBytes == 0 {
		t.Errorf("standard: tmp/ is not size-capped: %+v", caps)
	}
	for _, op := range []policy.Op{policy.OpDelete, policy.OpWrite} {
		if _, ok := pol.NeedsConfirm(op, "output/result.json"); !ok {
			t.Errorf("standard: %s in output/ needs no confirmation", op)
		}
	}
	open, _ := policy.Preset("open")
	if len(open.Rules) != 0 || len(open.Subtrees) != 0 || open.Limits != policy.DefaultLimits() {
		t.Errorf("open preset is not the default layout: %+v", open)
	}
	// Each call is a fresh copy.
	a, _ := policy.Preset("standard")
	a.Rules[0].Mode = policy.ModeHidden
	if b, _ := policy.Preset("standard"); b.Rules[0].Mode == policy.ModeHidden {
		t.Error("Preset returns a shared policy")
	}
}

func TestPresetOverride(t *testing.T) {
	pol, err := policy.Parse("p.yaml", []byte(`preset: standard
rules:
  - path: tmp
    mode: rw
    max_bytes: 1 MiB
  - path: reports
    mode: ro
limits:
  scope_files: unlimited
`))
	if err != nil {
		t.Fatal(err)
	}
	caps := pol.Caps("tmp/x")
	if len(caps) != 1 || caps[0].MaxBytes != 1<<20 || caps[0].MaxFiles != 0 || caps[0].Temporary {
		t.Errorf("a file entry for tmp/ replaces the preset's whole: %+v", caps)
	}
	if pol.ModeOf("reports/a") != policy.ModeRO || pol.ModeOf("data/a") != policy.ModeRO || pol.ModeOf("output/a") != policy.ModeWO {
		t.Errorf("merged modes wrong: %+v", pol.Rules)
	}
	if pol.Limits.ScopeFiles != 0 || pol.Limits.ScopeBytes != 5<<30 {
		t.Errorf("limits %+v", pol.Limits)
	}
}

// TestFileRefused: an invalid policy file is refused with its line and a
// reason an operator can act on.
func TestFileRefused(t *testing.T) {
	tests := []struct {
		name, file string
		line       int
		reason     string
	}{
		{"unknown top-level key", "version: 1\nrulez: []\n", 2, `unknown key "rulez"`},
		{"unknown key in a rule", "rules:\n  - path: a\n    mode: rw\n    moed: ro\n", 4, `unknown key "moed"`},
		{"unknown key in limits", "limits:\n  text_byte: 2 MiB\n", 2, `unknown key "text_byte"`},
		{"unknown mode", "rules:\n  - path: a\n    mode: rx\n", 3, `mode "rx" is not one of rw, ro, wo, hidden`},
		{"size without unit sense", "limits:\n  scope_bytes: 5 gigs\n", 2, "scope_bytes"},
		{"ambiguous size unit", "limits:\n  text_bytes: 2M\n", 2, `unknown unit "M"`},
		{"zero quota", "limits:\n  scope_bytes: 0\n", 2, `write "unlimited"`},
		{"zero text limit", "limits:\n  text_bytes: 0\n", 2, "more than 0"},
		{"negative count", "limits:\n  scope_files: -3\n", 2, "whole number"},
		{"bad duration", "limits:\n  regex_timeout: soon\n", 2, "positive duration"},
		{"key given twice", "version: 1\nversion: 1\n", 2, "given twice"},
		{"path given twice", "rules:\n  - path: data/\n    mode: ro\n  - path: ./data\n    mode: rw\n", 4, "has a rule already (line 2)"},
		{"path leaving the workspace", "rules:\n  - path: ../etc\n    mode: ro\n", 2, `".." components are refused`},
		{"absolute path", "rules:\n  - path: /etc\n    mode: ro\n", 2, "absolute paths are refused"},
		{"reserved name", "rules:\n  - path: .agentloom-x\n    mode: ro\n", 2, "reserved for loomfs"},
		{"rule without path", "rules:\n  - mode: ro\n", 2, "needs a path"},
		{"rule saying nothing", "rules:\n  - path: a\n", 2, "says nothing"},
		{"unknown confirm op", "rules:\n  - path: out\n    confirm: [rename]\n", 3, `confirm "rename"`},
		{"confirm not a list", "rules:\n  - path: out\n    confirm: delete\n", 3, "must be a list"},
		{"cap on the root", "rules:\n  - path: .\n    max_bytes: 1 MiB\n", 2, "takes only a mode"},
		{"bool that is not", "rules:\n  - path: tmp\n    clear_at_run_end: sometimes\n", 3, "true or false"},
		{"rules not a list", "rules:\n  src: rw\n", 2, "must be a list"},
		{"version 2", "version: 2\n", 1, "version \"2\" is not supported"},
		{"unknown preset", "preset: strict\n", 1, `unknown preset "strict" (known: open, standard)`},
		{"YAML syntax error", "rules:\n  - path: a\n\tmode: rw\n", 2, "not valid YAML (at or below this line): found a tab"},
		{"two documents", "preset: open\n---\npreset: standard\n", 2, "second YAML document"},
		{"empty file", "", 0, "empty"},
		{"only a comment", "# nothing\n", 0, "empty"},
		{"a list, not a mapping", "- a\n- b\n", 1, "must be a mapping"},
		{"unknown symlinks setting", "symlinks: follow\n", 1, `symlinks "follow" is not one of emulate, refuse`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := policy.Parse("p.yaml", []byte(tc.file))
			var fe *policy.FileError
			if !errors.As(err, &fe) {
				t.Fatalf("want a FileError, got %v", err)
			}
			if fe.Line != tc.line || !strings.Contains(fe.Reason, tc.reason) {
				t.Fatalf("got line %d %q, want line %d containing %q", fe.Line, fe.Reason, tc.line, tc.reason)
			}
			if tc.line > 0 && !strings.HasPrefix(err.Error(), "policy p.yaml:"+strconv.Itoa(tc.line)+": ") {
				t.Errorf("message %q does not start with the file and line", err)
			}
		})
	}
	t.Run("missing file", func(t *testing.T) {
		_, err := policy.Load(filepath.Join(t.TempDir(), "nope.yaml"))
		var fe *policy.FileError
		if !errors.As(err, &fe) || !strings.Contains(fe.Reason, "can't read") {
			t.Fatalf("got %v", err)
		}
	})
}

func TestParseBytes(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"2097152", 2 << 20, true},
		{"2MiB", 2 << 20, true},
		{"5 GiB", 5 << 30, true},
		{"5 gib", 5 << 30, true},
		{"512 KiB", 512 << 10, true},
		{"1.5 GiB", 3 << 29, true},
		{"1 KB", 1000, true},
		{"5GB", 5_000_000_000, true},
		{"100 B", 100, true},
		{"1_000", 1000, true},
		{"2M", 0, false},
		{"2 G", 0, false},
		{"-1 MiB", 0, false},
		{"MiB", 0, false},
		{"1e9", 0, false},
		{"9999999 TiB", 0, false},
	}
	for _, tc := range tests {
		got, err := policy.ParseBytes(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

// TestReadmeNamesEveryRule is issue 7's check on the generated README:
// every rule and limit of the loaded policy appears in it, with its
// figures, on the line of its subtree.
func TestReadmeNamesEveryRule(t *testing.T) {
	for _, name := range []string{"standard", "file"} {
		t.Run(name, func(t *testing.T) {
			pol, _ := policy.Preset("standard")
			if name == "file" {
				var err error
				if pol, err = policy.Parse("p.yaml", []byte(standardFile)); err != nil {
					t.Fatal(err)
				}
			}
			readme := policy.WorkspaceReadme(pol)
			line := func(prefix string) string {
				for _, l := range strings.Split(readme, "\n") {
					if strings.HasPrefix(l, "- "+prefix+"/ ") {
						return l
					}
				}
				t.Fatalf("README has no line for %s/:\n%s", prefix, readme)
				return ""
			}
			for _, r := range pol.Rules {
				if l := line(r.Prefix); !strings.Contains(l, policy.ModeWords(r.Mode)) {
					t.Errorf("README line %q lacks mode %s", l, r.Mode)
				}
			}
			for _, s := range pol.Subtrees {
				l := line(s.Prefix)
				if s.MaxBytes > 0 && !strings.Contains(l, policy.Bytes(s.MaxBytes)) {
					t.Errorf("README line %q lacks the cap %s", l, policy.Bytes(s.MaxBytes))
				}
				if s.MaxFiles > 0 && !strings.Contains(l, fmtInt(s.MaxFiles)+" files") {
					t.Errorf("README line %q lacks the file cap %d", l, s.MaxFiles)
				}
				for _, op := range s.Confirm {
					verb := map[policy.Op]string{policy.OpDelete: "deleting", policy.OpWrite: "overwriting"}[op]
					if !strings.Contains(strings.ToLower(l), verb) || !strings.Contains(l, "confirmation") {
						t.Errorf("README line %q lacks confirmation of %s", l, verb)
					}
				}
				if s.Temporary && !strings.Contains(l, "emptied at the end of each run") {
					t.Errorf("README line %q does not say it is emptied at run end", l)
				}
			}
			l := pol.Limits
			for _, want := range []string{
				policy.Bytes(l.ScopeBytes), fmtInt(l.ScopeFiles) + " files", policy.Bytes(l.FileBytes), policy.Bytes(l.TextBytes),
				strconv.Itoa((l.ListEntries)) + " entries", strconv.Itoa((l.GlobResults)) + " paths", strconv.Itoa((l.GrepMatches)) + " matching lines",
				policy.Bytes(l.GrepScan), l.RegexTimeout.String(), l.GrepBudget.String(),
				"confirmation_required", "confirm_token",
			} {
				if !strings.Contains(readme, want) {
					t.Errorf("README lacks %q:\n%s", want, readme)
				}
			}
		})
	}
	t.Run("open layout says so and invents nothing", func(t *testing.T) {
		readme := policy.WorkspaceReadme(policy.Default())
		if !strings.Contains(readme, "Every path is read-write") || strings.Contains(readme, "confirm") {
			t.Errorf("open README:\n%s", readme)
		}
	})
}

// TestReadmeStatesImageAndProcessLimits: the workspace README states the
// limits a file sets for images and for the session sandbox's processes,
// as the tool descriptions do.
func TestReadmeStatesImageAndProcessLimits(t *testing.T) {
	pol, err := policy.Parse("p.yaml", []byte("limits:\n  session_idle: 3m\n  session_lifetime: 45m\n  process_output_bytes: 256 KiB\n  image_bytes: 1 MiB\n  image_source_bytes: 8 MiB\n"))
	if err != nil {
		t.Fatal(err)
	}
	readme := policy.WorkspaceReadme(pol)
	for _, want := range []string{"stops after 3m0s with no running process", "45m0s after it started", "last 256 KiB of output", "at most 1 MiB", "files up to 8 MiB"} {
		if !strings.Contains(readme, want) {
			t.Errorf("README lacks %q:\n%s", want, readme)
		}
	}
}

func fmtInt(n int64) string { return strconv.FormatInt(n, 10) }

func TestReadmeKey(t *testing.T) {
	pol, err := policy.Parse("p.yaml", []byte("preset: standard\nreadme: true\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !pol.Readme || pol.ModeOf(policy.ReadmeFile) != policy.ModeRO || pol.ModeOf("docs/README.md") != policy.ModeRW {
		t.Fatalf("readme: %v, mode %s", pol.Readme, pol.ModeOf(policy.ReadmeFile))
	}
	if err := pol.Check(policy.OpWrite, policy.ReadmeFile); policy.CodeOf(err) != policy.ReadOnly {
		t.Fatalf("writing the generated README: %v", err)
	}
	if !strings.Contains(policy.WorkspaceReadme(pol), "read-only") {
		t.Fatal("the README does not say it is read-only")
	}
	if _, err := policy.Parse("p.yaml", []byte("readme: maybe\n")); err == nil || !strings.Contains(err.Error(), "p.yaml:1") {
		t.Fatalf("bad readme value: %v", err)
	}
}

func TestSymlinksKey(t *testing.T) {
	for _, c := range []struct {
		file     string
		emulates bool
	}{
		{"preset: open\n", true},
		{"symlinks: emulate\n", true},
		{"preset: standard\nsymlinks: refuse\n", false},
	} {
		pol, err := policy.Parse("p.yaml", []byte(c.file))
		if err != nil {
			t.Fatal(err)
		}
		if pol.EmulatesLinks() != c.emulates {
			t.Errorf("%q: emulates links %v", c.file, pol.EmulatesLinks())
		}
		err = pol.CheckSymlink("l", "/etc/passwd")
		if c.emulates && err != nil || !c.emulates && policy.CodeOf(err) != policy.SymlinkRefused {
			t.Errorf("%q: CheckSymlink: %v", c.file, err)
		}
	}
}

func TestCacheKey(t *testing.T) {
	for _, c := range []struct {
		file   string
		strict bool
		dirs   bool
		err    string
	}{
		{"preset: open\n", false, true, ""},
		{"cache: journal\n", false, false, ""},
		{"cache: strict\n", true, false, ""},
		{"cache: journal-dirs\n", false, true, ""},
		{"cache: forever\n", false, false, `p.yaml:1: cache "forever" is not one of journal-dirs, journal, strict`},
	} {
		pol, err := policy.Parse("p.yaml", []byte(c.file))
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: %v, want %s", c.file, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if pol.StrictCache() != c.strict || pol.KernelOpensDirs() != c.dirs {
			t.Errorf("%q: strict %v, kernel opens directories %v", c.file, pol.StrictCache(), pol.KernelOpensDirs())
		}
	}
}

func TestIOLimitKeys(t *testing.T) {
	pol, err := policy.Parse("p.yaml", []byte("limits:\n  io_bytes_per_s: 4 MiB\n  io_ops_per_s: 200\n"))
	if err != nil {
		t.Fatal(err)
	}
	if pol.Limits.IOBytesPerSec != 4<<20 || pol.Limits.IOOpsPerSec != 200 {
		t.Fatalf("limits %+v", pol.Limits)
	}
	if r := policy.WorkspaceReadme(pol); !strings.Contains(r, "4 MiB/s read and written and 200 operations/s") {
		t.Errorf("the README does not state the I/O limits:\n%s", r)
	}
	if _, err := policy.Parse("p.yaml", []byte("limits:\n  io_bytes_per_s: 0\n")); err == nil || !strings.Contains(err.Error(), "io_bytes_per_s") {
		t.Errorf("io_bytes_per_s 0: %v", err)
	}
	if pol, err := policy.Parse("p.yaml", []byte("preset: open\n")); err != nil || policy.IOSummary(pol.Limits) != "" {
		t.Errorf("no I/O limits by default: %v %q", err, policy.IOSummary(pol.Limits))
	}
}

func TestCommandsKey(t *testing.T) {
	for _, c := range []struct {
		file    string
		session bool
		err     string
	}{
		{"preset: open\n", false, ""},
		{"commands: fresh\n", false, ""},
		{"commands: session\n", true, ""},
		{"preset: standard\ncommands: session\n", true, ""},
		{"commands: pooled\n", false, `p.yaml:1: commands "pooled" is not one of fresh, session`},
		{"commands: [session]\n", false, `p.yaml:1: commands must be a single value`},
	} {
		pol, err := policy.Parse("p.yaml", []byte(c.file))
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: %v, want %s", c.file, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if pol.SessionCommands() != c.session {
			t.Errorf("%q: session commands %v, want %v", c.file, pol.SessionCommands(), c.session)
		}
		if got := strings.Contains(policy.WorkspaceReadme(pol), "## Commands"); got != c.session {
			t.Errorf("%q: the workspace README tells of session commands: %v", c.file, got)
		}
	}
}

// TestLimitKeys: Limits.Keys names every key of a file's limits section
// (the parser takes those and no others), and each shows the value the
// file set, so loomfs policy show can't leave a limit out.
func TestLimitKeys(t *testing.T) {
	def := policy.DefaultLimits().Keys()
	for i, k := range def {
		t.Run(k.Name, func(t *testing.T) {
			// A number (bytes or a count) or, where the default is a
			// string, a duration: either unlike every default.
			value, want := "3", any(int64(3))
			if _, ok := k.Value.(string); ok {
				value, want = "7s", "7s"
			}
			pol, err := policy.Parse("p.yaml", []byte("limits:\n  "+k.Name+": "+value+"\n"))
			if err != nil {
				t.Fatalf("%s: %s: %v", k.Name, value, err)
			}
			got := pol.Limits.Keys()
			if len(got) != len(def) || got[i].Name != k.Name {
				t.Fatalf("keys %v, want the same keys as the defaults'", got)
			}
			if got[i].Value != want || got[i].Text == k.Text {
				t.Errorf("%s: %s shows as %v, %q (default %v, %q)", k.Name, value, got[i].Value, got[i].Text, k.Value, k.Text)
			}
			for j := range got {
				if j != i && got[j] != def[j] {
					t.Errorf("setting %s changed %s: %+v, default %+v", k.Name, got[j].Name, got[j], def[j])
				}
			}
		})
	}
	_, err := policy.Parse("p.yaml", []byte("limits:\n  no_such_limit: 1\n"))
	for _, k := range def {
		if err == nil || !strings.Contains(err.Error(), k.Name) {
			t.Errorf("an unknown key's refusal does not name %s among the known: %v", k.Name, err)
		}
	}
}
