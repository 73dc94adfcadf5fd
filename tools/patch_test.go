package tools

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentloom/loomfs/patch"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// files reads every regular file under root (relative path → content),
// so a test can say the workspace is exactly as it was.
func files(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		rel, _ := filepath.Rel(root, p)
		out[rel] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func sha(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

func sameFiles(t *testing.T, got, want map[string]string) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("workspace has %d files, want %d: %v", len(got), len(want), got)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
}

func seed(t *testing.T, root string, fs map[string]string) {
	t.Helper()
	for p, c := range fs {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// TestApplyPatchAcrossFiles: add, update with several hunks, move and
// delete, mixed across five files, applied as one.
func TestApplyPatchAcrossFiles(t *testing.T) {
	tb, root := newBox(t, nil)
	seed(t, root, map[string]string{
		"src/main.go":   "package main\n\nfunc a() {\n\treturn 1\n}\n\nfunc b() {\n\treturn 1\n}\n",
		"src/util.go":   "package main\n\nvar x = 1\n",
		"old/name.txt":  "moving\nalong\n",
		"gone.txt":      "bye\n",
		"untouched.txt": "same\n",
	})
	res := mustCall(t, tb, ApplyPatch, map[string]any{"patch": `*** Begin Patch
*** Add File: docs/new/readme.md
+# New
+text
*** Update File: src/main.go
@@ func a() {
-	return 1
+	return 2
@@ func b() {
-	return 1
+	return 3
*** Update File: src/util.go
@@
-var x = 1
+var x = 2
*** Update File: old/name.txt
*** Move to: new/name.txt
@@
 moving
-along
+ahead
*** Delete File: gone.txt
*** End Patch`})
	sameFiles(t, files(t, root), map[string]string{
		"docs/new/readme.md": "# New\ntext\n",
		"src/main.go":        "package main\n\nfunc a() {\n\treturn 2\n}\n\nfunc b() {\n\treturn 3\n}\n",
		"src/util.go":        "package main\n\nvar x = 2\n",
		"new/name.txt":       "moving\nahead\n",
		"untouched.txt":      "same\n",
	})
	var out PatchResult
	b, _ := json.Marshal(res)
	json.Unmarshal(b, &out)
	want := []PatchFile{
		{Path: "docs/new/readme.md", Action: "add", Added: 2},
		{Path: "src/main.go", Action: "update", Added: 2, Removed: 2},
		{Path: "src/util.go", Action: "update", Added: 1, Removed: 1},
		{Path: "new/name.txt", Action: "move", MovedFrom: "old/name.txt", Added: 1, Removed: 1},
		{Path: "gone.txt", Action: "delete"},
	}
	if len(out.Files) != len(want) {
		t.Fatalf("result %+v", out)
	}
	for i, w := range want {
		g := out.Files[i]
		if g.Path != w.Path || g.Action != w.Action || g.MovedFrom != w.MovedFrom || g.Added != w.Added || g.Removed != w.Removed {
			t.Errorf("file %d: %+v, want %+v", i, g, w)
		}
		if w.Action != "delete" && g.SHA256 != sha(files(t, root)[w.Path]) {
			t.Errorf("%s: sha256 %s is not the new content's", w.Path, g.SHA256)
		}
	}
}

// TestApplyPatchAllOrNothing: a patch refused for any reason leaves
// every file as it was.
func TestApplyPatchAllOrNothing(t *testing.T) {
	before := map[string]string{
		"a.txt":       "one\ntwo\n",
		"b.txt":       "three\nfour\n",
		"data/in.csv": "x,y\n",
	}
	pol, _ := policy.Preset("standard")
	cases := []struct {
		name, patch string
		expected    map[string]string
		code        policy.Code
		says        []string
	}{
		{"the last hunk fails", "*** Begin Patch\n*** Update File: a.txt\n@@\n-one\n+ONE\n*** Add File: c.txt\n+new\n*** Update File: b.txt\n@@\n three\n-fuor\n+FOUR\n*** End Patch", nil,
			policy.PatchFailed, []string{"patch line 9 (hunk 1 of *** Update File: b.txt)", "Nothing was written; make the hunk's", "closest lines of b.txt are at line 1:\nthree\nfour"}},
		{"a move onto itself", "*** Begin Patch\n*** Update File: a.txt\n*** Move to: a.txt\n@@\n-one\n+ONE\n*** End Patch", nil,
			policy.InvalidInput, []string{"patch line 2 (*** Update File: a.txt)", "leave out the '*** Move to:' line"}},
		{"a stale expected_sha256", "*** Begin Patch\n*** Update File: a.txt\n@@\n-one\n+ONE\n*** End Patch", map[string]string{"a.txt": sha("something else")},
			policy.Conflict, []string{"a.txt", sha("one\ntwo\n")}},
		{"into a read-only subtree", "*** Begin Patch\n*** Update File: a.txt\n@@\n-one\n+ONE\n*** Update File: data/in.csv\n@@\n-x,y\n+z\n*** End Patch", nil,
			policy.ReadOnly, []string{"data/in.csv"}},
		{"an add over a file expected_sha256 says must not exist", "*** Begin Patch\n*** Update File: a.txt\n@@\n-one\n+ONE\n*** Add File: b.txt\n+x\n*** End Patch", map[string]string{"b.txt": ""},
			policy.Conflict, []string{"patch line 6 (*** Add File: b.txt)", "b.txt exists", sha("three\nfour\n")}},
		{"a delete of a missing file", "*** Begin Patch\n*** Update File: a.txt\n@@\n-one\n+ONE\n*** Delete File: nope.txt\n*** End Patch", nil,
			policy.NotFound, []string{"patch line 6 (*** Delete File: nope.txt)", "take its '*** Delete File:' part out"}},
		{"a reserved name", "*** Begin Patch\n*** Update File: a.txt\n@@\n-one\n+ONE\n*** Add File: .agentloom-x\n+x\n*** End Patch", nil,
			policy.InvalidPath, nil},
		{"a path twice", "*** Begin Patch\n*** Update File: a.txt\n@@\n-one\n+ONE\n*** Delete File: a.txt\n*** End Patch", nil,
			policy.InvalidInput, []string{"patch line 6 (*** Delete File: a.txt)", "the part at patch line 2"}},
		{"an unparsable patch", "*** Begin Patch\n*** Frobnicate: a.txt\n*** End Patch", nil,
			policy.InvalidPatch, []string{"line 2"}},
		{"an unparsable hunk", "*** Begin Patch\n*** Update File: a.txt\n@@\n-one\n+ONE\n@@\n?\n*** End Patch", nil,
			policy.InvalidPatch, []string{"line 7 (in *** Update File: a.txt)"}},
		{"expected_sha256 of a file the patch leaves alone", "*** Begin Patch\n*** Update File: a.txt\n@@\n-one\n+ONE\n*** End Patch", map[string]string{"b.txt": sha("three\nfour\n")},
			policy.InvalidInput, []string{"take it out of expected_sha256"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tb, root := newBox(t, pol)
			seed(t, root, before)
			in := map[string]any{"patch": c.patch}
			if c.expected != nil {
				in["expected_sha256"] = c.expected
			}
			_, err := call(t, tb, ApplyPatch, in)
			if policy.CodeOf(err) != c.code {
				t.Fatalf("got %v, want code %s", err, c.code)
			}
			for _, s := range append(c.says, "Nothing was written") {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("message %q does not say %q", err, s)
				}
			}
			if n := strings.Count(err.Error(), "Nothing was written"); n != 1 {
				t.Errorf("message %q says %d times that nothing was written", err, n)
			}
			if c.expected == nil && strings.Contains(err.Error(), "re-read") {
				t.Errorf("message %q sends a model that read nothing back to re-read", err)
			}
			sameFiles(t, files(t, root), before)
		})
	}
}

// TestApplyPatchOverQuota: a patch that would take the scope over its
// quota is refused before anything is written.
func TestApplyPatchOverQuota(t *testing.T) {
	pol := policy.Default()
	pol.Limits.ScopeBytes = 100
	tb, root := newBox(t, pol)
	seed(t, root, map[string]string{"a.txt": "one\n"})
	big := "+" + strings.Repeat("x", 60) + "\n"
	_, err := call(t, tb, ApplyPatch, map[string]any{"patch": "*** Begin Patch\n*** Update File: a.txt\n@@\n-one\n+ONE\n*** Add File: b.txt\n" + big + "*** Add File: c.txt\n" + big + "*** End Patch"})
	if pe := wantCode(t, err, policy.QuotaExceeded); !strings.HasPrefix(pe.Message, "patch line 8 (*** Add File: c.txt): quota exceeded") || !strings.HasSuffix(pe.Message, "Nothing was written.") {
		t.Errorf("message %q names no patch line or does not say nothing was written", pe.Message)
	}
	sameFiles(t, files(t, root), map[string]string{"a.txt": "one\n"})
	// The reservation was given back: a patch that fits goes through.
	mustCall(t, tb, ApplyPatch, map[string]any{"patch": "*** Begin Patch\n*** Update File: a.txt\n@@\n-one\n+ONE\n*** Add File: b.txt\n" + big + "*** End Patch"})
}

// TestApplyPatchWhitespaceTolerant: hunks are found despite trailing and
// surrounding whitespace differences, and context lines keep the file's
// own spelling.
func TestApplyPatchWhitespaceTolerant(t *testing.T) {
	tb, root := newBox(t, nil)
	seed(t, root, map[string]string{"a.py": "def f():   \n        x = 1\n        return x\t\n"})
	mustCall(t, tb, ApplyPatch, map[string]any{"patch": "*** Begin Patch\n*** Update File: a.py\n@@ def f():\n    x = 1\n-    return x\n+        return x + 1\n*** End Patch"})
	sameFiles(t, files(t, root), map[string]string{"a.py": "def f():   \n        x = 1\n        return x + 1\n"})
}

// TestApplyPatchUnifiedDiff: a unified diff applies the same way.
func TestApplyPatchUnifiedDiff(t *testing.T) {
	tb, root := newBox(t, nil)
	seed(t, root, map[string]string{"a.txt": "1\n2\n3\n4\n5\n6\n7\n8\n", "b.txt": "gone\n"})
	mustCall(t, tb, ApplyPatch, map[string]any{"patch": "--- a/a.txt\n+++ b/a.txt\n@@ -2,2 +2,2 @@\n 2\n-3\n+three\n@@ -7,2 +7,2 @@\n 7\n-8\n+eight\n--- a/b.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-gone\n"})
	sameFiles(t, files(t, root), map[string]string{"a.txt": "1\n2\nthree\n4\n5\n6\n7\neight\n"})
}

// TestApplyPatchReplay: a patch replayed by its call id answers the
// recorded result and changes nothing again.
func TestApplyPatchReplay(t *testing.T) {
	tb, root := newBox(t, nil)
	seed(t, root, map[string]string{"a.txt": "one\n"})
	in := json.RawMessage(`{"patch":"*** Begin Patch\n*** Update File: a.txt\n@@\n-one\n+two\n*** End Patch"}`)
	first, err := tb.Call(context.Background(), ApplyPatch, "p-1", in)
	if err != nil {
		t.Fatal(err)
	}
	seed(t, root, map[string]string{"a.txt": "one\n"}) // as if someone put it back
	again, err := tb.Call(context.Background(), ApplyPatch, "p-1", in)
	if err != nil || string(again) != string(first) {
		t.Fatalf("replay: %s, %v; want %s", again, err, first)
	}
	sameFiles(t, files(t, root), map[string]string{"a.txt": "one\n"})
}

// TestMultiEdit: edits apply in order to one base; one that fails
// changes nothing and is named.
func TestMultiEdit(t *testing.T) {
	tb, root := newBox(t, nil)
	seed(t, root, map[string]string{"f.txt": "alpha beta gamma beta\n"})
	res := mustCall(t, tb, Edit, map[string]any{"path": "f.txt", "edits": []map[string]any{
		{"old_text": "alpha", "new_text": "ALPHA"},
		{"old_text": "ALPHA beta", "new_text": "first"}, // sees the edit before it
		{"old_text": "beta", "new_text": "B", "replace_all": true},
	}})
	if got := files(t, root)["f.txt"]; got != "first gamma B\n" {
		t.Errorf("after the edits: %q", got)
	}
	if res["replacements"] != float64(3) || res["sha256"] != sha("first gamma B\n") {
		t.Errorf("result %v", res)
	}
	for _, c := range []struct {
		name  string
		edits []map[string]any
		code  policy.Code
		says  string
	}{
		{"no match", []map[string]any{{"old_text": "first", "new_text": "1"}, {"old_text": "nowhere", "new_text": "x"}}, policy.NoMatch, "edits[1]"},
		{"ambiguous", []map[string]any{{"old_text": "gamma", "new_text": "B"}, {"old_text": "B", "new_text": "x"}}, policy.AmbiguousEdit, "edits[1]: old_text occurs 2 times"},
		{"no change", []map[string]any{{"old_text": "B", "new_text": "B"}}, policy.NoChange, "edits[0]"},
		{"missing new_text", []map[string]any{{"old_text": "B"}}, policy.InvalidInput, "edits[0]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := call(t, tb, Edit, map[string]any{"path": "f.txt", "edits": c.edits})
			if policy.CodeOf(err) != c.code || !strings.Contains(err.Error(), c.says) {
				t.Fatalf("got %v, want %s saying %q", err, c.code, c.says)
			}
			if got := files(t, root)["f.txt"]; got != "first gamma B\n" {
				t.Errorf("a failed multi-edit changed the file: %q", got)
			}
		})
	}
	// Both forms: old_text and new_text are the first edit.
	mustCall(t, tb, Edit, map[string]any{"path": "f.txt", "old_text": "B", "new_text": "C", "edits": []map[string]any{{"old_text": "C\n", "new_text": "D\n"}}})
	if got := files(t, root)["f.txt"]; got != "first gamma D\n" {
		t.Errorf("both forms: %q", got)
	}
	// The single form is as before.
	if _, err := call(t, tb, Edit, map[string]any{"path": "f.txt", "old_text": "B"}); policy.CodeOf(err) != policy.InvalidInput {
		t.Errorf("old_text without new_text: %v", err)
	}
	mustCall(t, tb, Edit, map[string]any{"path": "f.txt", "old_text": "first", "new_text": "1st"})
}

// TestApplyPatchAudited: a patch is recorded before it is made and with
// its outcome, each file named; a refused one says its code.
func TestApplyPatchAudited(t *testing.T) {
	tb, root := newBox(t, nil)
	sink := &memSink{}
	tb.Audit = sink
	seed(t, root, map[string]string{"a.txt": "one\n"})
	mustCall(t, tb, ApplyPatch, map[string]any{"patch": "*** Begin Patch\n*** Update File: a.txt\n*** Move to: b.txt\n@@\n-one\n+two\n*** End Patch"})
	evs := sink.take()
	if len(evs) != 2 || evs[0].Result != "started" || evs[1].Result != "ok" || evs[1].Bytes != 4 {
		t.Fatalf("records %+v", evs)
	}
	files, _ := evs[1].Detail["files"].([]map[string]any)
	if len(files) != 1 || files[0]["path"] != "b.txt" || files[0]["moved_from"] != "a.txt" || files[0]["sha256"] != sha("two\n") {
		t.Errorf("detail %+v", evs[1].Detail)
	}
	call(t, tb, ApplyPatch, map[string]any{"patch": "*** Begin Patch\n*** Update File: b.txt\n@@\n-nope\n+x\n*** End Patch"})
	if evs := sink.take(); len(evs) != 2 || evs[1].Result != "refused" || evs[1].Code != string(policy.PatchFailed) {
		t.Errorf("refused patch records %+v", evs)
	}
}

// TestApplyPatchConfirmation: where the policy asks for confirmation
// (output/ in the standard layout), a patch answers confirmation_required
// and changes nothing; the same patch with the token goes ahead, once.
func TestApplyPatchConfirmation(t *testing.T) {
	pol, _ := policy.Preset("standard")
	tb, root := newBox(t, pol)
	seed(t, root, map[string]string{"output/report.txt": "v1\n", "src/a.txt": "a\n"})
	patch := "*** Begin Patch\n*** Update File: src/a.txt\n@@\n-a\n+b\n*** Delete File: output/report.txt\n*** End Patch"
	_, err := call(t, tb, ApplyPatch, map[string]any{"patch": patch})
	pe := policy.AsError(err)
	if pe.Code != policy.ConfirmationRequired || pe.Token == "" {
		t.Fatalf("got %v, want confirmation_required with a token", err)
	}
	sameFiles(t, files(t, root), map[string]string{"output/report.txt": "v1\n", "src/a.txt": "a\n"})
	mustCall(t, tb, ApplyPatch, map[string]any{"patch": patch, "confirm_token": pe.Token})
	sameFiles(t, files(t, root), map[string]string{"src/a.txt": "b\n"})
	// An update in write-only output/ is refused: its hunks can't be
	// matched against what may not be read.
	seed(t, root, map[string]string{"output/r2.txt": "x\n"})
	if _, err := call(t, tb, ApplyPatch, map[string]any{"patch": "*** Begin Patch\n*** Update File: output/r2.txt\n@@\n-x\n+y\n*** End Patch"}); policy.CodeOf(err) != policy.PermissionDenied {
		t.Errorf("update in wo: %v", err)
	}
}

// TestApplyPatchCodexScenarios: the 23 scenarios of Codex's own
// apply_patch tests (codex-rs/apply-patch/tests/fixtures/scenarios, named
// by their numbers), written out here, run through the tool on a real
// scope: each leaves the tree Codex leaves, except 015, where Codex keeps
// the file it added before the part that failed and loomfs writes
// nothing. A refusal names its patch line and header and says nothing was
// written.
func TestApplyPatchCodexScenarios(t *testing.T) {
	cases := []struct {
		name          string
		before, after map[string]string
		patch         string
		code          policy.Code // "" for success
		says          []string    // in a refusal, besides "Nothing was written."
	}{
		{name: "001 add file",
			patch: "*** Begin Patch\n*** Add File: bar.md\n+This is a new file\n*** End Patch\n",
			after: map[string]string{"bar.md": "This is a new file\n"}},
		{name: "002 multiple operations",
			before: map[string]string{"delete.txt": "obsolete\n", "modify.txt": "line1\nline2\n"},
			patch:  "*** Begin Patch\n*** Add File: nested/new.txt\n+created\n*** Delete File: delete.txt\n*** Update File: modify.txt\n@@\n-line2\n+changed\n*** End Patch\n",
			after:  map[string]string{"nested/new.txt": "created\n", "modify.txt": "line1\nchanged\n"}},
		{name: "003 multiple chunks",
			before: map[string]string{"multi.txt": "line1\nline2\nline3\nline4\n"},
			patch:  "*** Begin Patch\n*** Update File: multi.txt\n@@\n-line2\n+changed2\n@@\n-line4\n+changed4\n*** End Patch\n",
			after:  map[string]string{"multi.txt": "line1\nchanged2\nline3\nchanged4\n"}},
		{name: "004 move to a new directory",
			before: map[string]string{"old/name.txt": "old content\n", "old/other.txt": "unrelated file\n"},
			patch:  "*** Begin Patch\n*** Update File: old/name.txt\n*** Move to: renamed/dir/name.txt\n@@\n-old content\n+new content\n*** End Patch\n",
			after:  map[string]string{"renamed/dir/name.txt": "new content\n", "old/other.txt": "unrelated file\n"}},
		{name: "005 an empty patch is refused",
			before: map[string]string{"foo.txt": "stable\n"},
			patch:  "*** Begin Patch\n*** End Patch\n",
			code:   policy.InvalidPatch, says: []string{"line 2", "changes no file"}},
		{name: "006 missing context is refused",
			before: map[string]string{"modify.txt": "line1\nline2\n"},
			patch:  "*** Begin Patch\n*** Update File: modify.txt\n@@\n-missing\n+changed\n*** End Patch\n",
			code:   policy.PatchFailed, says: []string{"patch line 3 (hunk 1 of *** Update File: modify.txt)"}},
		{name: "007 deleting a missing file is refused",
			before: map[string]string{"foo.txt": "stable\n"},
			patch:  "*** Begin Patch\n*** Delete File: missing.txt\n*** End Patch\n",
			code:   policy.NotFound, says: []string{"patch line 2 (*** Delete File: missing.txt)"}},
		{name: "008 an update without hunks is refused",
			before: map[string]string{"foo.txt": "stable\n"},
			patch:  "*** Begin Patch\n*** Update File: foo.txt\n*** End Patch\n",
			code:   policy.InvalidPatch, says: []string{"line 2 (in *** Update File: foo.txt)", "no hunks"}},
		{name: "009 updating a missing file is refused",
			before: map[string]string{"foo.txt": "stable\n"},
			patch:  "*** Begin Patch\n*** Update File: missing.txt\n@@\n-old\n+new\n*** End Patch\n",
			code:   policy.NotFound, says: []string{"patch line 2 (*** Update File: missing.txt)", "'*** Add File: missing.txt'"}},
		{name: "010 a move replaces an existing destination",
			before: map[string]string{"old/name.txt": "from\n", "old/other.txt": "unrelated file\n", "renamed/dir/name.txt": "existing\n"},
			patch:  "*** Begin Patch\n*** Update File: old/name.txt\n*** Move to: renamed/dir/name.txt\n@@\n-from\n+new\n*** End Patch\n",
			after:  map[string]string{"renamed/dir/name.txt": "new\n", "old/other.txt": "unrelated file\n"}},
		{name: "011 an add replaces an existing file",
			before: map[string]string{"duplicate.txt": "old content\n"},
			patch:  "*** Begin Patch\n*** Add File: duplicate.txt\n+new content\n*** End Patch\n",
			after:  map[string]string{"duplicate.txt": "new content\n"}},
		{name: "012 deleting a directory is refused",
			before: map[string]string{"dir/foo.txt": "stable\n"},
			patch:  "*** Begin Patch\n*** Delete File: dir\n*** End Patch\n",
			code:   policy.IsDir, says: []string{"patch line 2 (*** Delete File: dir)"}},
		{name: "013 an unknown header is refused",
			before: map[string]string{"foo.txt": "stable\n"},
			patch:  "*** Begin Patch\n*** Frobnicate File: foo\n*** End Patch\n",
			code:   policy.InvalidPatch, says: []string{"line 2", "*** Frobnicate File: foo"}},
		{name: "014 an update ends the file with a newline",
			before: map[string]string{"no_newline.txt": "no newline at end"},
			patch:  "*** Begin Patch\n*** Update File: no_newline.txt\n@@\n-no newline at end\n+first line\n+second line\n*** End Patch\n",
			after:  map[string]string{"no_newline.txt": "first line\nsecond line\n"}},
		{name: "015 a failure after a part that applies writes nothing (Codex keeps created.txt)",
			patch: "*** Begin Patch\n*** Add File: created.txt\n+hello\n*** Update File: missing.txt\n@@\n-old\n+new\n*** End Patch\n",
			code:  policy.NotFound, says: []string{"patch line 4 (*** Update File: missing.txt)"}},
		{name: "016 a pure addition appends",
			before: map[string]string{"input.txt": "line1\nline2\n"},
			patch:  "*** Begin Patch\n*** Update File: input.txt\n@@\n+added line 1\n+added line 2\n*** End Patch\n",
			after:  map[string]string{"input.txt": "line1\nline2\nadded line 1\nadded line 2\n"}},
		{name: "017 a whitespace-padded file header",
			before: map[string]string{"foo.txt": "old\n"},
			patch:  "*** Begin Patch\n  *** Update File: foo.txt\n@@\n-old\n+new\n*** End Patch\n",
			after:  map[string]string{"foo.txt": "new\n"}},
		{name: "018 whitespace-padded patch markers",
			before: map[string]string{"file.txt": "one\n"},
			patch:  " *** Begin Patch\n*** Update File: file.txt\n@@\n-one\n+two\n*** End Patch \n",
			after:  map[string]string{"file.txt": "two\n"}},
		{name: "019 unicode",
			before: map[string]string{"foo.txt": "line1\nnaïve café\nline3\n"},
			patch:  "*** Begin Patch\n*** Update File: foo.txt\n@@\n line1\n-naïve café\n+naïve café ✅\n*** End Patch\n",
			after:  map[string]string{"foo.txt": "line1\nnaïve café ✅\nline3\n"}},
		{name: "020 delete a file",
			before: map[string]string{"keep.txt": "keep\n", "obsolete.txt": "obsolete\n"},
			patch:  "*** Begin Patch\n*** Delete File: obsolete.txt\n*** End Patch\n",
			after:  map[string]string{"keep.txt": "keep\n"}},
		{name: "020 whitespace-padded marker lines",
			before: map[string]string{"file.txt": "one\n"},
			patch:  "*** Begin Patch \n*** Update File: file.txt\n@@\n-one\n+two\n *** End Patch\n",
			after:  map[string]string{"file.txt": "two\n"}},
		{name: "021 an update that only deletes",
			before: map[string]string{"lines.txt": "line1\nline2\nline3\n"},
			patch:  "*** Begin Patch\n*** Update File: lines.txt\n@@\n line1\n-line2\n line3\n*** End Patch\n",
			after:  map[string]string{"lines.txt": "line1\nline3\n"}},
		{name: "022 an end-of-file marker",
			before: map[string]string{"tail.txt": "first\nsecond\n"},
			patch:  "*** Begin Patch\n*** Update File: tail.txt\n@@\n first\n-second\n+second updated\n*** End of File\n*** End Patch\n",
			after:  map[string]string{"tail.txt": "first\nsecond updated\n"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tb, root := newBox(t, nil)
			seed(t, root, c.before)
			_, err := call(t, tb, ApplyPatch, map[string]any{"patch": c.patch})
			if c.code == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				sameFiles(t, files(t, root), c.after)
				return
			}
			pe := wantCode(t, err, c.code)
			for _, s := range append(c.says, "Nothing was written") {
				if !strings.Contains(pe.Message, s) {
					t.Errorf("message %q does not say %q", pe.Message, s)
				}
			}
			if strings.Contains(pe.Message, "re-read") {
				t.Errorf("message %q sends a model that read nothing back to re-read", pe.Message)
			}
			sameFiles(t, files(t, root), c.before)
		})
	}
}

