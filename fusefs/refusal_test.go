package fusefs

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// The rule set the issue names: data read-only, output write-only, .meta
// hidden.
var testRules = []policy.Rule{{Prefix: "data", Mode: policy.ModeRO}, {Prefix: "output", Mode: policy.ModeWO}, {Prefix: ".meta", Mode: policy.ModeHidden}}

const (
	testFileLimit  = 1 << 20 // per file through the filesystem
	testScopeLimit = 3 << 20 // the whole scope
)

func testLimits(l *policy.Limits) {
	l.FileBytes = testFileLimit
	l.ScopeBytes = testScopeLimit
}

// plantRuleDirs lays out the rule directories on the backing store, as an
// administrator would, with a file in each.
func plantRuleDirs(t *testing.T, e *env) {
	t.Helper()
	for _, d := range []string{"data", "output", ".meta"} {
		mustWrite(t, e.host(d+"/file"), d+" content\n")
	}
}

// refusalCase is one refusal made the way a program makes it: a shell
// command run inside the mount, whose stderr must carry the errno's text.
type refusalCase struct {
	name  string
	rules []policy.Rule // instead of testRules
	setup func(t *testing.T, e *env)
	cmd   string // run by sh in the mount
	want  syscall.Errno
	// audited: the daemon sees the call and must record the refusal.
	audited bool
	// linksRefused: a refusal only with "symlinks: refuse"; emulated
	// links are made (TestLinks).
	linksRefused bool
}

