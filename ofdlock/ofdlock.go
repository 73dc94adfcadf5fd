// Package ofdlock takes open file description (OFD) locks by polling.
//
// loomfs serialises appends, scope writes and ledger reads with OFD locks
// (fcntl F_OFD_SETLK): POSIX byte-range locks that NFSv4 and CephFS carry
// to every client, held per open file rather than per process, so two
// opens in one process exclude each other too. It asks for them without
// blocking and sleeps between tries instead of waiting in F_OFD_SETLKW: a
// request left blocked in a FUSE client such as ceph-fuse was seen to
// stall another client's write to the same file for good, and a polling
// wait can end when the caller's context does, which a blocked fcntl
// can't. Poll is the same wait for a lock taken some other way: the
// projection's flock(2) and POSIX record locks, whose waits end when the
// kernel interrupts the request.
package ofdlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// Backoff is how long Wait sleeps between tries: First after the first,
// doubling up to Most.
type Backoff struct {
	First, Most time.Duration
}

// Busy reports whether err, from F_OFD_SETLK, says only that another
// open file holds a conflicting lock (or the call was interrupted): worth
// trying again.
func Busy(err error) bool {
	return errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EACCES) || errors.Is(err, unix.EINTR)
}

// Wait takes the lock lk describes on fd, trying again after each sleep
// of b while another open file holds a conflicting one. It returns nil
// once the lock is held, the fcntl error when the call fails for any
// other reason, and ctx's error, wrapped, when ctx ends first.
func Wait(ctx context.Context, fd uintptr, lk unix.Flock_t, b Backoff) error {
	return Poll(ctx, b, func() error { return unix.FcntlFlock(fd, unix.F_OFD_SETLK, &lk) })
}

// Poll calls take, which asks for a lock without blocking, until it
// returns nil or an error that is not Busy, sleeping b between calls: the
// wait of Wait for locks taken another way than one fcntl (flock(2), the
// projection's POSIX locks). It returns what take last returned, or ctx's
// error, wrapped, when ctx ends first.
func Poll(ctx context.Context, b Backoff, take func() error) error {
	delay := b.First
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		err := take()
		if err == nil || !Busy(err) {
			return err
		}
		if ctx.Done() == nil {
			time.Sleep(delay)
		} else {
			if timer == nil {
				timer = time.NewTimer(delay)
			} else {
				timer.Reset(delay)
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("lock still held by another open file: %w", ctx.Err())
			case <-timer.C:
			}
		}
		delay = min(2*delay, b.Most)
	}
}