// TestApplyPatchReplaces: "*** Add File:" over a file and "*** Move to:"
// onto one replace it, as Codex does, keeping its mode, unless the call's
// expected_sha256 for that path says otherwise: then a mismatch is a
// conflict carrying the current hash, and nothing is written.
func TestApplyPatchReplaces(t *testing.T) {
	const (
		add  = "*** Begin Patch\n*** Add File: b.txt\n+new\n*** End Patch"
		move = "*** Begin Patch\n*** Update File: a.txt\n*** Move to: b.txt\n@@\n-one\n+new\n*** End Patch"
	)
	old := sha("old\n")
	for _, c := range []struct {
		name, patch string
		expected    map[string]string
		code        policy.Code
		says        []string
	}{
		{"add, no expected_sha256", add, nil, "", nil},
		{"add, the current hash", add, map[string]string{"b.txt": old}, "", nil},
		{"add, a stale hash", add, map[string]string{"b.txt": sha("other\n")}, policy.Conflict, []string{"patch line 2 (*** Add File: b.txt)", old}},
		{"add, must not exist", add, map[string]string{"b.txt": ""}, policy.Conflict, []string{"patch line 2 (*** Add File: b.txt)", "b.txt exists (current sha256 " + old + ")", "take it out of expected_sha256"}},
		{"move, no expected_sha256", move, nil, "", nil},
		{"move, the current hash", move, map[string]string{"b.txt": old}, "", nil},
		{"move, a stale hash", move, map[string]string{"b.txt": sha("other\n")}, policy.Conflict, []string{"patch line 2 (*** Update File: a.txt)", old}},
		{"move, must not exist", move, map[string]string{"b.txt": ""}, policy.Conflict, []string{"patch line 2 (*** Update File: a.txt)", "b.txt exists (current sha256 " + old + ")"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			tb, root := newBox(t, nil)
			before := map[string]string{"a.txt": "one\n", "b.txt": "old\n"}
			seed(t, root, before)
			if err := os.Chmod(filepath.Join(root, "b.txt"), 0o700); err != nil {
				t.Fatal(err)
			}
			in := map[string]any{"patch": c.patch}
			if c.expected != nil {
				in["expected_sha256"] = c.expected
			}
			res, err := call(t, tb, ApplyPatch, in)
			if c.code != "" {
				pe := wantCode(t, err, c.code)
				if pe.SHA256 != old {
					t.Errorf("conflict carries sha256 %q, want the current %s", pe.SHA256, old)
				}
				for _, s := range append(c.says, "Nothing was written.") {
					if !strings.Contains(pe.Message, s) {
						t.Errorf("message %q does not say %q", pe.Message, s)
					}
				}
				sameFiles(t, files(t, root), before)
				return
			}
			if err != nil {
				t.Fatalf("refused: %v", err)
			}
			want := map[string]string{"a.txt": "one\n", "b.txt": "new\n"}
			if strings.Contains(c.patch, "Move to") {
				delete(want, "a.txt")
			}
			sameFiles(t, files(t, root), want)
			f := res["files"].([]any)[0].(map[string]any)
			if f["path"] != "b.txt" || f["replaced"] != true || f["sha256"] != sha("new\n") {
				t.Errorf("result %v, want b.txt replaced", f)
			}
			if st, err := os.Stat(filepath.Join(root, "b.txt")); err != nil || st.Mode().Perm() != 0o700 {
				t.Errorf("the replaced file's mode is not kept: %v %v", st.Mode(), err)
			}
		})
	}
	// What a write may not replace, a patch may not either.
	tb, root := newBox(t, nil)
	seed(t, root, map[string]string{"a.txt": "one\n", "d/x.txt": "x\n", "secret.txt": "s\n"})
	if _, err := tb.WS.Symlink(context.Background(), "lnk", "secret.txt"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		patch string
		code  policy.Code
	}{
		{"*** Begin Patch\n*** Add File: d\n+x\n*** End Patch", policy.IsDir},
		{"*** Begin Patch\n*** Add File: lnk\n+x\n*** End Patch", policy.SymlinkRefused},
		{"*** Begin Patch\n*** Update File: a.txt\n*** Move to: d\n@@\n-one\n+two\n*** End Patch", policy.IsDir},
		{"*** Begin Patch\n*** Update File: a.txt\n*** Move to: lnk\n@@\n-one\n+two\n*** End Patch", policy.SymlinkRefused},
	} {
		_, err := call(t, tb, ApplyPatch, map[string]any{"patch": c.patch})
		if pe := wantCode(t, err, c.code); !strings.Contains(pe.Message, "patch line 2") {
			t.Errorf("message %q does not name the patch line", pe.Message)
		}
	}
	if got := files(t, root); got["a.txt"] != "one\n" || got["secret.txt"] != "s\n" {
		t.Errorf("a refused patch changed files: %v", got)
	}
}

