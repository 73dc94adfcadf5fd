package fusefs

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// lockHelperEnv makes the test binary a helper process (TestLockHelper)
// that locks or asks about a lock the way another process would.
const lockHelperEnv = "LOOMFS_LOCK_HELPER"

// TestLockHelper is not a test: run by helper with lockHelperEnv set, it
// applies one fcntl lock request to the file open as fd 3 (inherited, as
// after fork) or opened at the path argument, and prints the outcome.
func TestLockHelper(t *testing.T) {
	op := os.Getenv(lockHelperEnv)
	if op == "" {
		t.Skip("helper process only")
	}
	fd := 3
	if p := os.Getenv(lockHelperEnv + "_PATH"); p != "" {
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			fmt.Println("open:", err)
			os.Exit(0)
		}
		fd = int(f.Fd())
	}
	lk := unix.Flock_t{Type: unix.F_WRLCK}
	switch op {
	case "setlk":
		if err := unix.FcntlFlock(uintptr(fd), unix.F_SETLK, &lk); err != nil {
			fmt.Println(unix.ErrnoName(err.(syscall.Errno)))
		} else {
			fmt.Println("locked")
		}
	case "getlk":
		if err := unix.FcntlFlock(uintptr(fd), unix.F_GETLK, &lk); err != nil {
			fmt.Println(err)
		} else {
			fmt.Println(lk.Type, lk.Pid)
		}
	}
	os.Exit(0)
}

// helper runs op in another process, over inherited (fd 3) or, if nil,
// a file it opens at path itself; it returns what the helper printed.
func helper(t *testing.T, op string, inherited *os.File, path string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestLockHelper$")
	cmd.Env = append(os.Environ(), lockHelperEnv+"="+op)
	if inherited != nil {
		cmd.ExtraFiles = []*os.File{inherited}
	} else {
		cmd.Env = append(cmd.Env, lockHelperEnv+"_PATH="+path)
	}
	var out bytes.Buffer
	cmd.Stdout = &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("helper %s: %v: %s", op, err, out.String())
	}
	return strings.TrimSpace(strings.SplitN(out.String(), "\n", 2)[0])
}

