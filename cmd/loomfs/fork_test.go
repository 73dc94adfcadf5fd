package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

// TestForkMerge runs loomfs fork and merge as a platform would: a child
// forked from main, changed, and merged back; the exit codes are 0 done,
// 1 refused or held back by a conflict (the result printed all the same)
// and 2 a usage error.
func TestForkMerge(t *testing.T) {
	root := filepath.Join(t.TempDir(), "root")
	g := []string{"--root", root, "--json"}
	loomfs := func(args ...string) (string, string, int) {
		t.Helper()
		return runLoomfs(t, append(g, args...)...)
	}
	write := func(scope, path, content string) {
		t.Helper()
		in, _ := json.Marshal(map[string]string{"path": path, "content": content})
		if out, errOut, code := loomfs("tool", "workspace_write", "--scope", scope, "--input", string(in)); code != exitOK {
			t.Fatalf("write %s in %s: exit %d: %s %s", path, scope, code, out, errOut)
		}
	}
	write("a/b/c", "src/a.go", "package a\n")
	write("a/b/c", "src/b.go", "package b\n")

	steps := []struct {
		name string
		args []string
		do   func()
		code int
		want string
	}{
		{name: "fork needs --to", args: []string{"fork", "--from", "a/b/c"}, code: exitUsage, want: "--to"},
		{name: "fork into a child", args: []string{"fork", "--from", "a/b/c", "--to", "a/b/c/r1/sub"}, code: exitOK, want: `"files":2`},
		{name: "a second fork onto it is refused", args: []string{"fork", "--from", "a/b/c", "--to", "a/b/c/r1/sub"}, code: exitRefused, want: "already holds files"},
		{
			name: "a dry run lists the conflict and changes nothing",
			do: func() {
				write("a/b/c/r1/sub", "src/a.go", "package a // sub\n")
				write("a/b/c/r1/sub", "src/b.go", "package b // sub\n")
				write("a/b/c", "src/b.go", "package b // main\n")
			},
			args: []string{"merge", "--from", "a/b/c/r1/sub", "--into", "a/b/c", "--dry-run"},
			code: exitOK, want: `"type":"both_modified"`,
		},
		{name: "the conflict holds the merge back", args: []string{"merge", "--from", "a/b/c/r1/sub", "--into", "a/b/c"}, code: exitRefused, want: `"merged":false`},
		{name: "partial merges the rest", args: []string{"merge", "--from", "a/b/c/r1/sub", "--into", "a/b/c", "--partial"}, code: exitRefused, want: `"merged":true`},
		{name: "merge needs --into", args: []string{"merge", "--from", "a/b/c/r1/sub"}, code: exitUsage, want: "--into"},
	}
	for _, s := range steps {
		if s.do != nil {
			s.do()
		}
		out, errOut, code := loomfs(s.args...)
		if code != s.code || !strings.Contains(out+errOut, s.want) {
			t.Fatalf("%s: exit %d, stdout %q, stderr %q; want exit %d with %q", s.name, code, out, errOut, s.code, s.want)
		}
	}
	out, _, _ := loomfs("tool", "workspace_read", "--scope", "a/b/c", "--input", `{"path":"src/a.go"}`)
	if !strings.Contains(out, "package a // sub") {
		t.Fatalf("main's src/a.go after the partial merge: %s", out)
	}
	out, _, _ = loomfs("tool", "workspace_read", "--scope", "a/b/c", "--input", `{"path":"src/b.go"}`)
	if !strings.Contains(out, "package b // main") {
		t.Fatalf("main's src/b.go after the partial merge: %s", out)
	}
	// Both scopes' audit shows the merge.
	for _, scope := range []string{"a/b/c", "a/b/c/r1/sub"} {
		out, errOut, code := loomfs("audit", "query", "--scope", scope)
		if code != exitOK || !strings.Contains(out, "merge") {
			t.Errorf("audit of %s: exit %d, %s %s: want the merge", scope, code, out, errOut)
		}
	}
}

// TestRunsCreateChild: "runs create --child" starts a child instance from
// main's files, a retry lists it as existing, and a child holding files of
// its own is refused.
func TestRunsCreateChild(t *testing.T) {
	root := filepath.Join(t.TempDir(), "root")
	loomfs := func(args ...string) (string, string, int) {
		t.Helper()
		return runLoomfs(t, append([]string{"--root", root, "--json"}, args...)...)
	}
	in, _ := json.Marshal(map[string]string{"path": "src/a.go", "content": "package a\n"})
	if out, errOut, code := loomfs("tool", "workspace_write", "--scope", "a/b/c", "--input", string(in)); code != exitOK {
		t.Fatalf("write in main: exit %d: %s %s", code, out, errOut)
	}
	create := []string{"runs", "create", "--scope", "a/b/c", "--run", "r1", "--user", "u", "--child", "sub-1"}
	steps := []struct {
		name string
		args []string
		code int
		want string
	}{
		{name: "a bad instance id is a usage error", args: []string{"runs", "create", "--scope", "a/b/c", "--run", "r1", "--user", "u", "--child", "../x"}, code: exitUsage, want: "instance"},
		{name: "the child starts from main's files", args: create, code: exitOK, want: `"files": 1`},
		{name: "a retry lists the child as existing", args: create, code: exitOK, want: `"existing": true`},
		{name: "the child holds main's file", args: []string{"tool", "workspace_read", "--scope", "run:r1/sub-1", "--input", `{"path":"src/a.go"}`}, code: exitOK, want: "package a"},
	}
	for _, s := range steps {
		out, errOut, code := loomfs(s.args...)
		if code != s.code || !strings.Contains(out+errOut, s.want) {
			t.Fatalf("%s: exit %d, stdout %q, stderr %q; want exit %d with %q", s.name, code, out, errOut, s.code, s.want)
		}
	}
	// A child that already holds files of its own is never overwritten.
	in, _ = json.Marshal(map[string]string{"path": "notes.txt", "content": "mine"})
	if out, errOut, code := loomfs("tool", "workspace_write", "--scope", "a/b/c/r2/sub-1", "--input", string(in)); code != exitOK {
		t.Fatalf("write in the child: exit %d: %s %s", code, out, errOut)
	}
	out, errOut, code := loomfs("runs", "create", "--scope", "a/b/c", "--run", "r2", "--user", "u", "--child", "sub-1")
	if code != exitRefused || !strings.Contains(out+errOut, "already holds files") {
		t.Fatalf("a child holding files: exit %d, %s %s; want refused", code, out, errOut)
	}
}
