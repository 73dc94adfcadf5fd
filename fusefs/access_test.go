package fusefs

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
)

// asUser runs script as uid:uid with the mount as its working directory,
// reached through an inherited fd: the mountpoint's parent is a 0700 root
// directory, which only the sandbox's bind mount gets past.
func asUser(t *testing.T, mnt string, uid int, script string) (string, error) {
	t.Helper()
	dir, err := os.Open(mnt)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	id := strconv.Itoa(uid)
	// A refused open must not turn into a wait: a FIFO the kernel opened
	// itself would block until a writer came.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "setpriv", "--reuid", id, "--regid", id, "--clear-groups", "sh", "-c", "W=/proc/self/fd/3; "+script)
	cmd.ExtraFiles = []*os.File{dir}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestSandboxUser: the sandbox user owns everything it sees and can use
// it; other users can't; modes keep only the owner bits asked for.
func TestSandboxUser(t *testing.T) {
	e := newEnv(t, withOptions(func(o *Options) { o.AllowOther = true }))
	if err := unix.Mkfifo(e.host("fifo"), 0o666); err != nil {
		t.Fatal(err)
	}
	out, err := asUser(t, e.mnt, DefaultUID, `umask 000; cd $W || exit 99
echo hello > f && cat f && mkdir d && stat -c '%n %u:%g %a' f d
chmod 0640 f && stat -c '%n %a' f
rm f && rmdir d && echo removed`)
	if err != nil {
		t.Fatalf("as the sandbox user: %v\n%s", err, out)
	}
	for _, want := range []string{"hello", "f 1000:1000 600", "d 1000:1000 700", "f 600", "removed"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// A special file someone planted can't be opened: the kernel would
	// open a local pipe, not the backing object. Root's lookup of it
	// (root sees it for what it is) must not leave the kernel an entry
	// the sandbox user could open.
	if _, err := os.Lstat(e.path("fifo")); err != nil {
		t.Fatal(err)
	}
	if out, err := asUser(t, e.mnt, DefaultUID, "cat $W/fifo"); err == nil || !strings.Contains(out, "Permission denied") {
		t.Errorf("open a planted fifo as the sandbox user: %v %s", err, out)
	}
	if out, err := asUser(t, e.mnt, DefaultUID+1, "ls $W"); err == nil || !strings.Contains(out, "Permission denied") {
		t.Errorf("another user listed the workspace: %v %s", err, out)
	}
	if got := append(e.sink.find("readdir", "refused", "."), e.sink.find("stat", "refused", ".")...); len(got) == 0 {
		t.Errorf("another user's listing was refused unrecorded")
	}
	// A program the daemon's process starts must not inherit the FUSE
	// session: it could answer the kernel in the daemon's place.
	if out, err := asUser(t, e.mnt, DefaultUID, "ls -l /proc/$$/fd"); err != nil || strings.Contains(out, "/dev/fuse") {
		t.Errorf("the FUSE device is inherited: %v\n%s", err, out)
	}
}

// TestSandboxUserModes: the sandbox user gets its owner bits, other users
// nothing, whatever path they take: checked by the kernel from the owner
// bits the mount shows (default_permissions) by default, and by the daemon
// with the kernel's rules under "cache: journal".
func TestSandboxUserModes(t *testing.T) {
	for _, cache := range []policy.Cache{"", policy.CacheJournal} {
		t.Run("cache="+string(cache), func(t *testing.T) { sandboxUserModes(t, cache) })
	}
}

func sandboxUserModes(t *testing.T, cache policy.Cache) {
	e := newEnv(t, withCache(cache), withOptions(func(o *Options) { o.AllowOther = true }))
	mustWrite(t, e.host("f"), "kept")
	if err := e.m.Probe(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, script string
		uid          int
	}{
		{"write a file made read-only", "echo x > ro && chmod 0400 ro && echo y > ro", DefaultUID},
		{"truncate a file made read-only", "echo x > ro2 && chmod 0400 ro2 && truncate -s 0 ro2", DefaultUID},
		{"read a file made write-only", "echo x > wo && chmod 0200 wo && cat wo", DefaultUID},
		{"create in a directory made read-only", "mkdir rod && chmod 0500 rod && touch rod/a", DefaultUID},
		{"list a directory without read permission", "mkdir nor && chmod 0300 nor && ls nor", DefaultUID},
		{"look up in a directory without search permission", "mkdir nox && chmod 0600 nox && ls nox/a", DefaultUID},
		{"enter a directory without search permission", "mkdir nocd && chmod 0600 nocd && bash -c 'cd nocd'", DefaultUID},
		{"run a file without x", "printf '#!/bin/sh\\n' > s && ./s", DefaultUID},
		{"run a file only its group may run", "printf '#!/bin/sh\\n' > g && chmod 0610 g && ./g", DefaultUID},
		{"another user reads a file", "cat f", DefaultUID + 1},
		{"another user stats a file", "stat f", DefaultUID + 1},
		{"another user creates a file", "touch new", DefaultUID + 1},
		{"another user enters the workspace", "bash -c 'cd $W'", DefaultUID + 1},
		{"another user reads the ready sentinel", "cat $W/" + policy.ReadyFile, DefaultUID + 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			script := "cd $W && " + c.script
			if c.uid != DefaultUID {
				// Not allowed in: every path starts at the mount.
				script = strings.NewReplacer(" f", " $W/f", " new", " $W/new").Replace(c.script)
			}
			out, err := asUser(t, e.mnt, c.uid, script)
			if err == nil || !strings.Contains(out, "Permission denied") {
				t.Errorf("%v %s", err, out)
			}
		})
	}
	if b, err := os.ReadFile(e.host("f")); err != nil || string(b) != "kept" {
		t.Errorf("f changed: %q %v", b, err)
	}
	if _, err := os.Lstat(e.host("new")); !os.IsNotExist(err) {
		t.Errorf("another user created a file: %v", err)
	}
}

// TestAllowOtherNeedsClosedParent: allow_other only under a root-only
// directory.
func TestAllowOtherNeedsClosedParent(t *testing.T) {
	e := newEnv(t)
	open := t.TempDir()
	if err := os.Chmod(open, 0o755); err != nil {
		t.Fatal(err)
	}
	mp := open + "/mnt"
	if err := os.Mkdir(mp, 0o755); err != nil {
		t.Fatal(err)
	}
	if m, err := Mount(t.Context(), e.ws, mp, Options{AllowOther: true}); err == nil {
		m.Unmount()
		t.Fatal("allow_other accepted under a 0755 directory")
	} else if !strings.Contains(err.Error(), "0700") {
		t.Errorf("error does not say what is needed: %v", err)
	}
	// Without allow_other the same place is fine.
	mountAt(t, e.ws, mp, Options{}, nil)
}

// TestMountpointChecks: no mount inside the served scope, nor on top of
// another mount.
func TestMountpointChecks(t *testing.T) {
	e := newEnv(t)
	if err := os.Mkdir(e.host("inside"), 0o700); err != nil {
		t.Fatal(err)
	}
	if m, err := Mount(t.Context(), e.ws, e.host("inside"), Options{}); err == nil {
		m.Unmount()
		t.Fatal("mounted inside the scope it serves")
	}
	if m, err := Mount(t.Context(), e.ws, e.mnt, Options{}); err == nil {
		m.Unmount()
		t.Fatal("mounted on top of a live mount")
	}
}

// TestAuditUnavailable: when the audit sink fails, changes are refused
// with EIO and not made; reads go on.
func TestAuditUnavailable(t *testing.T) {
	e := newEnv(t)
	mustWrite(t, e.path("keep"), "kept")
	mustWrite(t, e.path("dir/inner"), "x")
	e.sink.setFail(true)
	for _, c := range []struct {
		what string
		err  error
	}{
		{"create", os.WriteFile(e.path("new"), []byte("x"), 0o600)},
		{"mkdir", os.Mkdir(e.path("newdir"), 0o700)},
		{"unlink", os.Remove(e.path("keep"))},
		{"rename", os.Rename(e.path("keep"), e.path("moved"))},
		{"chmod", os.Chmod(e.path("keep"), 0o644)},
		{"truncate", os.Truncate(e.path("keep"), 0)},
		{"open for writing", func() error { _, err := os.OpenFile(e.path("keep"), os.O_WRONLY, 0); return err }()},
	} {
		var en syscall.Errno
		if c.err == nil || !asErrno(c.err, &en) || en != syscall.EIO {
			t.Errorf("%s with the audit log down: %v, want EIO", c.what, c.err)
		}
	}
	for _, rel := range []string{"new", "newdir", "moved"} {
		if _, err := os.Lstat(e.host(rel)); !os.IsNotExist(err) {
			t.Errorf("%s was made unrecorded", rel)
		}
	}
	var st unix.Stat_t
	if err := unix.Stat(e.host("keep"), &st); err != nil || st.Size != 4 || st.Mode&0o777 != policy.FilePerm {
		t.Errorf("keep changed unrecorded: %v size %d mode %o", err, st.Size, st.Mode&0o777)
	}
	if b, err := os.ReadFile(e.path("keep")); err != nil || string(b) != "kept" {
		t.Errorf("read with the audit log down: %q %v", b, err)
	}
	e.sink.setFail(false)
	if err := os.WriteFile(e.path("new"), []byte("x"), 0o600); err != nil {
		t.Errorf("create once the log is back: %v", err)
	}
}

// TestAuditRecords: changes are recorded with the path, reads are
// summarised once per open file. Under "cache: strict" every open reads
// through the daemon; otherwise the kernel keeps the pages of an
// unchanged file, and the later opens read none through it.
func TestAuditRecords(t *testing.T) {
	for _, c := range []struct {
		cache policy.Cache
		reads int
	}{{policy.CacheStrict, 3}, {policy.CacheJournal, 1}} {
		// Either way each open has its record.
		t.Run(string(c.cache), func(t *testing.T) { testAuditRecords(t, c.cache, c.reads) })
	}
}

func testAuditRecords(t *testing.T, cache policy.Cache, wantReads int) {
	e := newEnv(t, withCache(cache))
	mustWrite(t, e.path("a"), "hello")
	for i := 0; i < 3; i++ {
		f, err := os.Open(e.path("a"))
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 1)
		for j := 0; j < 5; j++ {
			f.ReadAt(buf, int64(j))
		}
		f.Close()
	}
	// RELEASE, which makes the summary, comes after close(2) returns.
	waitReleased(t, e.m)
	if err := os.Rename(e.path("a"), e.path("b")); err != nil {
		t.Fatal(err)
	}
	if got := len(e.sink.find("create", "ok", "a")); got != 1 {
		t.Errorf("%d create records, want 1", got)
	}
	if got := e.sink.find("rename", "ok", "a"); len(got) != 1 || got[0].NewPath != "b" {
		t.Errorf("rename records: %+v", got)
	}
	reads, releases := 0, 0
	for _, ev := range e.sink.find("release", "ok", "a") {
		releases++
		if ev.Detail["read"].(int64) > 0 {
			reads++
		}
	}
	// The write's open, then the three reads.
	if releases != 4 || reads != wantReads {
		t.Errorf("%d release records, %d with bytes read, for one write and 3 reads; want 4 and %d", releases, reads, wantReads)
	}
}

func asErrno(err error, en *syscall.Errno) bool {
	for err != nil {
		if e, ok := err.(syscall.Errno); ok {
			*en = e
			return true
		}
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return false
		}
		err = u.Unwrap()
	}
	return false
}