var refusalCases = []refusalCase{
	{name: "symlink/ln -s", cmd: "ln -s target link", want: syscall.EPERM, audited: true, linksRefused: true},
	{name: "symlink/to outside", cmd: "ln -s /etc/passwd link", want: syscall.EPERM, audited: true, linksRefused: true},
	{name: "symlink/write through an emulated link", setup: plantEmulatedLink("link", "f"), cmd: "echo x > link", want: syscall.EPERM, audited: true, linksRefused: true},
	{name: "hardlink/ln", setup: writeFile("f", "x"), cmd: "ln f hard", want: syscall.EXDEV, audited: true},
	{name: "fifo/mkfifo", cmd: "mkfifo fifo", want: syscall.EPERM, audited: true},
	{name: "device/mknod char", cmd: "mknod null c 1 3", want: syscall.EPERM, audited: true},
	{name: "device/mknod block", cmd: "mknod blk b 7 0", want: syscall.EPERM, audited: true},
	{name: "socket/bind", cmd: `/usr/bin/python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind("sock")'`, want: syscall.EPERM, audited: true},

	{name: "size/dd past the file limit", cmd: "dd if=/dev/zero of=big bs=64K count=17", want: syscall.EFBIG, audited: true},
	{name: "size/python write past the file limit", cmd: `/usr/bin/python3 -c '
import os
fd = os.open("big", os.O_WRONLY|os.O_CREAT, 0o600)
assert os.write(fd, b"x"*(1<<20)) == 1<<20
os.write(fd, b"y")'`, want: syscall.EFBIG, audited: true},
	{name: "size/truncate -s", setup: writeFile("f", "x"), cmd: "truncate -s 2M f", want: syscall.EFBIG, audited: true},
	{name: "size/truncate -s new file", cmd: "truncate -s 1025K new", want: syscall.EFBIG, audited: true},
	{name: "size/fallocate -l", cmd: "fallocate -l 2M f", want: syscall.EFBIG, audited: true},
	{name: "size/write far past the end (sparse)", cmd: "dd if=/dev/zero of=sparse bs=1 count=1 seek=2M", want: syscall.EFBIG, audited: true},
	{name: "size/copy_file_range", setup: writeFile("src", strings.Repeat("x", 600<<10)),
		cmd: `/usr/bin/python3 -c '
import os
s = os.open("src", os.O_RDONLY); d = os.open("dst", os.O_WRONLY|os.O_CREAT, 0o600)
os.copy_file_range(s, d, 600<<10, 0, 0)
os.copy_file_range(s, d, 600<<10, 0, 600<<10)'`, want: syscall.EFBIG, audited: true},
	{name: "quota/dd into many files", cmd: "for i in 1 2 3 4; do dd if=/dev/zero of=f$i bs=1M count=1 status=none || exit 1; done", want: syscall.EDQUOT, audited: true},
	{name: "quota/sparse files count in full", cmd: "for i in 1 2 3 4; do truncate -s 1M s$i || exit 1; done", want: syscall.EDQUOT, audited: true},
	{name: "quota/fallocate", cmd: "for i in 1 2 3 4; do fallocate -l 1M a$i || exit 1; done", want: syscall.EDQUOT, audited: true},

	{name: "xattr/security namespace", setup: writeFile("f", "x"), cmd: "setfattr -n security.x -v 1 f", want: syscall.EOPNOTSUPP},
	{name: "xattr/user namespace when off", setup: writeFile("f", "x"), cmd: "setfattr -n user.x -v 1 f", want: syscall.EOPNOTSUPP},
	{name: "chmod/u+s", setup: writeFile("f", "x"), cmd: "chmod u+s f", want: policy.Errno(policy.CheckChmod("f", 0o4600)), audited: true},
	{name: "chmod/g+s on a directory", cmd: "mkdir d && chmod g+s d", want: policy.Errno(policy.CheckChmod("d", 0o2700)), audited: true},
	{name: "chmod/+t", cmd: "mkdir d && chmod +t d", want: policy.Errno(policy.CheckChmod("d", 0o1700)), audited: true},
	{name: "chown", setup: writeFile("f", "x"), cmd: "chown 0:0 f", want: syscall.EPERM, audited: true},

	{name: "rule ro/create", setup: plantRuleDirs, cmd: "touch data/new", want: syscall.EROFS, audited: true},
	{name: "rule ro/overwrite", setup: plantRuleDirs, cmd: "echo x > data/file", want: syscall.EROFS, audited: true},
	{name: "rule ro/truncate", setup: plantRuleDirs, cmd: "truncate -s 0 data/file", want: syscall.EROFS, audited: true},
	{name: "rule ro/delete", setup: plantRuleDirs, cmd: "rm data/file", want: syscall.EROFS, audited: true},
	{name: "rule ro/chmod", setup: plantRuleDirs, cmd: "chmod 0644 data/file", want: syscall.EROFS, audited: true},
	{name: "rule ro/rename out", setup: plantRuleDirs, cmd: "mv data/file stolen", want: syscall.EROFS, audited: true},
	{name: "rule ro/rename the directory", setup: plantRuleDirs, cmd: "mv data elsewhere", want: syscall.EROFS, audited: true},
	{name: "rule wo/read back", setup: plantRuleDirs, cmd: "cat output/file", want: syscall.EACCES, audited: true},
	{name: "rule wo/open read-write", setup: plantRuleDirs, cmd: `/usr/bin/python3 -c 'open("output/file","r+b")'`, want: syscall.EACCES, audited: true},
	{name: "rule wo/move out to read", setup: plantRuleDirs, cmd: "mv output/file taken", want: syscall.EACCES, audited: true},
	{name: "rule beneath/move its parent", rules: []policy.Rule{{Prefix: "proj/secret", Mode: policy.ModeHidden}},
		setup: writeFile("proj/secret/key", "x"), cmd: "mv proj elsewhere", want: syscall.EACCES, audited: true},
	{name: "rule beneath/move a parent of a write-only dir", rules: []policy.Rule{{Prefix: "proj/out", Mode: policy.ModeWO}},
		setup: writeFile("proj/out/result", "x"), cmd: "mv proj elsewhere", want: syscall.EACCES, audited: true},
	{name: "rule hidden/list", setup: plantRuleDirs, cmd: "ls .meta", want: syscall.ENOENT, audited: true},
	{name: "rule hidden/read", setup: plantRuleDirs, cmd: "cat .meta/file", want: syscall.ENOENT, audited: true},
	{name: "rule hidden/create", setup: plantRuleDirs, cmd: "touch .meta/new", want: syscall.ENOENT, audited: true},

	{name: "name/subagents at the top", cmd: "mkdir subagents", want: syscall.EPERM, audited: true},
	{name: "name/subagents by rename", cmd: `mkdir d && /usr/bin/python3 -c 'import os; os.rename("d", "subagents")'`, want: syscall.EPERM, audited: true},
	{name: "name/loomfs internal", cmd: "touch .agentloom-tmp-x", want: syscall.EPERM, audited: true},
	{name: "name/backslash", cmd: `touch 'a\b'`, want: syscall.EPERM, audited: true},
	{name: "name/control character", cmd: `touch "$(printf 'a\tb')"`, want: syscall.EPERM, audited: true},
	// Answered at lookup, like any name that is not there: no record.
	{name: "name/over 255 bytes", cmd: "touch " + strings.Repeat("n", 256), want: syscall.ENAMETOOLONG},

	{name: "planted/read a symlink to outside", setup: plant("link", func(p string) error { return os.Symlink("/etc/passwd", p) }), cmd: "cat link", want: syscall.EPERM, audited: true},
	{name: "planted/readlink", setup: plant("link", func(p string) error { return os.Symlink("/etc/passwd", p) }), cmd: "readlink -v link", want: syscall.EPERM, audited: true},
	{name: "planted/through a symlinked directory", setup: plant("dir", func(p string) error { return os.Symlink("/etc", p) }), cmd: "cat dir/passwd", want: syscall.EPERM, audited: true},
	{name: "planted/remove a symlink", setup: plant("link", func(p string) error { return os.Symlink("/etc/passwd", p) }), cmd: "rm link", want: syscall.EPERM, audited: true},
	{name: "planted/read a hardlinked file", setup: plantHardlink, cmd: "cat h1", want: syscall.EPERM, audited: true},
	{name: "planted/write a hardlinked file", setup: plantHardlink, cmd: "echo x >> h1", want: syscall.EPERM, audited: true},
	{name: "planted/truncate a hardlinked file", setup: plantHardlink, cmd: "truncate -s 0 h1", want: syscall.EPERM, audited: true},
	{name: "planted/chmod a fifo", setup: plant("fifo", func(p string) error { return unix.Mkfifo(p, 0o600) }), cmd: "chmod 0600 fifo", want: syscall.EPERM, audited: true},

	{name: "journal/can't be written", setup: breakJournal, cmd: "echo x > f", want: syscall.EIO, audited: true},
}

