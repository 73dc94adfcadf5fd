package fusefs

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
)

func withSymlinks(s policy.Symlinks) envOption {
	return func(c *envConfig) { c.symlinks = s }
}

// wantBackingLink checks that the backing store holds rel as an emulated
// link: a regular file with the marker, holding target, never a symlink.
func wantBackingLink(t *testing.T, e *env, rel, target string) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(e.host(rel), &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Mode&0o7777 != policy.LinkPerm {
		t.Fatalf("backing %s has mode %o, want a regular file %o", rel, st.Mode, policy.LinkPerm)
	}
	if b, err := os.ReadFile(e.host(rel)); err != nil || string(b) != target {
		t.Fatalf("backing %s holds %q (%v), want %q", rel, b, err, target)
	}
}

// noBackingSymlink fails if anything in the backing store is a symlink.
func noBackingSymlink(t *testing.T, e *env) {
	t.Helper()
	filepath.Walk(e.backing, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode()&os.ModeSymlink != 0 {
			t.Errorf("the backing store holds a symlink: %s", strings.TrimPrefix(p, e.backing))
		}
		return nil
	})
}

// TestLinks: a program in the projection makes, reads, lists, follows,
// moves and removes symlinks as on any filesystem (SPEC §3.2), while the
// backing store only ever holds marked regular files.
func TestLinks(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	before, err := e.ws.Usage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, e.path("dir/file"), "through the link\n")

	if err := os.Symlink("dir/file", e.path("rel")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/passwd", e.path("abs")); err != nil {
		t.Fatal(err)
	}
	if out, err := runIn(t, e.mnt, "ln -s dir dirlink && cat dirlink/file && ls dirlink/"); err != nil || !strings.Contains(out, "through the link") {
		t.Fatalf("ln -s to a directory and follow it: %v\n%s", err, out)
	}

	t.Run("lstat and readlink", func(t *testing.T) {
		for rel, target := range map[string]string{"rel": "dir/file", "abs": "/etc/passwd", "dirlink": "dir"} {
			var st unix.Stat_t
			if err := unix.Lstat(e.path(rel), &st); err != nil {
				t.Fatal(err)
			}
			if st.Mode&unix.S_IFMT != unix.S_IFLNK || st.Size != int64(len(target)) {
				t.Errorf("lstat %s: mode %o size %d, want a symlink of size %d", rel, st.Mode, st.Size, len(target))
			}
			if got, err := os.Readlink(e.path(rel)); err != nil || got != target {
				t.Errorf("readlink %s = %q, %v; want %q", rel, got, err, target)
			}
			wantBackingLink(t, e, rel, target)
		}
		if b, err := os.ReadFile(e.path("rel")); err != nil || string(b) != "through the link\n" {
			t.Errorf("reading through the link: %q %v", b, err)
		}
	})
	t.Run("readdir type", func(t *testing.T) {
		// Plain READDIR (no cached entries to help): the type comes
		// from the directory itself.
		out, err := exec.Command("find", e.mnt, "-maxdepth", "1", "-type", "l", "-printf", "%f\n").CombinedOutput()
		if err != nil {
			t.Fatalf("find: %v\n%s", err, out)
		}
		if got := strings.Fields(string(out)); strings.Join(sorted(got), " ") != "abs dirlink rel" {
			t.Errorf("find -type l: %q", got)
		}
		names, err := os.ReadDir(e.mnt)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range names {
			if isLink := d.Type()&os.ModeSymlink != 0; isLink != (d.Name() != "dir") {
				t.Errorf("readdir %s: type %v", d.Name(), d.Type())
			}
		}
	})
	t.Run("exists", func(t *testing.T) {
		wantErrno(t, os.Symlink("x", e.path("rel")), syscall.EEXIST)
		wantErrno(t, os.Symlink("x", e.path("dir")), syscall.EEXIST)
	})
	t.Run("quota counts a link", func(t *testing.T) {
		u, err := e.ws.Usage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		links := int64(len("dir/file") + len("/etc/passwd") + len("dir"))
		want := policy.Usage{Files: before.Files + 5, Bytes: before.Bytes + links + int64(len("through the link\n"))}
		if u != want {
			t.Errorf("usage %+v, want %+v", u, want)
		}
		e.ws.RefreshUsage(context.Background())
		if u, _ := e.ws.Usage(ctx); u != want {
			t.Errorf("usage counted again %+v, want %+v", u, want)
		}
	})
	t.Run("touch -h and chmod through the link", func(t *testing.T) {
		if out, err := runIn(t, e.mnt, "touch -h -d 2001-01-01 rel && chmod 0700 rel"); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		wantBackingLink(t, e, "rel", "dir/file")
		var st unix.Stat_t
		unix.Lstat(e.host("dir/file"), &st)
		if st.Mode&0o777 != 0o700 {
			t.Errorf("chmod through the link gave the target mode %o", st.Mode&0o777)
		}
	})
	t.Run("rename and unlink", func(t *testing.T) {
		if out, err := runIn(t, e.mnt, "mv rel moved && mkdir -p sub && mv moved sub/moved && readlink sub/moved && mv -f sub/moved abs && rm dirlink"); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if got, err := os.Readlink(e.path("abs")); err != nil || got != "dir/file" {
			t.Errorf("readlink after renames: %q %v", got, err)
		}
		for _, gone := range []string{"rel", "sub/moved", "dirlink"} {
			if _, err := os.Lstat(e.host(gone)); !os.IsNotExist(err) {
				t.Errorf("%s still in the backing store: %v", gone, err)
			}
		}
		u, _ := e.ws.Usage(ctx)
		e.ws.RefreshUsage(context.Background())
		if again, _ := e.ws.Usage(ctx); u != again {
			t.Errorf("usage kept %+v, counted again %+v", u, again)
		}
		if len(e.sink.find("symlink", "ok", "rel")) != 1 {
			t.Errorf("the link's creation was not recorded")
		}
		noted := map[string]bool{}
		fs, err := e.ws.ReadJournal(nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fs {
			for _, c := range f.Changes {
				noted[c.Path] = true
			}
		}
		for _, rel := range []string{"rel", "abs", "dirlink", "moved", "sub/moved"} {
			if !noted[rel] {
				t.Errorf("%s is not in the change journal", rel)
			}
		}
	})
	noBackingSymlink(t, e)
}

