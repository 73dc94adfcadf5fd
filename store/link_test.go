package store_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// TestSymlink: an emulated link is a marked regular file holding its
// target, made whole under its name or not at all, counted and journalled
// (SPEC §3.2); the store never makes a symlink.
func TestSymlink(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	ws := e.open(t, mainScope, nil)
	dir := e.dir(mainScope)
	before, err := ws.Usage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ws.Symlink(ctx, "l", "/etc/passwd"); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(dir, "l"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Mode&0o7777 != policy.LinkPerm || st.Nlink != 1 {
		t.Fatalf("backing object mode %o nlink %d, want a regular file %o", st.Mode, st.Nlink, policy.LinkPerm)
	}
	if got, info, err := ws.ReadLink("l"); err != nil || got != "/etc/passwd" || info.Kind != policy.KindLink {
		t.Fatalf("ReadLink = %q %v %v", got, info.Kind, err)
	}
	if u, _ := ws.Usage(ctx); u.Files != before.Files+1 || u.Bytes != before.Bytes+int64(len("/etc/passwd")) {
		t.Errorf("usage %+v after a link, before %+v", u, before)
	}
	fs, err := ws.ReadJournal(nil)
	if err != nil || len(fs) != 1 || !slices.Contains(journalPaths(fs[0].Changes), store.JournalChange{Path: "l"}) {
		t.Errorf("the link is not in the change journal: %+v %v", fs, err)
	}

	for _, c := range []struct {
		name, rel, target string
		code              policy.Code
	}{
		{"name taken", "l", "x", policy.Exists},
		{"empty target", "e", "", policy.NotFound},
		{"NUL in the target", "n", "a\x00b", policy.InvalidInput},
		{"target over PATH_MAX", "big", strings.Repeat("x", policy.MaxLinkTarget+1), policy.InvalidInput},
		{"reserved name", ".agentloom-x", "x", policy.InvalidPath},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ws.Symlink(ctx, c.rel, c.target)
			if policy.CodeOf(err) != c.code {
				t.Fatalf("Symlink(%q): %v, want %s", c.rel, err, c.code)
			}
		})
	}
	if _, err := ws.Symlink(ctx, "max", strings.Repeat("x", policy.MaxLinkTarget)); err != nil {
		t.Errorf("a target of PATH_MAX-1 bytes: %v", err)
	}
	names, _ := os.ReadDir(dir)
	for _, d := range names {
		if strings.HasPrefix(d.Name(), policy.InternalPrefix) || d.Type()&os.ModeSymlink != 0 {
			t.Errorf("left in the scope: %s (%v)", d.Name(), d.Type())
		}
	}
}

// TestReadLinkRefuses: only what loomfs could have made reads as a link.
func TestReadLinkRefuses(t *testing.T) {
	e := newEnv(t)
	ws := e.open(t, mainScope, nil)
	dir := e.dir(mainScope)
	mark := func(rel, content string) {
		mkfile(t, filepath.Join(dir, rel), content)
		if err := os.Chmod(filepath.Join(dir, rel), os.ModeSticky|0o600); err != nil {
			t.Fatal(err)
		}
	}
	mark("nul", "a\x00b")
	mark("empty", "")
	mark("h1", "x")
	hardlink(t, filepath.Join(dir, "h1"), filepath.Join(dir, "h2"))
	symlink(t, "/etc/passwd", filepath.Join(dir, "real"))
	mkfile(t, filepath.Join(dir, "plain"), "x")
	for rel, code := range map[string]policy.Code{
		"nul":   policy.SpecialFileRefused,
		"empty": policy.SpecialFileRefused,
		"h1":    policy.HardlinkRefused,
		"real":  policy.SymlinkRefused,
		"plain": policy.InvalidInput,
	} {
		if _, _, err := ws.ReadLink(rel); policy.CodeOf(err) != code {
			t.Errorf("ReadLink(%s): %v, want %s", rel, err, code)
		}
	}
}

// TestSymlinkRefusedByPolicy: "symlinks: refuse" refuses making links.
func TestSymlinkRefusedByPolicy(t *testing.T) {
	e := newEnv(t)
	pol := policy.Default()
	pol.Symlinks = policy.SymlinksRefuse
	ws := e.open(t, mainScope, pol)
	if _, err := ws.Symlink(context.Background(), "l", "x"); policy.CodeOf(err) != policy.SymlinkRefused {
		t.Fatalf("Symlink: %v, want symlink_refused", err)
	}
}
