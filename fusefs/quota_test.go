package fusefs

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/quota"
	"github.com/agentloom/loomfs/store"
)

// pyPrelude gives the size patterns a fallocate(2) with modes, which
// Python's os module lacks.
const pyPrelude = `
import ctypes, os, sys, tempfile
libc = ctypes.CDLL(None, use_errno=True)
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
def falloc(fd, mode, off, n):
    if libc.fallocate(fd, mode, off, n) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
KEEP, PUNCH, ZERO = 1, 2, 0x10
def linkfd(fd, name):
    # os.link calls link(2), which takes the magic link itself.
    if libc.linkat(-100, b"/proc/self/fd/%d" % fd, -100, name.encode(), 0x400) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
MiB = 1 << 20
`

// TestQuotaSizePatterns: every way a program changes a file's size, with
// its name removed before, during or after, leaves the account equal to a
// walk of the scope once the files are released.
func TestQuotaSizePatterns(t *testing.T) {
	e := newEnv(t, withLimits(func(l *policy.Limits) { l.ScopeBytes = 64 << 20 }))
	ctx := context.Background()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Fatal("python3 is needed for the size patterns")
	}
	for _, c := range []struct {
		name, py string
	}{
		{"unlink then write", `
fd = os.open("u", os.O_CREAT|os.O_RDWR, 0o600)
os.unlink("u")
os.write(fd, b"x" * (4*MiB))
os.close(fd)`},
		{"write then unlink", `
fd = os.open("w", os.O_CREAT|os.O_RDWR, 0o600)
os.write(fd, b"x" * (2*MiB))
os.unlink("w")
os.write(fd, b"y" * MiB)
os.close(fd)`},
		{"ftruncate", `
fd = os.open("t", os.O_CREAT|os.O_RDWR, 0o600)
os.ftruncate(fd, 5*MiB)
os.ftruncate(fd, MiB)
os.close(fd)
fd = os.open("t2", os.O_CREAT|os.O_RDWR, 0o600)
os.unlink("t2")
os.ftruncate(fd, 3*MiB)
os.ftruncate(fd, 2*MiB)
os.close(fd)`},
		{"sparse", `
fd = os.open("s", os.O_CREAT|os.O_RDWR, 0o600)
os.pwrite(fd, b"z", 10*MiB)
os.close(fd)
fd = os.open("s2", os.O_CREAT|os.O_RDWR, 0o600)
os.unlink("s2")
os.pwrite(fd, b"z", 8*MiB)
os.close(fd)`},
		{"fallocate modes", `
fd = os.open("f", os.O_CREAT|os.O_RDWR, 0o600)
falloc(fd, 0, 0, 2*MiB)
falloc(fd, PUNCH|KEEP, 0, MiB)
falloc(fd, ZERO, MiB, 2*MiB)
falloc(fd, KEEP, 0, MiB)
os.close(fd)
fd = os.open("f2", os.O_CREAT|os.O_RDWR, 0o600)
os.unlink("f2")
falloc(fd, 0, 0, 3*MiB)
falloc(fd, ZERO, 0, 4*MiB)
os.close(fd)`},
		{"copy_file_range into an unlinked file", `
src = os.open("c", os.O_CREAT|os.O_RDWR, 0o600)
os.write(src, b"c" * MiB)
dst = os.open("c2", os.O_CREAT|os.O_RDWR, 0o600)
os.unlink("c2")
os.copy_file_range(src, dst, MiB, 0, 0)
os.close(dst)
os.close(src)`},
		{"rename over an open file", `
fd = os.open("r", os.O_CREAT|os.O_RDWR, 0o600)
os.write(fd, b"r" * (2*MiB))
with open("r.new", "wb") as f:
    f.write(b"n" * MiB)
os.rename("r.new", "r")
os.write(fd, b"r" * MiB)
os.close(fd)`},
		{"O_TMPFILE, then linkat", `
fd = os.open(".", os.O_TMPFILE|os.O_RDWR, 0o600)
os.write(fd, b"l" * (3*MiB))
linkfd(fd, "linked")
os.write(fd, b"l" * MiB)
os.close(fd)
assert os.stat("linked").st_size == 4*MiB
fd = os.open(".", os.O_TMPFILE|os.O_RDWR, 0o600)
os.write(fd, b"n" * (2*MiB))
os.close(fd)`},
		{"tempfile.TemporaryFile", `
with tempfile.TemporaryFile(dir=".") as f:
    f.write(b"q" * (3*MiB))
    f.flush()
`},
		{"delete what was left", `
for n in os.listdir("."):
    os.unlink(n)`},
	} {
		t.Run(c.name, func(t *testing.T) {
			if out, err := runIn(t, e.mnt, "python3 -c '"+strings.ReplaceAll(pyPrelude+c.py, "'", `'"'"'`)+"'"); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			waitReleased(t, e.m)
			account, err := e.ws.Usage(ctx)
			if err != nil {
				t.Fatal(err)
			}
			walk, err := e.ws.CountUsage(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if account != walk {
				t.Errorf("account %+v, walk %+v", account, walk)
			}
		})
	}
	// Nothing was left behind in the backing directory either.
	if names, _ := os.ReadDir(e.backing); len(names) != 0 {
		t.Errorf("left in the scope: %v", names)
	}
}