// breakJournal puts a file where the scope's change journals go, so none
// can be opened.
func breakJournal(t *testing.T, e *env) {
	p := filepath.Join(e.vol.Path(), store.LocksDir, e.ws.Scope().Hash(), store.JournalDir)
	// The mount made the directory, to follow the journals; it must not
	// make it again meanwhile.
	if e.m.follower != nil {
		e.m.follower.close()
	}
	if err := os.RemoveAll(p); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
}

func writeFile(rel, content string) func(*testing.T, *env) {
	return func(t *testing.T, e *env) { mustWrite(t, e.host(rel), content) }
}

func plant(rel string, fn func(string) error) func(*testing.T, *env) {
	return func(t *testing.T, e *env) {
		if err := fn(e.host(rel)); err != nil {
			t.Fatal(err)
		}
	}
}

func plantHardlink(t *testing.T, e *env) {
	mustWrite(t, e.host("h1"), "shared\n")
	if err := os.Link(e.host("h1"), e.host("h2")); err != nil {
		t.Fatal(err)
	}
}

// runIn runs a shell command inside the mount and returns its stderr and
// error.
func runIn(t *testing.T, dir, script string) (string, error) {
	t.Helper()
	cmd := exec.Command("sh", "-c", `cd "$1" || exit 99; shift; `+script, "sh", dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.Stdout = &stderr
	err := cmd.Run()
	return stderr.String(), err
}

func plantEmulatedLink(rel, target string) func(*testing.T, *env) {
	return func(t *testing.T, e *env) { plantLink(t, e, rel, target) }
}

// TestRefusals makes each refusal the way a program would and checks the
// errno it gets and the audit record the daemon left, with emulated links
// and with links refused.
func TestRefusals(t *testing.T) {
	for _, links := range []policy.Symlinks{policy.SymlinksEmulate, policy.SymlinksRefuse} {
		t.Run(string(links), func(t *testing.T) { testRefusals(t, links) })
	}
}

func testRefusals(t *testing.T, links policy.Symlinks) {
	for _, c := range refusalCases {
		if c.linksRefused && links != policy.SymlinksRefuse {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			rules := testRules
			if c.rules != nil {
				rules = c.rules
			}
			e := newEnv(t, withRules(rules...), withLimits(testLimits), withSymlinks(links))
			if c.setup != nil {
				c.setup(t, e)
			}
			out, err := runIn(t, e.mnt, c.cmd)
			if err == nil {
				t.Fatalf("%q succeeded, want %v; output:\n%s", c.cmd, c.want, out)
			}
			if !strings.Contains(strings.ToLower(out), strings.ToLower(c.want.Error())) {
				t.Fatalf("%q: want %q (%d) in the output, got:\n%s", c.cmd, c.want.Error(), int(c.want), out)
			}
			if c.audited && len(e.sink.find("", "refused", "")) == 0 && len(refusedAny(e)) == 0 {
				t.Errorf("no refusal was recorded")
			}
		})
	}
}

