package fusefs

import (
	"bytes"
	"os"
	"syscall"
	"testing"
)

// TestPassthrough: with Options.Passthrough, a file opened read-only is
// read by the kernel from the backing file, and a file opened for writing
// still sends every write to the daemon's checks, whichever is opened
// first.
func TestPassthrough(t *testing.T) {
	for _, order := range []string{"read-only first", "writable first"} {
		t.Run(order, func(t *testing.T) {
			e := newEnv(t, withLimits(testLimits), withOptions(func(o *Options) { o.Passthrough = true }))
			mustWrite(t, e.path("f"), "0123456789")
			var ro, rw *os.File
			var err error
			openRO := func() {
				if ro, err = os.Open(e.path("f")); err != nil {
					t.Fatal(err)
				}
			}
			openRW := func() {
				if rw, err = os.OpenFile(e.path("f"), os.O_RDWR, 0); err != nil {
					t.Fatal(err)
				}
			}
			if order == "read-only first" {
				openRO()
				openRW()
			} else {
				openRW()
				openRO()
			}
			defer ro.Close()
			defer rw.Close()

			before := e.m.fsys.daemonReads.Load()
			buf := make([]byte, 10)
			if _, err := ro.ReadAt(buf, 0); err != nil || string(buf) != "0123456789" {
				t.Fatalf("read-only read: %q %v", buf, err)
			}
			if n := e.m.fsys.daemonReads.Load() - before; n != 0 {
				t.Errorf("the daemon served %d reads of a passthrough file", n)
			}

			// Writes reach the daemon: the per-file limit holds.
			_, err = rw.WriteAt([]byte("x"), testFileLimit)
			wantErrno(t, err, syscall.EFBIG)
			if _, err := rw.WriteAt([]byte("AB"), 0); err != nil {
				t.Fatal(err)
			}
			if _, err := ro.ReadAt(buf, 0); err != nil || string(buf) != "AB23456789" {
				t.Fatalf("passthrough read after a daemon write: %q %v", buf, err)
			}
			if got := e.m.fsys.daemonReads.Load() - before; got != 0 {
				t.Errorf("the daemon served %d reads of a passthrough file", got)
			}
			// A mapping can't grow the file either: size changes are
			// truncate and fallocate, which come to the daemon.
			if err := rw.Truncate(testFileLimit + 1); err == nil {
				t.Error("truncate past the limit allowed on a passthrough mount")
			}
			if b, _ := os.ReadFile(e.host("f")); !bytes.Equal(b, []byte("AB23456789")) {
				t.Errorf("backing file holds %q", b)
			}
		})
	}
}
