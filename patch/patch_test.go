package patch

import (
	"errors"
	"strings"
	"testing"
)

func TestParseCodex(t *testing.T) {
	files, err := Parse(`*** Begin Patch
*** Add File: src/new.txt
+hello
+world
*** Delete File: old.txt
*** Update File: src/a.go
*** Move to: src/b.go
@@ func main() {
-	println("a")
+	println("b")
@@
 x
-y
+z
*** End of File
*** End Patch
`)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 3 {
		t.Fatalf("got %d files: %+v", len(files), files)
	}
	if f := files[0]; f.Action != Add || f.Path != "src/new.txt" || f.Content != "hello\nworld\n" {
		t.Errorf("add: %+v", f)
	}
	if f := files[1]; f.Action != Delete || f.Path != "old.txt" {
		t.Errorf("delete: %+v", f)
	}
	f := files[2]
	if f.Action != Update || f.Path != "src/a.go" || f.MoveTo != "src/b.go" || len(f.Hunks) != 2 {
		t.Fatalf("update: %+v", f)
	}
	if h := f.Hunks[0]; h.Context != "func main() {" || h.Added != 1 || h.Removed != 1 {
		t.Errorf("hunk 1: %+v", h)
	}
	if h := f.Hunks[1]; !h.EOF || strings.Join(h.Old, "|") != "x|y" || strings.Join(h.New, "|") != "x|z" {
		t.Errorf("hunk 2: %+v", h)
	}
}

func TestParseUnified(t *testing.T) {
	files, err := Parse(`diff --git a/x.txt b/x.txt
index 1..2 100644
--- a/x.txt
+++ b/x.txt
@@ -1,3 +1,3 @@
 one
-two
+TWO
 three
--- /dev/null
+++ b/new.txt
@@ -0,0 +1,2 @@
+a
+b
--- a/gone.txt
+++ /dev/null
@@ -1 +0,0 @@
-bye
--- a/from.txt
+++ b/to.txt
@@ -1 +1 @@
-x
+y
\ No newline at end of file
`)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		a          Action
		path, move string
	}{{Update, "x.txt", ""}, {Add, "new.txt", ""}, {Delete, "gone.txt", ""}, {Update, "from.txt", "to.txt"}}
	if len(files) != len(want) {
		t.Fatalf("got %d files: %+v", len(files), files)
	}
	for i, w := range want {
		if f := files[i]; f.Action != w.a || f.Path != w.path || f.MoveTo != w.move {
			t.Errorf("file %d: %+v, want %+v", i, f, w)
		}
	}
	if files[1].Content != "a\nb\n" {
		t.Errorf("added content %q", files[1].Content)
	}
}

func TestParseRefuses(t *testing.T) {
	for name, text := range map[string]string{
		"empty":             "",
		"no end marker":     "*** Begin Patch\n*** Delete File: x\n",
		"bad header":        "*** Begin Patch\n*** Rename File: x\n*** End Patch",
		"empty update":      "*** Begin Patch\n*** Update File: x\n*** End Patch",
		"bad hunk line":     "*** Begin Patch\n*** Update File: x\n@@\n?what\n*** End Patch",
		"not a patch":       "just some text",
		"short unified":     "--- a/x\n+++ b/x\n@@ -1,3 +1,3 @@\n a\n",
		"bad unified count": "--- a/x\n+++ b/x\n@@ -1,z +1 @@\n a\n",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse(text)
			var pe *Error
			if !errors.As(err, &pe) {
				t.Fatalf("Parse = %v, want a *patch.Error", err)
			}
		})
	}
}

func TestApply(t *testing.T) {
	for _, c := range []struct {
		name, text, patch, want string
	}{
		{"several hunks", "a\nb\nc\nd\ne\nf\n", "@@\n a\n-b\n+B\n@@\n c\n d\n-e\n+E\n@@\n f\n+g\n*** End of File", "a\nB\nc\nd\nE\nf\ng\n"},
		{"context line", "func a() {\n\treturn 1\n}\nfunc b() {\n\treturn 1\n}\n", "@@ func b() {\n-\treturn 1\n+\treturn 2", "func a() {\n\treturn 1\n}\nfunc b() {\n\treturn 2\n}\n"},
		{"trailing whitespace in the file", "foo   \nbar\t\n", "@@\n-foo\n-bar\n+baz", "baz\n"},
		{"indentation differs", "    foo\n    bar\n", "@@\n foo\n-bar\n+    qux", "    foo\n    qux\n"},
		{"typographic dash", "x \u2013 y\n", "@@\n-x - y\n+z", "z\n"},
		{"pure addition appends", "one\n", "@@\n+two", "one\ntwo\n"},
		{"no final newline", "one\ntwo", "@@\n-two\n+2", "one\n2\n"},
		{"crlf kept", "one\r\ntwo\r\n", "@@\n-two\n+2", "one\r\n2\r\n"},
		{"eof prefers the end", "x\ny\nx\ny\n", "@@\n-x\n-y\n+z\n*** End of File", "x\ny\nz\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			files, err := Parse("*** Begin Patch\n*** Update File: f\n" + c.patch + "\n*** End Patch")
			if err != nil {
				t.Fatal(err)
			}
			got, err := Apply(c.text, files[0].Hunks)
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("got %q, want %q", got, c.want)
			}
		})
	}
}

