package tools

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// fileBox is a Toolbox over a scope whose policy was loaded from a policy
// file, and what is needed to open it again (a restart).
type fileBox struct {
	*Toolbox
	root, dir string
	pol       *policy.Policy
	sc        store.Scope
}

func newFileBox(t *testing.T, file string) *fileBox {
	t.Helper()
	p := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(p, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	pol, err := policy.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	fb := &fileBox{root: t.TempDir(), pol: pol, sc: store.Scope{Space: "sp", Agent: "ag", Session: "se"}}
	fb.dir = filepath.Join(fb.root, fb.sc.Dir())
	fb.reopen(t)
	return fb
}

// reopen opens the volume and scope again, as a new process would.
func (fb *fileBox) reopen(t *testing.T) {
	t.Helper()
	vol, err := store.OpenVolume(context.Background(), store.Config{Root: fb.root})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vol.Close() })
	ws, err := vol.Open(context.Background(), fb.sc, fb.pol)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	fb.Toolbox = &Toolbox{WS: ws}
}

// TestModesFromPolicyFile is issue 7's first check: each mode through the
// tools door with a loaded policy file. data/ can't be written, output/
// can be written but not read back, .meta/ is neither listed nor opened.
func TestModesFromPolicyFile(t *testing.T) {
	fb := newFileBox(t, "preset: standard\n")
	for _, d := range []string{"data", "output", ".meta", "src"} {
		os.MkdirAll(filepath.Join(fb.dir, d), 0o700)
	}
	os.WriteFile(filepath.Join(fb.dir, "data/input.json"), []byte(`{"n":1}`), 0o600)
	os.WriteFile(filepath.Join(fb.dir, ".meta/task.json"), []byte(`{"secret":1}`), 0o600)

	tests := []struct {
		name  string
		tool  string
		input map[string]any
		code  policy.Code // "" means it succeeds
	}{
		{"data/ ro: read", Read, map[string]any{"path": "data/input.json"}, ""},
		{"data/ ro: write refused", Write, map[string]any{"path": "data/input.json", "content": "x"}, policy.ReadOnly},
		{"data/ ro: create refused", Write, map[string]any{"path": "data/new.json", "content": "x"}, policy.ReadOnly},
		{"data/ ro: edit refused", Edit, map[string]any{"path": "data/input.json", "old_text": "1", "new_text": "2"}, policy.ReadOnly},
		{"data/ ro: mkdir refused", Mkdir, map[string]any{"path": "data/sub"}, policy.ReadOnly},
		{"data/ ro: delete refused", Delete, map[string]any{"path": "data/input.json"}, policy.ReadOnly},
		{"output/ wo: write", Write, map[string]any{"path": "output/result.json", "content": "{}"}, ""},
		{"output/ wo: read back refused", Read, map[string]any{"path": "output/result.json"}, policy.PermissionDenied},
		{"output/ wo: edit refused (it reads)", Edit, map[string]any{"path": "output/result.json", "old_text": "{", "new_text": "["}, policy.PermissionDenied},
		{"output/ wo: grep refused", Grep, map[string]any{"pattern": "x", "path": "output/result.json"}, policy.PermissionDenied},
		{".meta/ hidden: read", Read, map[string]any{"path": ".meta/task.json"}, policy.NotFound},
		{".meta/ hidden: stat", Stat, map[string]any{"path": ".meta"}, policy.NotFound},
		{".meta/ hidden: list", List, map[string]any{"path": ".meta"}, policy.NotFound},
		{".meta/ hidden: write", Write, map[string]any{"path": ".meta/x", "content": "x"}, policy.NotFound},
		{"src/ rw: write", Write, map[string]any{"path": "src/main.go", "content": "package main\n"}, ""},
		{"src/ rw: read", Read, map[string]any{"path": "src/main.go"}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := call(t, fb.Toolbox, tc.tool, tc.input)
			if tc.code == "" {
				if err != nil {
					t.Fatalf("%s: %v", tc.tool, err)
				}
				return
			}
			wantCode(t, err, tc.code)
		})
	}
	t.Run("output/ wo: stat shows no hash", func(t *testing.T) {
		s := mustCall(t, fb.Toolbox, Stat, map[string]any{"path": "output/result.json"})
		if _, ok := s["sha256"]; ok {
			t.Errorf("stat of a write-only file tells its hash: %v", s)
		}
	})
	t.Run(".meta/ hidden: not listed, not globbed", func(t *testing.T) {
		l := mustCall(t, fb.Toolbox, List, map[string]any{})
		for _, e := range l["entries"].([]any) {
			if e.(map[string]any)["name"] == ".meta" {
				t.Errorf("the root listing shows .meta: %v", l)
			}
		}
		g := mustCall(t, fb.Toolbox, Glob, map[string]any{"pattern": "**"})
		if b, _ := json.Marshal(g); strings.Contains(string(b), ".meta") {
			t.Errorf("glob ** shows .meta: %s", b)
		}
	})
	if b, _ := os.ReadFile(filepath.Join(fb.dir, "data/input.json")); string(b) != `{"n":1}` {
		t.Errorf("data/input.json changed: %q", b)
	}
}