func sorted(s []string) []string {
	out := append([]string(nil), s...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

// TestLinkQuota: a link is a file and its target's bytes in the quota.
func TestLinkQuota(t *testing.T) {
	e := newEnv(t, withLimits(func(l *policy.Limits) { l.ScopeFiles = 2 }))
	for _, name := range []string{"a", "b"} {
		if err := os.Symlink("target", e.path(name)); err != nil {
			t.Fatal(err)
		}
	}
	wantErrno(t, os.Symlink("target", e.path("c")), syscall.EDQUOT)
	if _, err := os.Lstat(e.host("c")); !os.IsNotExist(err) {
		t.Errorf("refused link left in the backing store: %v", err)
	}
}

// TestLinkMarkerNotForged: no program in the projection can mark a file
// as a link: chmod never sets the sticky bit.
func TestLinkMarkerNotForged(t *testing.T) {
	e := newEnv(t)
	mustWrite(t, e.path("f"), "/etc/shadow")
	for _, cmd := range []string{
		"chmod +t f",
		"chmod 1700 f",
		`python3 -c 'import os; os.chmod("f", 0o1700)'`,
		`python3 -c 'import os; fd = os.open("f", os.O_RDONLY); os.fchmod(fd, 0o1600)'`,
		`python3 -c 'import os; os.close(os.open("g", os.O_CREAT|os.O_WRONLY, 0o1700))'`,
		`python3 -c 'import os; os.mkdir("d", 0o1700)'`,
		"install -m 1755 f h",
	} {
		runIn(t, e.mnt, cmd) // refused or the bit cleared: either way no mark
	}
	for _, rel := range []string{"f", "g", "h"} {
		var st unix.Stat_t
		if err := unix.Lstat(e.host(rel), &st); err != nil {
			continue
		}
		if st.Mode&unix.S_ISVTX != 0 {
			t.Errorf("backing %s has the sticky bit (mode %o): a forged link", rel, st.Mode)
		}
		if err := unix.Lstat(e.path(rel), &st); err == nil && st.Mode&unix.S_IFMT != unix.S_IFREG {
			t.Errorf("%s shown with mode %o, want a regular file", rel, st.Mode)
		}
	}
}

// TestLinksRefused: with "symlinks: refuse" making a link is refused as
// before, and a link made earlier is shown but not followed, as a
// planted symlink is.
func TestLinksRefused(t *testing.T) {
	e := newEnv(t, withSymlinks(policy.SymlinksRefuse))
	wantErrno(t, os.Symlink("target", e.path("new")), syscall.EPERM)
	if len(e.sink.find("symlink", "refused", "new")) != 1 {
		t.Errorf("refusal not recorded")
	}
	mustWrite(t, e.path("file"), "x")
	plantLink(t, e, "old", "file")
	var st unix.Stat_t
	if err := unix.Lstat(e.path("old"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFLNK {
		t.Fatalf("lstat old: %o %v", st.Mode, err)
	}
	_, err := os.Readlink(e.path("old"))
	wantErrno(t, err, syscall.EPERM)
	_, err = os.ReadFile(e.path("old"))
	wantErrno(t, err, syscall.EPERM)
	if err := os.Remove(e.path("old")); err != nil {
		t.Errorf("removing a link: %v", err)
	}
}

// plantLink makes an emulated link the way the store makes one, as a
// link made before the policy changed.
func plantLink(t *testing.T, e *env, rel, target string) {
	t.Helper()
	mustWrite(t, e.host(rel), target)
	if err := os.Chmod(e.host(rel), os.ModeSticky|0o600); err != nil {
		t.Fatal(err)
	}
}

// TestLinksNotFollowed: a mount with NoFollowLinks (a host-side mount)
// shows links and makes them, but follows none.
func TestLinksNotFollowed(t *testing.T) {
	e := newEnv(t, withOptions(func(o *Options) { o.NoFollowLinks = true }))
	if err := os.Symlink("/etc/passwd", e.path("abs")); err != nil {
		t.Fatal(err)
	}
	wantBackingLink(t, e, "abs", "/etc/passwd")
	_, err := os.Readlink(e.path("abs"))
	wantErrno(t, err, syscall.EPERM)
	_, err = os.ReadFile(e.path("abs"))
	wantErrno(t, err, syscall.EPERM)
}

// TestPlantedLinks: what someone else marked on the host is taken for a
// link only when loomfs could have made it; a real symlink stays refused.
func TestPlantedLinks(t *testing.T) {
	e := newEnv(t)
	plantLink(t, e, "ok", "somewhere")
	plantLink(t, e, "nul", "a\x00b")
	plantLink(t, e, "big", strings.Repeat("x", policy.MaxLinkTarget+1))
	plantLink(t, e, "h1", "target")
	if err := os.Link(e.host("h1"), e.host("h2")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/passwd", e.host("real")); err != nil {
		t.Fatal(err)
	}
	if got, err := os.Readlink(e.path("ok")); err != nil || got != "somewhere" {
		t.Errorf("readlink of a marked file: %q %v", got, err)
	}
	for _, rel := range []string{"nul", "big", "h1", "real"} {
		_, err := os.Readlink(e.path(rel))
		wantErrno(t, err, syscall.EPERM)
	}
}

// TestVenv: "python3 -m venv" works in the mount. Its python is a link to
// the interpreter by absolute path: followed on the host, through a host
// mount, it is the host's own interpreter (the README says so).
func TestVenv(t *testing.T) {
	e := newEnv(t)
	out, err := runIn(t, e.mnt, "python3 -m venv --without-pip venv && venv/bin/python -c 'import sys; print(sys.prefix)'")
	if err != nil {
		t.Fatalf("venv: %v\n%s", err, out)
	}
	if !strings.Contains(out, filepath.Join(e.mnt, "venv")) {
		t.Errorf("the venv's python runs outside its venv: %s", out)
	}
	target, err := os.Readlink(e.path("venv/bin/python"))
	if err != nil || !strings.HasPrefix(target, "/") && !strings.HasPrefix(target, "python") {
		t.Errorf("venv/bin/python -> %q %v", target, err)
	}
	t.Logf("venv/bin/python -> %s, resolved by the host here", target)
	noBackingSymlink(t, e)
}

// TestLinksInArchivesAndCopies: tar -x, Python's tarfile and cp -a of a
// tree holding links give the same tree in the mount as in a plain
// directory: each link a link, with its target.
func TestLinksInArchivesAndCopies(t *testing.T) {
	e := newEnv(t)
	src := filepath.Join(t.TempDir(), "src")
	mustWrite(t, filepath.Join(src, "dir/file"), "x")
	for link, target := range map[string]string{"to-file": "dir/file", "to-dir": "dir", "dangling": "nowhere", "abs": "/etc/hostname", "dir/up": "../to-file"} {
		if err := os.Symlink(target, filepath.Join(src, link)); err != nil {
			t.Fatal(err)
		}
	}
	archive := filepath.Join(t.TempDir(), "tree.tar")
	if out, err := exec.Command("tar", "-cf", archive, "-C", src, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar -c: %v\n%s", err, out)
	}
	// What find says of a tree: type, path and link target.
	tree := func(dir string) string {
		out, err := exec.Command("find", dir, "-mindepth", "1", "-printf", "%y %P %l\n").CombinedOutput()
		if err != nil {
			t.Fatalf("find: %v\n%s", err, out)
		}
		return strings.Join(sorted(strings.Split(strings.TrimSpace(string(out)), "\n")), "\n")
	}
	want := tree(src)
	for name, script := range map[string]string{
		"tar":     `mkdir t && tar --no-same-owner -xf "$0" -C t`,
		"tarfile": `mkdir t && python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall("t", filter="tar")' "$0"`,
		"cp -a":   `cp -a --no-preserve=ownership "$1" t`,
		"unzip":   `(cd "$1" && zip -qry "$0.zip" .) && unzip -q "$0.zip" -d t`,
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := exec.LookPath("zip"); err != nil && name == "unzip" {
				t.Skip("zip is not installed on this host")
			}
			cmd := exec.Command("sh", "-c", `cd "$2" && rm -rf t && `+script, archive, src, e.mnt)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			if got := tree(e.path("t")); got != want {
				t.Errorf("tree in the mount:\n%s\nwant:\n%s", got, want)
			}
		})
	}
	noBackingSymlink(t, e)
}

// TestLinksUnderPathRules: a link's target is what it holds, so it is read
// under the path's mode: not in a write-only subtree, where a link can
// still be made; in a read-only one it is read but never made.
func TestLinksUnderPathRules(t *testing.T) {
	e := newEnv(t, withRules(testRules...))
	plantRuleDirs(t, e)
	plantLink(t, e, "data/link", "file")
	if b, err := os.ReadFile(e.path("data/link")); err != nil || string(b) != "data content\n" {
		t.Errorf("following a link in data/: %q %v", b, err)
	}
	wantErrno(t, os.Symlink("file", e.path("data/new")), syscall.EROFS)
	if err := os.Symlink("file", e.path("output/link")); err != nil {
		t.Fatalf("a link in output/: %v", err)
	}
	_, err := os.Readlink(e.path("output/link"))
	wantErrno(t, err, syscall.EACCES)
	wantErrno(t, os.Symlink("x", e.path(".meta/link")), syscall.ENOENT)
}

// TestLinksGitAndNpm: git checks links out as links with a clean status,
// and npm links a package's bin into node_modules/.bin, in the mount.
func TestLinksGitAndNpm(t *testing.T) {
	if _, err := exec.LookPath("npm"); err != nil {
		// scripts/setup installs no Node.js on the host; the sandbox
		// image tests run npm in a container.
		t.Skip("npm is not installed on this host")
	}
	e := newEnv(t)
	repo := filepath.Join(t.TempDir(), "repo")
	pkg := filepath.Join(t.TempDir(), "pkg")
	mustWrite(t, filepath.Join(repo, "dir/file"), "x\n")
	mustWrite(t, filepath.Join(pkg, "package.json"), `{"name": "hello", "version": "1.0.0", "bin": {"hello": "hello.js"}}`)
	mustWrite(t, filepath.Join(pkg, "hello.js"), "#!/usr/bin/env node\nconsole.log('hello from bin')\n")
	for _, c := range []struct{ name, dir, script string }{
		{"git", repo, `git init -q && ln -s dir/file link && git add -A && git -c user.email=t@t -c user.name=t commit -qm init`},
		{"npm pack", pkg, `npm pack --silent >/dev/null`},
	} {
		cmd := exec.Command("sh", "-c", c.script)
		cmd.Dir = c.dir
		cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", c.name, err, out)
		}
	}
	t.Run("git clone", func(t *testing.T) {
		script := `git clone -q "$0" clone && cd clone && git -c safe.directory='*' status --porcelain && readlink link && cat link`
		out, err := runIn(t, e.mnt, strings.ReplaceAll(script, `"$0"`, repo))
		if err != nil || out != "dir/file\nx\n" {
			t.Errorf("clone: %v\n%q", err, out)
		}
	})
	t.Run("npm install", func(t *testing.T) {
		// cd in the shell, not cmd.Dir: nothing of the mount is touched
		// between this process's fork and the child's exec (see
		// TestToolDoorKeepsMode).
		cmd := exec.Command("sh", "-c", `cd "$1" && mkdir app && cd app && echo '{}' > package.json && npm install --silent --no-audit --no-fund --offline "$0"/hello-1.0.0.tgz && readlink node_modules/.bin/hello`, pkg, e.mnt)
		cmd.Env = append(os.Environ(), "HOME="+t.TempDir(), "npm_config_cache="+t.TempDir())
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "../hello/hello.js") {
			t.Fatalf("npm install: %v\n%s", err, out)
		}
	})
	noBackingSymlink(t, e)
}