func refusedAny(e *env) []string {
	e.sink.mu.Lock()
	defer e.sink.mu.Unlock()
	var out []string
	for _, ev := range e.sink.events {
		if ev.Result == "refused" {
			out = append(out, ev.Op+" "+ev.Path+" "+ev.Code)
		}
	}
	return out
}

// TestRefusalsBySyscall covers what the tools don't reach.
func TestRefusalsBySyscall(t *testing.T) {
	e := newEnv(t, withRules(testRules...), withLimits(testLimits))
	plantRuleDirs(t, e)
	mustWrite(t, e.path("a"), "a")
	mustWrite(t, e.path("b"), "b")

	t.Run("rename whiteout", func(t *testing.T) {
		wantErrno(t, unix.Renameat2(unix.AT_FDCWD, e.path("a"), unix.AT_FDCWD, e.path("c"), unix.RENAME_WHITEOUT), syscall.EOPNOTSUPP)
	})
	t.Run("rename exchange with a read-only end", func(t *testing.T) {
		wantErrno(t, unix.Renameat2(unix.AT_FDCWD, e.path("a"), unix.AT_FDCWD, e.path("data/file"), unix.RENAME_EXCHANGE), syscall.EROFS)
	})
	t.Run("rename exchange with a write-only end", func(t *testing.T) {
		wantErrno(t, unix.Renameat2(unix.AT_FDCWD, e.path("a"), unix.AT_FDCWD, e.path("output/file"), unix.RENAME_EXCHANGE), syscall.EACCES)
	})
	t.Run("rename exchange where both may change", func(t *testing.T) {
		if err := unix.Renameat2(unix.AT_FDCWD, e.path("a"), unix.AT_FDCWD, e.path("b"), unix.RENAME_EXCHANGE); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(e.path("a")); string(b) != "b" {
			t.Errorf("a holds %q after the exchange", b)
		}
	})
	t.Run("ioctl", func(t *testing.T) {
		f, err := os.Open(e.path("a"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		_, err = unix.IoctlGetUint32(int(f.Fd()), unix.FS_IOC_GETFLAGS)
		wantErrno(t, err, syscall.ENOTTY)
		if len(e.sink.find("ioctl", "refused", "a")) == 0 {
			t.Errorf("ioctl refusal not recorded")
		}
	})
	t.Run("fallocate collapse range", func(t *testing.T) {
		f, err := os.OpenFile(e.path("a"), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		wantErrno(t, unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_COLLAPSE_RANGE, 0, 4096), syscall.EOPNOTSUPP)
	})
	t.Run("fallocate keep size past the end", func(t *testing.T) {
		f, err := os.OpenFile(e.path("b"), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		// Refused: space the quota could not see (TestFallocateKeepSize).
		wantErrno(t, unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_KEEP_SIZE, 0, 512<<20), syscall.EOPNOTSUPP)
		var st unix.Stat_t
		if err := unix.Stat(e.host("b"), &st); err != nil {
			t.Fatal(err)
		}
		if st.Blocks*512 > 64<<10 {
			t.Errorf("backing file has %d bytes allocated after a KEEP_SIZE fallocate past its end", st.Blocks*512)
		}
	})
	t.Run("open a planted fifo as the sandbox user", func(t *testing.T) {
		if err := unix.Mkfifo(e.host("fifo"), 0o666); err != nil {
			t.Fatal(err)
		}
		var st unix.Stat_t
		if err := unix.Lstat(e.path("fifo"), &st); err != nil {
			t.Fatal(err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFIFO || st.Mode&0o777 != 0 {
			t.Errorf("fifo shown with mode %o, want a fifo with no permissions", st.Mode)
		}
	})
}

// TestPlantedObjectsListed: objects someone else put in the backing store
// are listed for what they are.
func TestPlantedObjectsListed(t *testing.T) {
	e := newEnv(t)
	plant("link", func(p string) error { return os.Symlink("/etc/passwd", p) })(t, e)
	plant("fifo", func(p string) error { return unix.Mkfifo(p, 0o600) })(t, e)
	plantHardlink(t, e)
	plant("sock", func(p string) error { return unix.Mknod(p, unix.S_IFSOCK|0o600, 0) })(t, e)
	plant("null", func(p string) error { return unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))) })(t, e)
	mustWrite(t, e.host(".agentloom-tmp-123"), "internal")
	out, err := exec.Command("stat", "-c", "%n %F %h", e.path("link"), e.path("fifo"), e.path("h1"), e.path("sock"), e.path("null")).CombinedOutput()
	if err != nil {
		t.Fatalf("stat: %v\n%s", err, out)
	}
	for _, want := range []string{"link symbolic link 1", "fifo fifo 1", "h1 regular file 2", "sock socket 1", "null character special file 1"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("stat output lacks %q:\n%s", want, out)
		}
	}
	names, err := os.ReadDir(e.mnt)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range names {
		got = append(got, d.Name()+":"+d.Type().String())
	}
	want := "fifo:p--------- h1:---------- h2:---------- link:L--------- null:Dc--------- sock:S---------"
	if strings.Join(got, " ") != want {
		t.Errorf("listing %q\nwant    %q", strings.Join(got, " "), want)
	}
	if _, err := os.Lstat(e.path(".agentloom-tmp-123")); !os.IsNotExist(err) {
		t.Errorf("internal file visible: %v", err)
	}
}