// TestApplyPatchDeletesLink: "*** Delete File:" of an emulated link
// removes the link, as workspace_delete does, and never its target.
func TestApplyPatchDeletesLink(t *testing.T) {
	tb, root := newBox(t, nil)
	seed(t, root, map[string]string{"secret.txt": "CANARY\n", "other.txt": "x\n"})
	if _, err := tb.WS.Symlink(context.Background(), "lnk", "secret.txt"); err != nil {
		t.Fatal(err)
	}
	_, err := call(t, tb, ApplyPatch, map[string]any{
		"patch":           "*** Begin Patch\n*** Delete File: lnk\n*** End Patch",
		"expected_sha256": map[string]string{"lnk": sha("secret.txt")},
	})
	if pe := wantCode(t, err, policy.InvalidInput); !strings.Contains(pe.Message, "take it out of expected_sha256") {
		t.Errorf("message %q", pe.Message)
	}
	res := mustCall(t, tb, ApplyPatch, map[string]any{"patch": "*** Begin Patch\n*** Delete File: lnk\n*** Update File: other.txt\n@@\n-x\n+y\n*** End Patch"})
	if f := res["files"].([]any)[0].(map[string]any); f["action"] != "delete" || f["path"] != "lnk" {
		t.Errorf("result %v", res)
	}
	if _, err := os.Lstat(filepath.Join(root, "lnk")); !os.IsNotExist(err) {
		t.Fatalf("the link is still there: %v", err)
	}
	sameFiles(t, files(t, root), map[string]string{"secret.txt": "CANARY\n", "other.txt": "y\n"})
	// The quota gave the link's file back.
	if _, err := tb.WS.Symlink(context.Background(), "lnk", "secret.txt"); err != nil {
		t.Fatal(err)
	}
}

