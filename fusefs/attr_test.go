package fusefs

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestSetattrThroughOpen: the times and mode of a file open in the mount
// are set on that open's file, as futimens and fchmod name it, even when
// its path now holds another file (the tool door replaced it); the file
// at the path keeps its own.
func TestSetattrThroughOpen(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	f, err := os.OpenFile(filepath.Join(e.mnt, "f"), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("old"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.ws.WriteFile(ctx, "f", []byte("new"), nil); err != nil {
		t.Fatal(err)
	}

	want := time.Unix(1000, 0)
	ts := [2]unix.Timespec{{Nsec: unix.UTIME_OMIT}, unix.NsecToTimespec(want.UnixNano())}
	// futimens(2): utimensat with a NULL path.
	if _, _, e := unix.Syscall6(unix.SYS_UTIMENSAT, f.Fd(), 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0); e != 0 {
		t.Fatalf("futimens on the open file: %v", e)
	}
	if err := f.Chmod(0o700); err != nil {
		t.Fatalf("fchmod on the open file: %v", err)
	}
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if !fi.ModTime().Equal(want) || fi.Mode().Perm() != 0o700 || fi.Size() != 3 {
		t.Errorf("the open file: mtime %v mode %v size %d, want %v, 0700, 3", fi.ModTime(), fi.Mode(), fi.Size(), want)
	}
	at, err := os.Lstat(filepath.Join(e.backing, "f"))
	if err != nil {
		t.Fatal(err)
	}
	if at.ModTime().Equal(want) || at.Mode().Perm() == 0o700 {
		t.Errorf("the file that replaced it took the change: mtime %v mode %v", at.ModTime(), at.Mode())
	}
}
