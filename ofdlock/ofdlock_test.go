package ofdlock_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/ofdlock"
)

var (
	whole = unix.Flock_t{Type: unix.F_WRLCK}
	fast  = ofdlock.Backoff{First: 100 * time.Microsecond, Most: 5 * time.Millisecond}
)

// twoOpens opens one file twice: two open file descriptions, whose OFD
// locks conflict although one process holds both.
func twoOpens(t *testing.T) (a, b *os.File) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "lock")
	var fs [2]*os.File
	for i := range fs {
		f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		fs[i] = f
	}
	return fs[0], fs[1]
}

func TestWaitTakesAFreeLock(t *testing.T) {
	a, b := twoOpens(t)
	if err := ofdlock.Wait(context.Background(), a.Fd(), whole, fast); err != nil {
		t.Fatal(err)
	}
	lk := whole
	if err := unix.FcntlFlock(b.Fd(), unix.F_OFD_SETLK, &lk); !ofdlock.Busy(err) {
		t.Fatalf("the other open took the lock Wait holds: %v", err)
	}
}

func TestWaitUntilLetGo(t *testing.T) {
	const hold = 50 * time.Millisecond
	for _, ctx := range []context.Context{context.Background(), t.Context()} {
		a, b := twoOpens(t)
		lk := whole
		if err := unix.FcntlFlock(a.Fd(), unix.F_OFD_SETLK, &lk); err != nil {
			t.Fatal(err)
		}
		fd := a.Fd()
		let := make(chan struct{})
		go func() {
			defer close(let)
			time.Sleep(hold)
			un := unix.Flock_t{Type: unix.F_UNLCK}
			unix.FcntlFlock(fd, unix.F_OFD_SETLK, &un)
		}()
		start := time.Now()
		err := ofdlock.Wait(ctx, b.Fd(), whole, fast)
		waited := time.Since(start)
		<-let
		if err != nil {
			t.Fatal(err)
		}
		if waited < hold {
			t.Fatalf("took the lock after %v, while the other open held it for %v", waited, hold)
		}
	}
}

func TestWaitEndsWithItsContext(t *testing.T) {
	a, b := twoOpens(t)
	lk := whole
	if err := unix.FcntlFlock(a.Fd(), unix.F_OFD_SETLK, &lk); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	err := ofdlock.Wait(ctx, b.Fd(), whole, ofdlock.Backoff{First: time.Millisecond, Most: time.Second})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait on a lock never let go: %v, want the context's deadline", err)
	}
}

func TestWaitFailsAtOnceOnOtherErrors(t *testing.T) {
	a, _ := twoOpens(t)
	ro, err := os.Open(a.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	// A write lock needs a file open for writing: EBADF, not busy.
	done := make(chan error, 1)
	go func() { done <- ofdlock.Wait(context.Background(), ro.Fd(), whole, fast) }()
	select {
	case err := <-done:
		if !errors.Is(err, unix.EBADF) {
			t.Fatalf("write lock on a read-only open: %v, want EBADF", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Wait kept trying a lock it can never take")
	}
}