// TestTmpfileTakesTheCheapPath: O_TMPFILE reaches the daemon (Python's
// TemporaryFile takes it rather than falling back to open and unlink), and
// the file counts against the quota like any file.
func TestTmpfileTakesTheCheapPath(t *testing.T) {
	e := newEnv(t, withLimits(func(l *policy.Limits) { l.ScopeBytes = 2 << 20 }))
	script := `
import os, tempfile, errno
with tempfile.TemporaryFile(dir=".") as f:
    f.write(b"x" * 1024)
try:
    fd = os.open(".", os.O_TMPFILE|os.O_WRONLY, 0o600)
    for i in range(24):
        os.write(fd, b"y" * (128 << 10))
    print("written")
except OSError as e:
    print(errno.errorcode[e.errno])
`
	out, err := runIn(t, e.mnt, "python3 -c '"+script+"'")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if strings.TrimSpace(out) != "EDQUOT" {
		t.Errorf("a 3 MiB write to an O_TMPFILE file under a 2 MiB quota: %q", out)
	}
	if n := len(e.sink.find("tmpfile", "ok", "")); n < 2 {
		t.Errorf("%d tmpfile records: TemporaryFile did not use O_TMPFILE", n)
	}
	if n := len(e.sink.find("unlink", "ok", "")); n != 0 {
		t.Errorf("TemporaryFile unlinked a named file %d times", n)
	}
}

// TestReconcileCorrectsDrift: bytes the account did not see (a file
// planted in the backing store) are found by the reconcile, corrected, and
// logged with their size.
func TestReconcileCorrectsDrift(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if err := os.WriteFile(e.path("seen"), make([]byte, 1000), 0o600); err != nil {
		t.Fatal(err)
	}
	waitReleased(t, e.m)
	mustWrite(t, e.host("planted"), strings.Repeat("p", 500))
	core, logs := observer.New(zap.WarnLevel)
	rep := reconcileIdle(t, e.ws, zap.New(core))
	if rep.Corrected != (policy.Usage{Bytes: 500, Files: 1}) {
		t.Errorf("reconcile %+v, want a correction of 500 bytes in 1 file", rep)
	}
	if logs.Len() != 1 || logs.All()[0].ContextMap()["bytes"] != int64(500) {
		t.Errorf("correction logged as %v", logs.All())
	}
	if u, _ := e.ws.Usage(ctx); u != (policy.Usage{Bytes: 1500, Files: 2}) {
		t.Errorf("usage after the reconcile %+v", u)
	}
	if rep := reconcileIdle(t, e.ws, zap.New(core)); rep.Corrected != (policy.Usage{}) || logs.Len() != 1 {
		t.Errorf("a second reconcile corrected %+v", rep)
	}
}

