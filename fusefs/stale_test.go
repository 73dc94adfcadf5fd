package fusefs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// TestStaleReads: a thread answered ESTALE for a read is answered ENOENT
// by its next one within staleRetry (the kernel's retry), then ESTALE
// again; another thread, a call that names none, a thread whose read was
// served meanwhile, and a retry after the window get ESTALE.
func TestStaleReads(t *testing.T) {
	f := &fsys{}
	caller := func(tid uint32) context.Context {
		return fuse.NewContext(context.Background(), &fuse.Caller{Pid: tid})
	}
	served := func(ctx context.Context) syscall.Errno { f.readServed(ctx); return 0 }
	for i, c := range []struct {
		answer func(context.Context) syscall.Errno
		ctx    context.Context
		want   syscall.Errno
	}{
		{f.staleRead, caller(7), syscall.ESTALE},
		{f.staleRead, caller(8), syscall.ESTALE},
		{f.staleRead, caller(7), syscall.ENOENT}, // 7's retry
		{f.staleRead, caller(7), syscall.ESTALE}, // a read of its own again
		{f.staleRead, context.Background(), syscall.ESTALE},
		{f.staleRead, context.Background(), syscall.ESTALE},
		{f.staleRead, caller(8), syscall.ENOENT},
		{served, caller(7), 0}, // 7's retry was served
		{f.staleRead, caller(7), syscall.ESTALE},
	} {
		if got := c.answer(c.ctx); got != c.want {
			t.Errorf("answer %d: %v, want %v", i, got, c.want)
		}
	}
	if n := f.staleReads.pending.Load(); n != 1 {
		t.Errorf("%d threads remembered, want 1 (thread 7, its retry to come)", n)
	}
	f.staleRead(caller(9))
	s := &f.staleReads
	s.recent[(s.next+len(s.recent)-1)%len(s.recent)].at = time.Now().Add(-2 * staleRetry)
	if got := f.staleRead(caller(9)); got != syscall.ESTALE {
		t.Errorf("after the window: %v, want ESTALE", got)
	}
	// A ring full of threads never answered again forgets the oldest.
	for tid := uint32(100); tid < 200; tid++ {
		f.staleRead(caller(tid))
	}
	if n, most := s.pending.Load(), int32(len(s.recent)); n != most {
		t.Errorf("%d threads remembered, want the ring's %d", n, most)
	}
}

// TestOpenWhileLinkSwapped: go-fuse's OpenSymlinkRace at length. One
// goroutine swaps a name between a file and a link by rename, two open
// it; an open gets the file, follows the link, or finds the name gone
// (ENOENT), never ESTALE (which the kernel passes on when its one retry
// finds the name replaced again).
func TestOpenWhileLinkSwapped(t *testing.T) {
	e := newEnv(t)
	path, tmp := e.path("swapped"), e.path("swapped.tmp")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for time.Now().Before(deadline) {
			err := os.WriteFile(tmp, nil, 0o600)
			if err == nil {
				err = os.Rename(tmp, path)
			}
			if err == nil {
				err = os.Symlink("/etc/passwd", tmp)
			}
			if err == nil {
				err = os.Rename(tmp, path)
			}
			if err != nil {
				errs <- fmt.Errorf("swap: %w", err)
				return
			}
		}
	}()
	var opens, gone [2]int
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				fd, err := syscall.Open(path, syscall.O_RDONLY, 0)
				switch {
				case err == nil:
					syscall.Close(fd)
					opens[i]++
				case errors.Is(err, syscall.ENOENT):
					gone[i]++
				default:
					errs <- fmt.Errorf("open: %w", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("while the name is swapped: %v", err)
	}
	t.Logf("opened %v, gone %v", opens, gone)
}

// TestStatWhileReplaced: a name replaced by rename through the mount, in
// a loop, is never missing for lstat(2) and stat(2): a GETATTR of the
// node it replaced answers ESTALE, and the kernel looks the name up
// again.
func TestStatWhileReplaced(t *testing.T) {
	e := newEnv(t)
	path, tmp := e.path("replaced"), e.path("replaced.tmp")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for time.Now().Before(deadline) {
			err := os.WriteFile(tmp, nil, 0o600)
			if err == nil {
				err = os.Rename(tmp, path)
			}
			if err != nil {
				errs <- fmt.Errorf("replace: %w", err)
				return
			}
		}
	}()
	var stats [2]int
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var st syscall.Stat_t
			for time.Now().Before(deadline) {
				if err := syscall.Lstat(path, &st); err != nil {
					errs <- fmt.Errorf("lstat: %w", err)
					return
				}
				if err := syscall.Stat(path, &st); err != nil {
					errs <- fmt.Errorf("stat: %w", err)
					return
				}
				stats[i] += 2
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("while the name is replaced: %v", err)
	}
	t.Logf("stats %v", stats)
}
