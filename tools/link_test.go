package tools

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
)

// TestEmulatedLinks: the tools list and stat an emulated link with its
// target and never follow it (SPEC §3.2); delete removes the link itself.
func TestEmulatedLinks(t *testing.T) {
	tb, dir := newBox(t, nil)
	mustCall(t, tb, Write, map[string]any{"path": "secret.txt", "content": "CANARY\n"})
	if _, err := tb.WS.Symlink(context.Background(), "lnk", "secret.txt"); err != nil {
		t.Fatal(err)
	}

	l := mustCall(t, tb, List, map[string]any{"path": "."})
	var found map[string]any
	for _, e := range l["entries"].([]any) {
		if m := e.(map[string]any); m["name"] == "lnk" {
			found = m
		}
	}
	if found == nil || found["type"] != "symlink" || found["target"] != "secret.txt" || found["refused"] != nil {
		t.Fatalf("list shows the link as %v", found)
	}
	s := mustCall(t, tb, Stat, map[string]any{"path": "lnk"})
	if s["type"] != "symlink" || s["target"] != "secret.txt" || s["mode"] != "0777" || s["size"] != float64(len("secret.txt")) || s["sha256"] != nil {
		t.Fatalf("stat: %v", s)
	}

	mustCall(t, tb, Mkdir, map[string]any{"path": "d"})
	if _, err := tb.WS.Symlink(context.Background(), "dirlink", "d"); err != nil {
		t.Fatal(err)
	}
	for _, op := range []struct {
		tool string
		in   map[string]any
	}{
		{Read, map[string]any{"path": "lnk"}},
		{Write, map[string]any{"path": "dirlink/new", "content": "x"}},
		{Read, map[string]any{"path": "dirlink/new"}},
		{Write, map[string]any{"path": "lnk", "content": "x"}},
		{Edit, map[string]any{"path": "lnk", "old_text": "CANARY", "new_text": "x"}},
		{Grep, map[string]any{"pattern": "CANARY", "path": "lnk"}},
		{List, map[string]any{"path": "lnk"}},
	} {
		_, err := call(t, tb, op.tool, op.in)
		if op.tool == List {
			wantCode(t, err, policy.NotDir)
			continue
		}
		wantCode(t, err, policy.SymlinkRefused)
	}
	g := mustCall(t, tb, Grep, map[string]any{"pattern": "CANARY|secret"})
	if len(g["matches"].([]any)) != 1 || g["skipped_refused"] != float64(2) {
		t.Fatalf("grep: %v", g)
	}
	gl := mustCall(t, tb, Glob, map[string]any{"pattern": "*"})
	if gl["total"] != float64(4) {
		t.Fatalf("glob lists %v, want the file and the link", gl["matches"])
	}

	mustCall(t, tb, Delete, map[string]any{"path": "lnk"})
	if _, err := os.Lstat(filepath.Join(dir, "lnk")); !os.IsNotExist(err) {
		t.Fatalf("link still there: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "secret.txt")); string(b) != "CANARY\n" {
		t.Fatalf("the target changed: %q", b)
	}
}

// TestLinkMarkerNotForgedByTools: no tool makes a file carrying the link
// marker, whatever mode the file it replaces had.
func TestLinkMarkerNotForgedByTools(t *testing.T) {
	tb, dir := newBox(t, nil)
	mustCall(t, tb, Write, map[string]any{"path": "f", "content": "/etc/passwd"})
	mustCall(t, tb, Write, map[string]any{"path": "f", "content": "/etc/shadow"})
	mustCall(t, tb, Edit, map[string]any{"path": "f", "old_text": "shadow", "new_text": "passwd"})
	mustCall(t, tb, Mkdir, map[string]any{"path": "d"})
	for _, rel := range []string{"f", "d"} {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(dir, rel), &st); err != nil {
			t.Fatal(err)
		}
		if st.Mode&policy.LinkMarker != 0 {
			t.Errorf("%s has the link marker: mode %o", rel, st.Mode)
		}
	}
	if s := mustCall(t, tb, Stat, map[string]any{"path": "f"}); s["type"] != "file" {
		t.Errorf("stat f: %v", s)
	}
}

// TestLinkTargetUnderWriteOnly: in a write-only subtree a link is listed,
// but its target, what it holds, is not shown.
func TestLinkTargetUnderWriteOnly(t *testing.T) {
	pol := policy.Default()
	if err := pol.SetRules([]policy.Rule{{Prefix: "out", Mode: policy.ModeWO}}); err != nil {
		t.Fatal(err)
	}
	tb, _ := newBox(t, pol)
	mustCall(t, tb, Mkdir, map[string]any{"path": "out"})
	if _, err := tb.WS.Symlink(context.Background(), "out/l", "secret"); err != nil {
		t.Fatal(err)
	}
	s := mustCall(t, tb, Stat, map[string]any{"path": "out/l"})
	if s["type"] != "symlink" || s["target"] != nil {
		t.Fatalf("stat in a write-only subtree: %v", s)
	}
}

// TestLinkDeleteConfirmed: deleting a link where the policy asks for
// confirmation takes the two steps, as deleting a file does.
func TestLinkDeleteConfirmed(t *testing.T) {
	pol := policy.Default()
	if err := pol.SetSubtrees([]policy.Subtree{{Prefix: "out", Confirm: []policy.Op{policy.OpDelete}}}); err != nil {
		t.Fatal(err)
	}
	tb, dir := newBox(t, pol)
	mustCall(t, tb, Mkdir, map[string]any{"path": "out"})
	if _, err := tb.WS.Symlink(context.Background(), "out/l", "x"); err != nil {
		t.Fatal(err)
	}
	_, err := call(t, tb, Delete, map[string]any{"path": "out/l"})
	pe := wantCode(t, err, policy.ConfirmationRequired)
	if _, err := os.Lstat(filepath.Join(dir, "out/l")); err != nil {
		t.Fatalf("the link went before confirmation: %v", err)
	}
	mustCall(t, tb, Delete, map[string]any{"path": "out/l", "confirm_token": pe.Token})
	if _, err := os.Lstat(filepath.Join(dir, "out/l")); !os.IsNotExist(err) {
		t.Fatalf("the link is still there: %v", err)
	}
}