func TestApplyFailsWithClosestLines(t *testing.T) {
	files, err := Parse("*** Begin Patch\n*** Update File: f\n@@\n alpha\n-beta\n+BETA\n@@\n gamma\n-deltaa\n+DELTA\n*** End Patch")
	if err != nil {
		t.Fatal(err)
	}
	_, err = Apply("alpha\nbeta\ngamma\ndelta\n", files[0].Hunks)
	var he *HunkError
	if !errors.As(err, &he) {
		t.Fatalf("Apply = %v, want a *HunkError", err)
	}
	if he.Hunk != 1 || he.ClosestLine != 3 || strings.Join(he.Closest, "|") != "gamma|delta" {
		t.Errorf("got hunk %d, closest at %d: %q", he.Hunk, he.ClosestLine, he.Closest)
	}
	if !strings.Contains(he.Error(), "hunk 2") || !strings.Contains(he.Error(), "gamma") {
		t.Errorf("message %q names neither the hunk nor the closest lines", he.Error())
	}
}

// FuzzParseApply: no patch text, however malformed, makes Parse or Apply
// panic, and what Apply returns ends with a newline.
func FuzzParseApply(f *testing.F) {
	f.Add("*** Begin Patch\n*** Update File: f\n@@ x\n a\n-b\n+c\n*** End of File\n*** End Patch", "a\nb\n")
	f.Add("--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n-b\n+c\n", "a\nb\n")
	f.Add("*** Begin Patch\n*** Add File: f\n+x\n*** Delete File: g\n*** End Patch", "")
	f.Fuzz(func(t *testing.T, text, file string) {
		files, err := Parse(text)
		if err != nil {
			return
		}
		for _, fp := range files {
			out, err := Apply(file, fp.Hunks)
			if err == nil && out != "" && !strings.HasSuffix(out, "\n") {
				t.Fatalf("Apply gave %q without a final newline", out)
			}
		}
	})
}

// TestParseNamesLines: a file part and a refusal name the line as the
// model wrote the patch (blank lines and a heredoc opener counted) and
// the header of the part it is in.
func TestParseNamesLines(t *testing.T) {
	files, err := Parse("\n\n<<'EOF'\n*** Begin Patch\n*** Add File: a\n+x\n  *** Delete File: b\n*** End Patch\nEOF\n")
	if err != nil {
		t.Fatal(err)
	}
	if f := files[1]; f.Line != 7 || f.Header != "*** Delete File: b" {
		t.Errorf("delete part at line %d, header %q; want 7, %q", f.Line, f.Header, "*** Delete File: b")
	}
	// A unified diff's add is named by its "+++ " line: "--- /dev/null"
	// names no file.
	files, err = Parse("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n--- /dev/null\n+++ b/new\n@@ -0,0 +1 @@\n+n\n")
	if err != nil {
		t.Fatal(err)
	}
	if f := files[0]; f.Line != 1 || f.Header != "--- a/x" {
		t.Errorf("update part at line %d, header %q", f.Line, f.Header)
	}
	if f := files[1]; f.Line != 7 || f.Header != "+++ b/new" {
		t.Errorf("add part at line %d, header %q", f.Line, f.Header)
	}
	for _, c := range []struct {
		name, text string
		line       int
		header     string
	}{
		{"a bad hunk line", "*** Begin Patch\n*** Update File: x\n@@\n a\n?what\n*** End Patch", 5, "*** Update File: x"},
		{"after blank lines", "\n\n*** Begin Patch\n*** Update File: x\n@@\n a\n?what\n*** End Patch", 7, "*** Update File: x"},
		{"an update without hunks", "*** Begin Patch\n*** Update File: x\n*** End Patch", 2, "*** Update File: x"},
		{"a second hunk without @@", "*** Begin Patch\n*** Update File: x\n@@\n-a\n*** End of File\nb\n*** End Patch", 6, "*** Update File: x"},
		{"a bad header", "*** Begin Patch\n*** Rename File: x\n*** End Patch", 2, ""},
		{"no file", "*** Begin Patch\n*** End Patch", 2, ""},
		{"a short unified hunk", "--- a/x\n+++ b/x\n@@ -1,3 +1,3 @@\n a\n", 3, "--- a/x"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(c.text)
			var pe *Error
			if !errors.As(err, &pe) {
				t.Fatalf("Parse = %v, want a *patch.Error", err)
			}
			if pe.Line != c.line || pe.Header != c.header {
				t.Errorf("line %d, header %q; want %d, %q (%v)", pe.Line, pe.Header, c.line, c.header, err)
			}
		})
	}
}
