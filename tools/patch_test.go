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

	"github.com/agentloom/loomfs/policy"
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
			policy.PatchFailed, []string{"b.txt", "hunk 1", "three", "line 1"}},
		{"a stale expected_sha256", "*** Begin Patch\n*** Update File: a.txt\n@@\n-one\n+ONE\n*** End Patch", map[string]string{"a.txt": sha("something else")},
			policy.Conflict, []string{"a.txt", sha("one\ntwo\n")}},
		{"into a read-only subtree", "*** Begin Patch\n*** Update File: a.txt\n@@\n-one\n+ONE\n*** Update File: data/in.csv\n@@\n-x,y\n+z\n*** End Patch", nil,
			policy.ReadOnly, []string{"data/in.csv"}},
		{"an add over an existing file", "*** Begin Patch\n*** Update File: a.txt\n@@\n-one\n+ONE\n*** Add File: b.txt\n+x\n*** End Patch", nil,
			policy.Exists, []string{"b.txt"}},
		{"a reserved name", "*** Begin Patch\n*** Update File: a.txt\n@@\n-one\n+ONE\n*** Add File: .agentloom-x\n+x\n*** End Patch", nil,
			policy.InvalidPath, nil},
		{"a path twice", "*** Begin Patch\n*** Update File: a.txt\n@@\n-one\n+ONE\n*** Delete File: a.txt\n*** End Patch", nil,
			policy.InvalidInput, []string{"twice"}},
		{"an unparsable patch", "*** Begin Patch\n*** Frobnicate: a.txt\n*** End Patch", nil,
			policy.InvalidPatch, []string{"line 2"}},
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
			for _, s := range c.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("message %q does not say %q", err, s)
				}
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
	if policy.CodeOf(err) != policy.QuotaExceeded {
		t.Fatalf("got %v, want quota_exceeded", err)
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