const quotaFile = `preset: open
rules:
  - path: tmp/
    mode: rw
    max_bytes: 8 KiB
    max_files: 3
limits:
  text_bytes: 16 KiB
  scope_bytes: 64 KiB
  scope_files: 12
`

// TestQuotasFromPolicyFile is issue 7's second check: the file count, the
// bytes, the per-file limit and the tmp/ cap are hit through the tools,
// with messages naming the limit and the figures; usage is right after a
// restart and, once refreshed, after an outside change.
func TestQuotasFromPolicyFile(t *testing.T) {
	fb := newFileBox(t, quotaFile)
	kib := func(n int) string { return strings.Repeat("x", n<<10) }
	write := func(path, content string) error {
		_, err := call(t, fb.Toolbox, Write, map[string]any{"path": path, "content": content})
		return err
	}
	refused := func(err error, code policy.Code, parts ...string) {
		t.Helper()
		pe := wantCode(t, err, code)
		for _, p := range parts {
			if !strings.Contains(pe.Message, p) {
				t.Errorf("message %q lacks %q", pe.Message, p)
			}
		}
	}

	// Per-file limit of the text tools.
	refused(write("big.txt", kib(17)), policy.TooLarge, "17 KiB", "16 KiB")

	// tmp/ cap: bytes, then file count (tmp/ itself is one).
	mustCall(t, fb.Toolbox, Mkdir, map[string]any{"path": "tmp", "parents": true}) // made at first use already
	if err := write("tmp/a", kib(6)); err != nil {
		t.Fatal(err)
	}
	refused(write("tmp/b", kib(4)), policy.QuotaExceeded, "tmp/ total 8 KiB", "used 6 KiB", "write of 4 KiB refused")
	if err := write("tmp/b", kib(1)); err != nil {
		t.Fatal(err)
	}
	refused(write("tmp/c", "x"), policy.QuotaExceeded, "tmp/ file count 3", "used 3", "1 new refused")
	// Outside tmp/ the same sizes pass: the cap is the subtree's.
	if err := write("src.txt", kib(4)); err != nil {
		t.Fatal(err)
	}

	// Scope bytes: 11 KiB used; 16 KiB files until the total refuses.
	for i := range 3 {
		if err := write(fmt.Sprintf("f%d", i), kib(16)); err != nil {
			t.Fatal(err)
		}
	}
	refused(write("f3", kib(16)), policy.QuotaExceeded, "workspace total 64 KiB", "used 59 KiB", "write of 16 KiB refused")

	// Scope file count: 7 objects so far (tmp, tmp/a, tmp/b, src.txt,
	// f0–f2); 5 more, then refused.
	for i := range 5 {
		mustCall(t, fb.Toolbox, Mkdir, map[string]any{"path": fmt.Sprintf("d%d", i)})
	}
	refused(write("one-more", ""), policy.QuotaExceeded, "workspace file count 12", "used 12", "1 new refused")
	_, err := call(t, fb.Toolbox, Mkdir, map[string]any{"path": "d9"})
	refused(err, policy.QuotaExceeded, "file count 12")
	// Deleting frees a place.
	mustCall(t, fb.Toolbox, Delete, map[string]any{"path": "d4"})

	truth := func() policy.Usage {
		var u policy.Usage
		filepath.WalkDir(fb.dir, func(p string, d fs.DirEntry, err error) error {
			if p == fb.dir || err != nil {
				return err
			}
			u.Files++
			if d.Type().IsRegular() {
				info, _ := d.Info()
				u.Bytes += info.Size()
			}
			return nil
		})
		return u
	}
	if got, _ := fb.WS.Usage(context.Background()); got != truth() {
		t.Fatalf("kept usage %+v, the scope holds %+v", got, truth())
	}

	// A restart: usage is rebuilt, and the caps still hold.
	fb.reopen(t)
	if got, _ := fb.WS.Usage(context.Background()); got != truth() {
		t.Fatalf("usage after a restart %+v, the scope holds %+v", got, truth())
	}
	if u, _ := fb.WS.SubtreeUsage(context.Background(), "tmp"); u != (policy.Usage{Bytes: 7 << 10, Files: 3}) {
		t.Fatalf("tmp/ usage after a restart %+v", u)
	}
	refused(write("tmp/c", "x"), policy.QuotaExceeded, "tmp/ file count 3")

	// An outside change: room is made behind loomfs's back. The kept
	// usage does not know until refreshed; then it does.
	os.Remove(filepath.Join(fb.dir, "tmp/a"))
	os.Remove(filepath.Join(fb.dir, "f0"))
	refused(write("tmp/c", "x"), policy.QuotaExceeded, "tmp/ file count 3")
	fb.WS.RefreshUsage(context.Background())
	if got, _ := fb.WS.Usage(context.Background()); got != truth() {
		t.Fatalf("usage after refresh %+v, the scope holds %+v", got, truth())
	}
	if err := write("tmp/c", kib(6)); err != nil {
		t.Fatalf("after refresh, tmp/ has room: %v", err)
	}
	refused(write("tmp/d", "x"), policy.QuotaExceeded, "tmp/ file count 3", "used 3")
	if err := write("f1", kib(2)); err != nil {
		t.Fatalf("shrinking a file always passes: %v", err)
	}
}

