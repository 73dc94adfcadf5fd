package fusefs

import (
	"errors"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/posixtest"
	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
)

// expectedRefusal is a posixtest case loomfs fails on purpose: instead of
// running it, check makes the case's first forbidden call and asserts the
// refusal.
type expectedRefusal struct {
	reason string
	check  func(t *testing.T, mnt string)
}

// refusedPosix lists every posixtest case that needs what loomfs refuses.
var refusedPosix = map[string]expectedRefusal{
	"Link": {"SPEC §3.2: hard links can't be created (EXDEV, so programs copy)", func(t *testing.T, mnt string) {
		mustWrite(t, mnt+"/target", "hello")
		wantErrno(t, os.Link(mnt+"/target", mnt+"/link"), syscall.EXDEV)
	}},
	"LinkUnlinkRename": {"SPEC §3.2: hard links can't be created (EXDEV, so programs copy)", func(t *testing.T, mnt string) {
		mustWrite(t, mnt+"/tmpfile", "hello")
		wantErrno(t, syscall.Link(mnt+"/tmpfile", mnt+"/file"), syscall.EXDEV)
	}},
	"FallocateKeepSize": {"SPEC §3.3: space reserved past the end (FALLOC_FL_KEEP_SIZE) is invisible to the quota, so it is refused with EOPNOTSUPP, never granted short", func(t *testing.T, mnt string) {
		f, err := os.Create(mnt + "/file")
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.Write(make([]byte, 100)); err != nil {
			t.Fatal(err)
		}
		wantErrno(t, syscall.Fallocate(int(f.Fd()), unix.FALLOC_FL_KEEP_SIZE, 50, 52), syscall.EOPNOTSUPP)
		if err := syscall.Fallocate(int(f.Fd()), unix.FALLOC_FL_KEEP_SIZE, 50, 50); err != nil {
			t.Errorf("KEEP_SIZE within the file: %v", err)
		}
	}},
	"FileBasic": {"SPEC §2.1: new files keep only the owner bits asked for (the test wants the 0755 it asked)", func(t *testing.T, mnt string) {
		if err := os.WriteFile(mnt+"/file", []byte("hello world"), 0o755); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(mnt + "/file")
		if err != nil {
			t.Fatal(err)
		}
		if want := os.FileMode(policy.OwnerPerm(0o755)); fi.Mode().Perm() != want {
			t.Errorf("mode %v, want %v", fi.Mode(), want)
		}
	}},
	"FcntlFlockLocksFile": {"fcntl locks have POSIX semantics: the case wants a second fd of the same process refused, which POSIX and every local filesystem grant; other processes are refused (TestPOSIXLocks)", func(t *testing.T, mnt string) {
		mustWrite(t, mnt+"/test", "")
		f1, err := os.OpenFile(mnt+"/test", os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f1.Close()
		f2, err := os.OpenFile(mnt+"/test", os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f2.Close()
		if err := syscall.FcntlFlock(f1.Fd(), syscall.F_SETLK, &syscall.Flock_t{Type: syscall.F_WRLCK}); err != nil {
			t.Fatal(err)
		}
		if err := syscall.FcntlFlock(f2.Fd(), syscall.F_SETLK, &syscall.Flock_t{Type: syscall.F_RDLCK}); err != nil {
			t.Fatalf("second fd of the lock's own process: %v, want the lock", err)
		}
	}},
}

// refusedWithoutXattrs lists the cases that need extended attributes,
// which a mount without Options.UserXattrs does not have.
var refusedWithoutXattrs = map[string]expectedRefusal{
	"XAttr": {"extended attributes are off unless Options.UserXattrs", func(t *testing.T, mnt string) {
		mustWrite(t, mnt+"/file", "")
		wantErrno(t, unix.Setxattr(mnt+"/file", "user.xattrtest", []byte("value"), 0), syscall.EOPNOTSUPP)
	}},
	"XAttrLarge": {"extended attributes are off unless Options.UserXattrs", func(t *testing.T, mnt string) {
		mustWrite(t, mnt+"/file", "")
		_, err := unix.Getxattr(mnt+"/file", "user.large", nil)
		wantErrno(t, err, syscall.EOPNOTSUPP)
	}},
}

// TestPosix runs go-fuse's conformance suite against a fresh mount per
// case: every case passes except the listed refusals, which must fail
// with the refusal.
func TestPosix(t *testing.T) {
	for _, xattrs := range []bool{false, true} {
		name := "xattrs-off"
		if xattrs {
			name = "user-xattrs"
		}
		t.Run(name, func(t *testing.T) {
			names := make([]string, 0, len(posixtest.All))
			for n := range posixtest.All {
				names = append(names, n)
			}
			sort.Strings(names)
			for _, n := range names {
				t.Run(n, func(t *testing.T) {
					e := newEnv(t, withOptions(func(o *Options) { o.UserXattrs = xattrs }))
					r, ok := refusedPosix[n]
					if !ok && !xattrs {
						r, ok = refusedWithoutXattrs[n]
					}
					if ok {
						t.Logf("expected refusal: %s", r.reason)
						r.check(t, e.mnt)
						return
					}
					posixtest.All[n](t, e.mnt)
				})
			}
		})
	}
}

// TestPosixListComplete keeps refusedPosix honest: every entry names a
// real posixtest case.
func TestPosixListComplete(t *testing.T) {
	for _, list := range []map[string]expectedRefusal{refusedPosix, refusedWithoutXattrs} {
		for n := range list {
			if _, ok := posixtest.All[n]; !ok {
				t.Errorf("%q is listed as an expected refusal, but posixtest has no such case", n)
			}
		}
	}
}

func wantErrno(t *testing.T, err error, want syscall.Errno) {
	t.Helper()
	var got syscall.Errno
	if !errors.As(err, &got) {
		t.Fatalf("got %v, want errno %v (%d)", err, want, want)
	}
	if got != want {
		t.Fatalf("got %v (%d), want %v (%d)", err, got, want, want)
	}
}

func mustWrite(t testing.TB, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