// TestApplyPatchChangedMeanwhile: a file another writer changed between
// this call's checks and its writes is a conflict the store finds; to a
// call that gave no hash for it the answer says to send the patch again,
// never to re-read, and names the patch line.
func TestApplyPatchChangedMeanwhile(t *testing.T) {
	tb, _ := newBox(t, nil)
	files, err := patch.Parse("*** Begin Patch\n*** Update File: a.txt\n@@\n-one\n+two\n*** Add File: b.txt\n+new\n*** End Patch")
	if err != nil {
		t.Fatal(err)
	}
	parts := []patchPart{{File: files[0], rel: "a.txt"}, {File: files[1], rel: "b.txt"}}
	for _, c := range []struct {
		name  string
		given bool
		says  []string
		not   string
	}{
		{"no hash given", false, []string{"patch line 6 (*** Add File: b.txt)", "changed by another writer", "send the patch again", "Nothing was written."}, "re-read"},
		{"a hash given", true, []string{"patch line 6 (*** Add File: b.txt)", "re-read", "Nothing was written."}, "send the patch again"},
	} {
		t.Run(c.name, func(t *testing.T) {
			pc := &patchCall{t: tb, expected: map[string]string{}, given: map[string]bool{"b.txt": c.given}}
			err := pc.storeRefusal(tb.WS.ConflictError("b.txt", sha("now\n")), parts)
			pe := wantCode(t, err, policy.Conflict)
			if pe.SHA256 != sha("now\n") {
				t.Errorf("sha256 %q, want the current one", pe.SHA256)
			}
			for _, s := range c.says {
				if !strings.Contains(pe.Message, s) {
					t.Errorf("message %q does not say %q", pe.Message, s)
				}
			}
			if strings.Contains(pe.Message, c.not) {
				t.Errorf("message %q says %q", pe.Message, c.not)
			}
		})
	}
}