// TestReconcileKeepsOpenUnlinked: a file unlinked while still open holds
// its space; a walk can't see it, and the reconcile must not take it for
// drift (it would count the space away twice once the file is closed).
func TestReconcileKeepsOpenUnlinked(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	f, err := os.Create(e.path("held"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(e.path("held")); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	rep := reconcileIdle(t, e.ws, nil)
	if rep.Busy || rep.Corrected != (policy.Usage{}) || rep.Walk != (policy.Usage{Bytes: 2 << 20, Files: 1}) {
		t.Errorf("reconcile with an unlinked file open: %+v", rep)
	}
	f.Close()
	waitUsage(t, "usage once it is closed", policy.Usage{}, func() (policy.Usage, error) {
		return e.ws.Usage(ctx)
	})
}

// reconcileIdle reconciles once the mount has gone idle (a second after
// its last change).
func reconcileIdle(t *testing.T, ws *store.Workspace, log *zap.Logger) quota.Report {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		rep, err := ws.Reconcile(context.Background(), log)
		if err != nil {
			t.Fatal(err)
		}
		if !rep.Busy || time.Now().After(deadline) {
			return rep
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestCapReconcileKeepsOpenUnlinked: a file unlinked in a capped subtree
// while still open holds its space there too; the subtree's reconcile
// must not take it for drift, or tmp/ would take more than its cap once
// the file is closed.
func TestCapReconcileKeepsOpenUnlinked(t *testing.T) {
	e := newEnv(t, withSubtrees(policy.Subtree{Prefix: "tmp", MaxBytes: 4 << 20}))
	ctx := context.Background()
	if err := os.Mkdir(e.path("tmp"), 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(e.path("tmp/held"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(e.path("tmp/held")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		rep, err := e.ws.ReconcileSubtree(ctx, "tmp", nil)
		if err != nil {
			t.Fatal(err)
		}
		if !rep.Busy {
			if rep.Corrected != (policy.Usage{}) || rep.Walk != (policy.Usage{Bytes: 1 << 20, Files: 2}) {
				t.Errorf("tmp/'s reconcile with an unlinked file open: %+v", rep)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tmp/'s account still busy after 10 s: %+v", rep)
		}
		time.Sleep(50 * time.Millisecond)
	}
	f.Close()
	waitUsage(t, "tmp/ once the file is closed", policy.Usage{Files: 1}, func() (policy.Usage, error) {
		return e.ws.SubtreeUsage(ctx, "tmp")
	})
}

// waitUsage waits until usage says want. The RELEASE of a file takes its
// handle out of the mount's open files before it gives the file's usage
// back, so a test waits for the usage itself, not for waitReleased.
func waitUsage(t *testing.T, what string, want policy.Usage, usage func() (policy.Usage, error)) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		u, err := usage()
		if err == nil && u == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %+v (%v) after 5 s, want %+v", what, u, err, want)
		}
	}
}

// TestCapAcrossMounts: two mounts of one scope, as two processes would
// serve it, share tmp/'s cap: what one holds there the other can't write,
// and a move out of tmp/ in one frees room in the other.
func TestCapAcrossMounts(t *testing.T) {
	e := newEnv(t, withSubtrees(policy.Subtree{Prefix: "tmp", MaxBytes: 256 << 10}))
	mnt2 := mountAt(t, secondWorkspace(t, e, e.ws.Policy()), filepath.Join(filepath.Dir(e.mnt), "mnt2"), Options{}, nil)

	if err := os.Mkdir(e.path("tmp"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(e.path("tmp/one"), make([]byte, 200<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	err := os.WriteFile(filepath.Join(mnt2, "tmp/two"), make([]byte, 100<<10), 0o600)
	if !errors.Is(err, syscall.EDQUOT) {
		t.Fatalf("the second mount writing past what the first holds in tmp/: %v, want EDQUOT", err)
	}
	if err := os.Rename(e.path("tmp/one"), e.path("one")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mnt2, "tmp/two"), make([]byte, 200<<10), 0o600); err != nil {
		t.Fatalf("the second mount, after the first moved its file out of tmp/: %v", err)
	}
}