func openRW(t *testing.T, path string) *os.File {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func setlk(f *os.File, typ int16, start, length int64) error {
	lk := unix.Flock_t{Type: typ, Start: start, Len: length}
	return unix.FcntlFlock(f.Fd(), unix.F_SETLK, &lk)
}

// eventually retries check until it passes: RELEASE, which drops the
// locks of a file closed without FLUSH, comes after close(2) returned.
func eventually(t *testing.T, what string, check func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !check(); {
		if time.Now().After(deadline) {
			t.Fatal(what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestPOSIXLocks: fcntl record locks taken in the mount belong to the
// process (the kernel's lock owner), not to the open, as POSIX says.
func TestPOSIXLocks(t *testing.T) {
	for name, fn := range map[string]func(*testing.T, *env){
		"a second fd of the same process takes the same range": func(t *testing.T, e *env) {
			f1, f2 := openRW(t, e.path("db")), openRW(t, e.path("db"))
			if err := setlk(f1, unix.F_WRLCK, 0, 0); err != nil {
				t.Fatal(err)
			}
			if err := setlk(f2, unix.F_WRLCK, 0, 0); err != nil {
				t.Fatalf("second fd of the lock's own process: %v, want the lock", err)
			}
			if got := helper(t, "setlk", nil, e.path("db")); got != "EAGAIN" {
				t.Fatalf("another process: %s, want EAGAIN", got)
			}
		},
		"a forked child conflicts with its parent's lock": func(t *testing.T, e *env) {
			f := openRW(t, e.path("db"))
			if err := setlk(f, unix.F_WRLCK, 0, 0); err != nil {
				t.Fatal(err)
			}
			// The child inherits the very open file description.
			if got := helper(t, "setlk", f, ""); got != "EAGAIN" {
				t.Fatalf("child over the inherited fd: %s, want EAGAIN", got)
			}
		},
		"F_GETLK reports the lock and its process to another process, not to its owner": func(t *testing.T, e *env) {
			f1, f2 := openRW(t, e.path("db")), openRW(t, e.path("db"))
			if err := setlk(f1, unix.F_WRLCK, 10, 5); err != nil {
				t.Fatal(err)
			}
			want := fmt.Sprintf("%d %d", unix.F_WRLCK, os.Getpid())
			if got := helper(t, "getlk", nil, e.path("db")); got != want {
				t.Fatalf("F_GETLK from another process: %q, want type and pid %q", got, want)
			}
			own := unix.Flock_t{Type: unix.F_WRLCK}
			if err := unix.FcntlFlock(f2.Fd(), unix.F_GETLK, &own); err != nil {
				t.Fatal(err)
			}
			if own.Type != unix.F_UNLCK {
				t.Fatalf("F_GETLK by the owner reports type %d pid %d, want F_UNLCK", own.Type, own.Pid)
			}
		},
		"closing any fd of the owner releases its locks": func(t *testing.T, e *env) {
			f1 := openRW(t, e.path("db"))
			if err := setlk(f1, unix.F_WRLCK, 0, 0); err != nil {
				t.Fatal(err)
			}
			other, err := os.Open(e.path("db"))
			if err != nil {
				t.Fatal(err)
			}
			other.Close()
			if got := helper(t, "setlk", nil, e.path("db")); got != "locked" {
				t.Fatalf("after the owner closed another fd: %s, want the lock free", got)
			}
			if n := ownerFiles(e); n != 0 {
				t.Fatalf("%d lock owners' files still open after the close", n)
			}
		},
		"closing the fd that took the lock releases it": func(t *testing.T, e *env) {
			f, err := os.OpenFile(e.path("db"), os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			if err := setlk(f, unix.F_WRLCK, 0, 0); err != nil {
				t.Fatal(err)
			}
			f.Close()
			eventually(t, "the lock outlived the close of its only fd", func() bool {
				return helper(t, "setlk", nil, e.path("db")) == "locked"
			})
			if n := ownerFiles(e); n != 0 {
				t.Fatalf("%d lock owners' files still open after the release", n)
			}
		},
		"an unmount releases the locks held": func(t *testing.T, e *env) {
			f, err := os.OpenFile(e.path("db"), os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if err := setlk(f, unix.F_WRLCK, 0, 0); err != nil {
				t.Fatal(err)
			}
			e.m.releaseOpen()
			if n := ownerFiles(e); n != 0 {
				t.Fatalf("%d lock owners' files still open after the unmount's release", n)
			}
			host, err := os.OpenFile(e.host("db"), os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer host.Close()
			lk := unix.Flock_t{Type: unix.F_WRLCK}
			if err := unix.FcntlFlock(host.Fd(), unix.F_OFD_SETLK, &lk); err != nil {
				t.Fatalf("the backing file is still locked after the unmount's release: %v", err)
			}
		},
		"unlocking part of a range keeps the rest": func(t *testing.T, e *env) {
			f := openRW(t, e.path("db"))
			if err := setlk(f, unix.F_WRLCK, 0, 100); err != nil {
				t.Fatal(err)
			}
			if err := setlk(f, unix.F_UNLCK, 0, 50); err != nil {
				t.Fatal(err)
			}
			if got := helper(t, "getlk", nil, e.path("db")); !strings.HasPrefix(got, strconv.Itoa(unix.F_WRLCK)+" ") {
				t.Fatalf("F_GETLK after a partial unlock: %q, want the rest still locked", got)
			}
			if err := setlk(f, unix.F_UNLCK, 50, 50); err != nil {
				t.Fatal(err)
			}
			if got := helper(t, "setlk", nil, e.path("db")); got != "locked" {
				t.Fatalf("after unlocking everything: %s, want the lock free", got)
			}
			if n := ownerFiles(e); n != 0 {
				t.Fatalf("%d lock owners' files still open with no lock held", n)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			mustWrite(t, e.path("db"), strings.Repeat("x", 200))
			fn(t, e)
		})
	}
}

// ownerFiles counts the lock owners' backing files the mount holds open.
func ownerFiles(e *env) int {
	n := 0
	e.m.fsys.locked.Range(func(k, _ any) bool {
		nl := k.(*nodeLocks)
		nl.mu.Lock()
		n += len(nl.owners)
		nl.mu.Unlock()
		return true
	})
	return n
}

// TestNoFlushUnlessLocked: the kernel sends FLUSH at close(2) only for
// files that have held POSIX locks; every other close stays one round
// trip cheaper.
func TestNoFlushUnlessLocked(t *testing.T) {
	e := newEnv(t)
	mustWrite(t, e.path("plain"), "x")
	mustWrite(t, e.path("locked"), "x")
	// An unlock of what was never locked locks nothing.
	p := openRW(t, e.path("plain"))
	if err := setlk(p, unix.F_UNLCK, 0, 0); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ {
		b, err := os.ReadFile(e.path("plain"))
		if err != nil || len(b) != 1 {
			t.Fatal(b, err)
		}
	}
	if n := e.m.fsys.flushCount.Load(); n != 0 {
		t.Fatalf("%d FLUSH requests for a file never locked, want 0", n)
	}
	f := openRW(t, e.path("locked"))
	if err := setlk(f, unix.F_RDLCK, 0, 0); err != nil {
		t.Fatal(err)
	}
	g, err := os.Open(e.path("locked"))
	if err != nil {
		t.Fatal(err)
	}
	g.Close()
	if n := e.m.fsys.flushCount.Load(); n != 1 {
		t.Fatalf("%d FLUSH requests for the close of a locked file, want 1", n)
	}
}

// TestSQLiteConnections: two SQLite connections in one process write the
// same database in turn, and a second process writes it too (SQLite's
// locking is POSIX record locks). It runs Python's sqlite3 module.
func TestSQLiteConnections(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	e := newEnv(t)
	script := `
import sqlite3, subprocess, sys
db = sys.argv[1]
a = sqlite3.connect(db, timeout=0)
b = sqlite3.connect(db, timeout=0)
a.execute("pragma journal_mode=" + sys.argv[2])
a.execute("create table t (who text)")
a.commit()
for i in range(20):
    a.execute("insert into t values ('a')"); a.commit()
    b.execute("insert into t values ('b')"); b.commit()
    assert b.execute("select count(*) from t").fetchone()[0] == 2 * (i + 1)
# Both read at once, then each writes: the locks one connection took for
# both must not outlive the reads.
ca = a.execute("select * from t"); ca.fetchone()
cb = b.execute("select * from t"); cb.fetchone()
ca.fetchall(); cb.fetchall()
b.execute("insert into t values ('b')"); b.commit()
a.execute("insert into t values ('a')"); a.commit()
r = a.execute("begin immediate")
other = subprocess.run([sys.executable, "-c",
    "import sqlite3, sys\n"
    "c = sqlite3.connect(sys.argv[1], timeout=0)\n"
    "try:\n c.execute('insert into t values (1)'); c.commit(); print('wrote')\n"
    "except sqlite3.OperationalError as e: print(e)\n", db], capture_output=True, text=True)
print("while held:", other.stdout.strip())
a.rollback()
other = subprocess.run([sys.executable, "-c",
    "import sqlite3, sys\n"
    "c = sqlite3.connect(sys.argv[1], timeout=0)\n"
    "c.execute('insert into t values (2)'); c.commit(); print('wrote')\n", db], capture_output=True, text=True)
print("after:", (other.stdout + other.stderr).strip())
print("rows:", b.execute("select count(*) from t").fetchone()[0])
`
	for _, mode := range []string{"delete", "wal"} {
		t.Run(mode, func(t *testing.T) {
			db := mode + ".db"
			out, err := exec.Command("python3", "-c", script, e.path(db), mode).CombinedOutput()
			if err != nil {
				t.Fatalf("sqlite over the mount: %v\n%s", err, out)
			}
			want := "while held: database is locked\nafter: wrote\nrows: 43\n"
			if string(out) != want {
				t.Fatalf("sqlite over the mount printed\n%s\nwant\n%s", out, want)
			}
			if _, err := os.Stat(filepath.Join(e.backing, db)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestInterruptedLockWait: a process waiting for a lock through the mount
// that a signal interrupts (flock -w and a Python lockf under alarm, both
// SIGALRM) is answered at once, gives up without the lock, and leaves the
// holder's lock as it was.
func TestInterruptedLockWait(t *testing.T) {
	e := newEnv(t)
	mustWrite(t, e.path("held"), "x")
	for _, tc := range []struct {
		name string
		lock func(*os.File) error
		cmd  []string
	}{
		{"flock", func(f *os.File) error { return unix.Flock(int(f.Fd()), unix.LOCK_EX) },
			[]string{"flock", "-w", "0.3", e.path("held"), "true"}},
		{"posix", func(f *os.File) error { return setlk(f, unix.F_WRLCK, 0, 0) },
			// The handler raises: Python retries a call its handler lets
			// return (PEP 475).
			[]string{"python3", "-c", "import fcntl, signal, sys\n" +
				"def alarm(*a): raise TimeoutError\n" +
				"signal.signal(signal.SIGALRM, alarm)\n" +
				"f = open(sys.argv[1], 'r+')\n" +
				"signal.setitimer(signal.ITIMER_REAL, 0.3)\n" +
				"try:\n    fcntl.lockf(f, fcntl.LOCK_EX)\nexcept TimeoutError:\n    sys.exit(1)\n",
				e.path("held")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			holder := openRW(t, e.path("held"))
			if err := tc.lock(holder); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			cmd := exec.Command(tc.cmd[0], tc.cmd[1:]...)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case err := <-done:
				if code := cmd.ProcessState.ExitCode(); code != 1 {
					t.Fatalf("%s exited %d (%v), want 1: interrupted without the lock", tc.name, code, err)
				}
			case <-time.After(10 * time.Second):
				// Not waited for: its request ends once the holder's
				// cleanup lets the lock go.
				cmd.Process.Kill()
				t.Fatalf("%s still waiting %v after its signal", tc.name, time.Since(start))
			}
			// Another open still finds the lock held.
			other := openRW(t, e.path("held"))
			if tc.name == "flock" {
				wantErrno(t, unix.Flock(int(other.Fd()), unix.LOCK_EX|unix.LOCK_NB), syscall.EWOULDBLOCK)
			} else if got := helper(t, "setlk", nil, e.path("held")); got != "EAGAIN" {
				t.Fatalf("another process after the interrupted wait: %s, want EAGAIN", got)
			}
			holder.Close()
			other.Close()
		})
	}
}