// TestApplyPatchMoveOntoConfirmed: a move onto a file where overwriting
// needs confirmation (output/ in the standard layout) asks for it.
func TestApplyPatchMoveOntoConfirmed(t *testing.T) {
	pol, _ := policy.Preset("standard")
	tb, root := newBox(t, pol)
	before := map[string]string{"src/a.txt": "a\n", "output/r.txt": "v1\n"}
	seed(t, root, before)
	p := "*** Begin Patch\n*** Update File: src/a.txt\n*** Move to: output/r.txt\n@@\n-a\n+b\n*** End Patch"
	_, err := call(t, tb, ApplyPatch, map[string]any{"patch": p})
	pe := wantCode(t, err, policy.ConfirmationRequired)
	sameFiles(t, files(t, root), before)
	mustCall(t, tb, ApplyPatch, map[string]any{"patch": p, "confirm_token": pe.Token})
	sameFiles(t, files(t, root), map[string]string{"output/r.txt": "b\n"})
}

// TestApplyPatchDescription: the model reads in the tool's description
// what the README says the tool does: hunks matched through typographic
// punctuation, adds and moves that replace, links deleted as links.
func TestApplyPatchDescription(t *testing.T) {
	var desc string
	for _, d := range Definitions(policy.Default()) {
		if d.Name == ApplyPatch {
			desc = d.Description
		}
	}
	for _, s := range []string{"typographic dashes, quotes and spaces", "replace it", "removes the link", "names the patch line"} {
		if !strings.Contains(desc, s) {
			t.Errorf("the description does not say %q: %s", s, desc)
		}
	}
}

// TestApplyChangesLink: the store removes a change set's link only if it
// is still a link; a file put in its place is a conflict, and nothing of
// the set is written.
func TestApplyChangesLink(t *testing.T) {
	tb, root := newBox(t, nil)
	seed(t, root, map[string]string{"f.txt": "file\n", "a.txt": "a\n"})
	if _, err := tb.WS.Symlink(context.Background(), "lnk", "a.txt"); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	_, err := tb.WS.ApplyChanges(ctx, []store.FileChange{
		{Path: "a.txt", Data: []byte("b\n"), Expected: sha("a\n")},
		{Path: "f.txt", Delete: true, Link: true},
	})
	wantCode(t, err, policy.Conflict)
	sameFiles(t, files(t, root), map[string]string{"f.txt": "file\n", "a.txt": "a\n", "lnk": "a.txt"})
	if _, err := tb.WS.ApplyChanges(ctx, []store.FileChange{{Path: "lnk", Delete: true, Link: true}}); err != nil {
		t.Fatal(err)
	}
	sameFiles(t, files(t, root), map[string]string{"f.txt": "file\n", "a.txt": "a\n"})
}