// TestConfirmation is issue 7's third check (seed 001 §6.3): where the
// policy marks an operation, the first call is refused with a token and
// changes nothing; the same call with the token performs it; a token can't
// be reused, applied to another file or call, or used after the file
// changed.
func TestConfirmation(t *testing.T) {
	fb := newFileBox(t, "preset: standard\n")
	host := func(rel string) string { return filepath.Join(fb.dir, rel) }
	content := func(rel string) string {
		b, err := os.ReadFile(host(rel))
		if err != nil {
			return "<" + err.Error() + ">"
		}
		return string(b)
	}
	mustCall(t, fb.Toolbox, Mkdir, map[string]any{"path": "output", "parents": true}) // made at first use already
	// Creating is not confirmed.
	mustCall(t, fb.Toolbox, Write, map[string]any{"path": "output/report.csv", "content": "v1"})
	mustCall(t, fb.Toolbox, Write, map[string]any{"path": "output/other.csv", "content": "other"})

	// ask makes a call that must be refused with a token, and changes
	// nothing; it returns the token.
	ask := func(tool string, in map[string]any, why string) string {
		t.Helper()
		before := content("output/report.csv") + "|" + content("output/other.csv")
		_, err := call(t, fb.Toolbox, tool, in)
		pe := wantCode(t, err, policy.ConfirmationRequired)
		if !strings.HasPrefix(pe.Token, "ct_") || !strings.Contains(pe.Message, pe.Token) || !strings.Contains(pe.Message, "confirm_token") {
			t.Fatalf("refusal carries no usable token: %+v", pe)
		}
		if why != "" && !strings.Contains(pe.Message, why) {
			t.Errorf("message %q does not say %q", pe.Message, why)
		}
		if after := content("output/report.csv") + "|" + content("output/other.csv"); after != before {
			t.Fatalf("a refused call changed output/: %s → %s", before, after)
		}
		if errno := policy.Errno(pe); errno.Error() != "operation not permitted" {
			t.Errorf("errno %v, want EPERM", errno)
		}
		return pe.Token
	}
	with := func(in map[string]any, token string) map[string]any {
		out := map[string]any{"confirm_token": token}
		for k, v := range in {
			out[k] = v
		}
		return out
	}

	overwrite := map[string]any{"path": "output/report.csv", "content": "v2"}
	tok := ask(Write, overwrite, "overwriting output/report.csv needs confirmation")
	mustCall(t, fb.Toolbox, Write, with(overwrite, tok))
	if got := content("output/report.csv"); got != "v2" {
		t.Fatalf("confirmed overwrite left %q", got)
	}

	t.Run("a token works once", func(t *testing.T) {
		again := map[string]any{"path": "output/report.csv", "content": "v2"}
		tok2 := ask(Write, with(again, tok), "already used")
		if tok2 == tok {
			t.Error("a refused reuse answered with the same token")
		}
	})
	t.Run("a token for another file", func(t *testing.T) {
		tok := ask(Delete, map[string]any{"path": "output/report.csv"}, "")
		ask(Delete, with(map[string]any{"path": "output/other.csv"}, tok), "not for workspace_delete of output/other.csv")
		// The token was consumed by the attempt: it no longer deletes report.csv either.
		ask(Delete, with(map[string]any{"path": "output/report.csv"}, tok), "already used")
	})
	t.Run("a token for another tool", func(t *testing.T) {
		tok := ask(Write, map[string]any{"path": "output/report.csv", "content": "v3"}, "")
		ask(Delete, with(map[string]any{"path": "output/report.csv"}, tok), "not for workspace_delete")
	})
	t.Run("a token for other arguments", func(t *testing.T) {
		tok := ask(Write, map[string]any{"path": "output/report.csv", "content": "v3"}, "")
		ask(Write, with(map[string]any{"path": "output/report.csv", "content": "something else"}, tok), "other arguments")
	})
	t.Run("a token after the file changed", func(t *testing.T) {
		tok := ask(Delete, map[string]any{"path": "output/report.csv"}, "")
		os.WriteFile(host("output/report.csv"), []byte("changed meanwhile"), 0o600)
		ask(Delete, with(map[string]any{"path": "output/report.csv"}, tok), "output/report.csv changed since")
		if content("output/report.csv") != "changed meanwhile" {
			t.Fatal("a stale token deleted the file")
		}
	})
	t.Run("an invented token", func(t *testing.T) {
		ask(Delete, with(map[string]any{"path": "output/report.csv"}, "ct_00000000000000000000000000000000"), "unknown")
		ask(Delete, with(map[string]any{"path": "output/report.csv"}, "../../etc/passwd"), "unknown")
	})
	t.Run("a confirmed delete", func(t *testing.T) {
		in := map[string]any{"path": "output/report.csv"}
		tok := ask(Delete, in, "deleting output/report.csv needs confirmation")
		mustCall(t, fb.Toolbox, Delete, with(in, tok))
		if _, err := os.Stat(host("output/report.csv")); !os.IsNotExist(err) {
			t.Fatalf("confirmed delete left the file: %v", err)
		}
	})
	t.Run("outside output/ nothing is asked", func(t *testing.T) {
		mustCall(t, fb.Toolbox, Write, map[string]any{"path": "notes.txt", "content": "a"})
		mustCall(t, fb.Toolbox, Write, map[string]any{"path": "notes.txt", "content": "b"})
		mustCall(t, fb.Toolbox, Delete, map[string]any{"path": "notes.txt"})
	})
	t.Run("tokens are kept outside the workspace", func(t *testing.T) {
		filepath.WalkDir(fb.dir, func(p string, d fs.DirEntry, err error) error {
			if err == nil && (strings.Contains(d.Name(), "confirm") || strings.HasPrefix(d.Name(), ".agentloom")) {
				t.Errorf("%s inside the scope", p)
			}
			return err
		})
		ents, err := os.ReadDir(filepath.Join(fb.root, store.LocksDir, fb.sc.Hash(), store.TokensDir))
		if err != nil || len(ents) == 0 {
			t.Errorf("no token records in the scope's state directory: %v", err)
		}
	})
}

