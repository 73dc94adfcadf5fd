package fusefs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
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

// TestOpenWhileLinkSwapped: go-fuse's OpenSymlinkRace at length. A name
// is swapped between a file and a link by rename while it is opened; an
// open gets the file, follows the link, or finds the name gone (ENOENT),
// never ESTALE (which the kernel passes on when its one retry finds the
// name replaced again).
func TestOpenWhileLinkSwapped(t *testing.T) {
	e := newEnv(t)
	path, tmp := e.path("swapped"), e.path("swapped.tmp")
	swap := func() error {
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
		return err
	}
	var opened, gone atomic.Int64
	open := func() error {
		fd, err := syscall.Open(path, syscall.O_RDONLY, 0)
		switch {
		case err == nil:
			syscall.Close(fd)
			opened.Add(1)
		case errors.Is(err, syscall.ENOENT):
			gone.Add(1)
		default:
			return err
		}
		return nil
	}
	whileReplaced(t, path, swap, open)
	t.Logf("opened %d, gone %d", opened.Load(), gone.Load())
}

// TestStatWhileReplaced: a name replaced by rename through the mount, in
// a loop, is never missing for lstat(2) and stat(2): a stat that races a
// replace sees the file as it was or as it is.
func TestStatWhileReplaced(t *testing.T) {
	e := newEnv(t)
	path, tmp := e.path("replaced"), e.path("replaced.tmp")
	replace := func() error {
		err := os.WriteFile(tmp, nil, 0o600)
		if err == nil {
			err = os.Rename(tmp, path)
		}
		return err
	}
	var stats atomic.Int64
	stat := func() error {
		var st syscall.Stat_t
		if err := syscall.Lstat(path, &st); err != nil {
			return fmt.Errorf("lstat: %w", err)
		}
		if err := syscall.Stat(path, &st); err != nil {
			return fmt.Errorf("stat: %w", err)
		}
		stats.Add(2)
		return nil
	}
	whileReplaced(t, path, replace, stat)
	t.Logf("%d stats", stats.Load())
}

// whileReplaced makes path a file, then for three seconds calls replace
// in a loop while two goroutines call probe in a loop, and reports the
// first error of each.
func whileReplaced(t *testing.T, path string, replace, probe func() error) {
	t.Helper()
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Second)
	errs := make(chan error, 3)
	loop := func(what string, fn func() error) {
		for time.Now().Before(deadline) {
			if err := fn(); err != nil {
				errs <- fmt.Errorf("%s: %w", what, err)
				return
			}
		}
	}
	var wg sync.WaitGroup
	wg.Go(func() { loop("replace", replace) })
	wg.Go(func() { loop("probe", probe) })
	wg.Go(func() { loop("probe", probe) })
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("while the name is replaced: %v", err)
	}
}