// TestQuarantine: a quarantined scope refuses every change with EROFS and
// still reads.
func TestQuarantine(t *testing.T) {
	e := newEnv(t)
	mustWrite(t, e.path("keep"), "kept")
	f, err := os.OpenFile(e.path("keep"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := e.ws.Quarantine(store.Marker{Container: "c1", Node: "n1"}, "test"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(quarantineRecheck + 100*time.Millisecond)
	for _, cmd := range []string{"touch new", "echo x > keep", "rm keep", "mkdir d", "mv keep moved", "chmod 0644 keep", "truncate -s 0 keep"} {
		out, err := runIn(t, e.mnt, cmd)
		if err == nil || !strings.Contains(strings.ToLower(out), "read-only file system") {
			t.Errorf("%q in a quarantined scope: %v %s", cmd, err, out)
		}
	}
	// A file opened for writing before the quarantine can't write either.
	_, err = f.Write([]byte("more"))
	wantErrno(t, err, syscall.EROFS)
	if b, err := os.ReadFile(e.path("keep")); err != nil || string(b) != "kept" {
		t.Errorf("read in a quarantined scope: %q %v", b, err)
	}
	if len(e.sink.find("", "refused", "")) == 0 && len(refusedAny(e)) == 0 {
		t.Error("quarantine refusals not recorded")
	}
}

// TestSubtrees: a capped subtree (tmp/) is counted through the mount as
// the tools count it, moves in and out included; operations a subtree
// marks for confirmation are refused, since the filesystem can't ask twice.
func TestSubtrees(t *testing.T) {
	e := newEnv(t, withSubtrees(
		policy.Subtree{Prefix: "tmp", MaxBytes: 64 << 10},
		policy.Subtree{Prefix: "keep", Confirm: []policy.Op{policy.OpDelete, policy.OpWrite}},
	))
	mustWrite(t, e.host("keep/f"), "precious")
	mustWrite(t, e.host("tmp/.placeholder"), "")
	e.ws.RefreshUsage(context.Background())
	for _, c := range []struct {
		cmd  string
		want syscall.Errno // 0: must succeed
	}{
		{"dd if=/dev/zero of=tmp/a bs=1K count=40 status=none", 0},
		{"dd if=/dev/zero of=tmp/b bs=1K count=40 status=none", syscall.EDQUOT},
		{"rm -f tmp/b && dd if=/dev/zero of=big bs=1K count=40 status=none", 0},
		{"mv big tmp/big", syscall.EDQUOT},
		{"mv tmp/a a && mv big tmp/big", 0},
		{"touch keep/new && echo fresh > keep/new2", 0},
		{"rm keep/f", syscall.EPERM},
		{"echo x > keep/f", syscall.EPERM},
		{"truncate -s 0 keep/f", syscall.EPERM},
		{"mv keep/f f", syscall.EPERM},
		{"echo y > other && mv other keep/f", syscall.EPERM},
	} {
		out, err := runIn(t, e.mnt, c.cmd)
		switch {
		case c.want == 0 && err != nil:
			t.Errorf("%q: %v\n%s", c.cmd, err, out)
		case c.want != 0 && (err == nil || !strings.Contains(strings.ToLower(out), strings.ToLower(c.want.Error()))):
			t.Errorf("%q: want %v, got %v\n%s", c.cmd, c.want, err, out)
		}
	}
	if b, err := os.ReadFile(e.host("keep/f")); err != nil || string(b) != "precious" {
		t.Errorf("keep/f: %q %v", b, err)
	}
	u, err := e.ws.SubtreeUsage(context.Background(), "tmp")
	if err != nil {
		t.Fatal(err)
	}
	if u.Bytes != 40<<10 {
		t.Errorf("tmp/ counted %d bytes, want %d", u.Bytes, 40<<10)
	}
}
