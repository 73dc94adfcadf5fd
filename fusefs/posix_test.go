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
	"Link": {"SPEC §3.2: hard links can't be created", func(t *testing.T, mnt string) {
		mustWrite(t, mnt+"/target", "hello")
		wantErrno(t, os.Link(mnt+"/target", mnt+"/link"), syscall.EPERM)
	}},
	"LinkUnlinkRename": {"SPEC §3.2: hard links can't be created", func(t *testing.T, mnt string) {
		mustWrite(t, mnt+"/tmpfile", "hello")
		wantErrno(t, syscall.Link(mnt+"/tmpfile", mnt+"/file"), syscall.EPERM)
	}},
	"Tmpfile": {"an O_TMPFILE file could only be named by linkat, and hard links are refused", func(t *testing.T, mnt string) {
		_, err := syscall.Open(mnt, unix.O_TMPFILE|syscall.O_RDWR, 0o600)
		wantErrno(t, err, syscall.EOPNOTSUPP)
	}},
	"FileBasic": {"SPEC §2.1: new files are 0600 whatever mode is asked (the test wants the 0755 it asked)", func(t *testing.T, mnt string) {
		if err := os.WriteFile(mnt+"/file", []byte("hello world"), 0o755); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(mnt + "/file")
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != policy.FilePerm {
			t.Errorf("mode %v, want %o", fi.Mode(), policy.FilePerm)
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
