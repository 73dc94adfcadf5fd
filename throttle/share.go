package throttle

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/agentloom/loomfs/newname"
	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"
)

// A scope's limits hold for the scope, not for one process: every process
// that serves it (a mount per node, the tool door's processes, a pooled
// projection) shares them. A process doing throttled I/O is an active
// holder: it keeps a file in the scope's throttle directory, locked with an
// OFD lock for as long as it stays active, and holds itself to the limits
// divided by the number of active holders it counts there. OFD locks are
// the one thing every supported shared filesystem keeps coherent across
// nodes (SPEC §7.4), so a holder whose process or node died is known by
// its lock being free, and its file is removed by whoever finds it.
//
// Shares are equal, not weighted by use: a holder that stays active with
// little I/O leaves part of its share unused, so together the holders stay
// at or under the limit, never over it. A holder leaves after idleAfter
// without a wait, and recounts every recount while active, so a new holder
// is seen within about that time (it counts the others before its first
// byte).
var (
	recount   = 250 * time.Millisecond
	idleAfter = time.Second
)

// share is a limiter's place among the scope's active holders.
type share struct {
	dfd int // the scope's throttle directory

	mu     sync.Mutex
	fd     int    // this holder's locked file while active; -1 when not
	name   string // its name in the directory
	last   time.Time
	n      int // active holders counted at the last recount, this one included
	ticker *time.Ticker
	done   chan struct{}
}

// holderSuffix marks a holder's file; a name without it is a file being
// made (created, not yet locked) and is never taken for a dead holder's.
const holderSuffix = ".holder"

// Share makes l hold to its limits together with every other process that
// shares the directory dfd (the scope's throttle directory on the shared
// volume): its rates become the limits divided by the active holders. dfd
// is duplicated; the caller keeps its own. A limiter shares one directory
// at most: later calls do nothing.
func (l *Limiter) Share(dfd int) error {
	if l == nil {
		return nil
	}
	l.shareMu.Lock()
	defer l.shareMu.Unlock()
	if l.share != nil {
		return nil
	}
	d, err := unix.FcntlInt(uintptr(dfd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("throttle: share: %w", err)
	}
	l.share = &share{dfd: d, fd: -1, n: 1}
	return nil
}

// Holders returns how many active holders the limiter counted last, itself
// included; 1 for a limiter that shares nothing or is idle.
func (l *Limiter) Holders() int {
	s := l.shared()
	if s == nil {
		return 1
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

func (l *Limiter) shared() *share {
	if l == nil {
		return nil
	}
	l.shareMu.Lock()
	defer l.shareMu.Unlock()
	return l.share
}

// active marks the limiter active before a wait: it joins the holders
// (counting them at once) if it was idle.
func (l *Limiter) active() {
	s := l.shared()
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last = time.Now()
	if s.fd >= 0 {
		return
	}
	if err := s.join(); err != nil {
		// Without its file the holder can't be counted by the others;
		// it still holds itself to its share of those it can count.
		s.fd = -1
	}
	l.apply(s.count())
	if s.fd >= 0 {
		s.ticker = time.NewTicker(recount)
		s.done = make(chan struct{})
		go l.watch(s, s.ticker, s.done)
	}
}

// watch recounts the holders while the limiter is active and leaves when
// it went idle.
func (l *Limiter) watch(s *share, t *time.Ticker, done chan struct{}) {
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		s.mu.Lock()
		if s.done != done { // closed, or left and joined again
			s.mu.Unlock()
			return
		}
		if time.Since(s.last) >= idleAfter {
			s.leave()
			s.mu.Unlock()
			return
		}
		n := s.count()
		s.mu.Unlock()
		l.apply(n)
	}
}

// apply sets the buckets to 1/n of the limits.
func (l *Limiter) apply(n int) {
	n = max(n, 1)
	if l.bytes != nil {
		l.bytes.SetLimit(rate.Limit(float64(l.limits.BytesPerSec) / float64(n)))
	}
	if l.ops != nil {
		l.ops.SetLimit(rate.Limit(float64(l.limits.OpsPerSec) / float64(n)))
	}
}

// join creates and locks this holder's file: made under a temporary name,
// locked, then placed under its holder name (newname), so that no other holder ever
// sees a holder's file unlocked while its holder lives.
func (s *share) join() error {
	var b [8]byte
	rand.Read(b[:])
	id := fmt.Sprintf("%d-%s", os.Getpid(), hex.EncodeToString(b[:]))
	tmp := id + ".new"
	fd, err := unix.Openat(s.dfd, tmp, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("throttle: join: %w", err)
	}
	lk := unix.Flock_t{Type: unix.F_WRLCK}
	if err := unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLK, &lk); err != nil {
		unix.Unlinkat(s.dfd, tmp, 0)
		unix.Close(fd)
		return fmt.Errorf("throttle: join: lock: %w", err)
	}
	name := id + holderSuffix
	if err := newname.Place(s.dfd, tmp, name); err != nil {
		unix.Unlinkat(s.dfd, tmp, 0)
		unix.Close(fd)
		return fmt.Errorf("throttle: join: %w", err)
	}
	s.fd, s.name = fd, name
	return nil
}

// leave removes this holder's file and stops its recounts.
func (s *share) leave() {
	if s.fd < 0 {
		return
	}
	unix.Unlinkat(s.dfd, s.name, 0)
	unix.Close(s.fd) // the lock goes with the last descriptor
	s.fd, s.name, s.n = -1, "", 1
	s.ticker.Stop()
	s.ticker, s.done = nil, nil
}

// count returns the active holders: this one and every other holder file
// whose lock is held. A file whose lock is free belonged to a holder that
// died without leaving; it is removed.
func (s *share) count() int {
	n := 1
	for _, name := range s.names() {
		if name == s.name || !strings.HasSuffix(name, holderSuffix) {
			continue
		}
		switch live, err := s.live(name); {
		case err != nil:
			// A file that went while we looked was a holder leaving.
		case live:
			n++
		default:
			unix.Unlinkat(s.dfd, name, 0)
		}
	}
	s.n = n
	return n
}

// names lists the throttle directory.
func (s *share) names() []string {
	fd, err := unix.Openat(s.dfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	f := os.NewFile(uintptr(fd), "throttle")
	defer f.Close()
	names, _ := f.Readdirnames(-1)
	return names
}

// live reports whether the holder file name is locked by its holder.
func (s *share) live(name string) (bool, error) {
	fd, err := unix.Openat(s.dfd, name, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, err
	}
	defer unix.Close(fd)
	lk := unix.Flock_t{Type: unix.F_WRLCK}
	switch err := unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLK, &lk); {
	case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EACCES):
		return true, nil
	case err != nil:
		return false, err
	}
	return false, nil // taken: its holder is gone (the lock goes with fd)
}

// Close leaves the holders at once rather than after idleAfter. A process
// that just exits needs no Close: its lock goes with it, and its file with
// the next count.
func (l *Limiter) Close() {
	s := l.shared()
	if s == nil {
		return
	}
	s.mu.Lock()
	if s.done != nil {
		close(s.done)
	}
	s.leave()
	s.mu.Unlock()
}

// Sharing reports whether Share was called.
func (l *Limiter) Sharing() bool { return l.shared() != nil }