// TestDescriptionsNameEveryRuleOfTheFile is issue 7's sixth check for the
// tools: the descriptions generated from a loaded policy file mention
// every rule and limit in force, and confirm_token exactly where the
// policy asks for confirmation.
func TestDescriptionsNameEveryRuleOfTheFile(t *testing.T) {
	file := quotaFile + `  - path: output
    mode: wo
    confirm: [delete]
  - path: data
    mode: ro
  - path: .meta
    mode: hidden
`
	// The rules above were appended after limits: put them back under rules.
	file = strings.Replace(file, "limits:\n  text_bytes: 16 KiB\n  scope_bytes: 64 KiB\n  scope_files: 12\n", "", 1) + "limits:\n  text_bytes: 16 KiB\n  scope_bytes: 64 KiB\n  scope_files: 12\n  file_bytes: 3 MiB\n"
	pol, err := policy.Parse("p.yaml", []byte(file))
	if err != nil {
		t.Fatal(err)
	}
	defs := map[string]Definition{}
	for _, d := range Definitions(pol) {
		defs[d.Name] = d
	}
	for _, name := range Names {
		d := defs[name]
		if !takesPaths(name) {
			continue
		}
		for _, r := range pol.Rules {
			if want := r.Prefix + "/ " + policy.ModeWords(r.Mode); !strings.Contains(d.Description, want) {
				t.Errorf("%s description lacks the rule %q", name, want)
			}
		}
	}
	l := pol.Limits
	changers := []string{Write, Edit, Mkdir, Command}
	for _, name := range changers {
		d := defs[name].Description
		for _, want := range []string{policy.Bytes(l.ScopeBytes), strconv.FormatInt(l.ScopeFiles, 10) + " files", policy.Bytes(l.FileBytes), policy.Bytes(l.TextBytes)} {
			if !strings.Contains(d, want) {
				t.Errorf("%s description lacks the limit %q", name, want)
			}
		}
		for _, s := range pol.Subtrees {
			if s.MaxBytes > 0 && !strings.Contains(d, s.Prefix+"/ read-write; holds at most "+policy.Bytes(s.MaxBytes)+" and "+strconv.FormatInt(s.MaxFiles, 10)+" files") {
				t.Errorf("%s description lacks the cap of %s/", name, s.Prefix)
			}
		}
	}
	for name, wantToken := range map[string]bool{Write: false, Edit: false, Delete: true, Read: false} {
		var s struct {
			Properties map[string]any `json:"properties"`
		}
		json.Unmarshal(defs[name].InputSchema, &s)
		if _, has := s.Properties["confirm_token"]; has != wantToken {
			t.Errorf("%s schema has confirm_token: %v, want %v", name, has, wantToken)
		}
	}
	if !strings.Contains(defs[Delete].Description, "deleting a file in output/") || !strings.Contains(defs[Delete].Description, "confirmation_required") {
		t.Errorf("delete description does not explain confirmation: %s", defs[Delete].Description)
	}
	if strings.Contains(defs[Write].Description, "overwriting a file in output/") {
		t.Errorf("write description claims a confirmation the policy does not ask: %s", defs[Write].Description)
	}
}
