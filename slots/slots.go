// Package slots bounds how many of one kind of work the processes of a
// node do at once.
//
// A set of n slots is n lock files in a node-local directory. A slot is
// held by an OFD write lock on one of them (ofdlock), so the bound holds
// across every process on the node and across the goroutines of one
// process alike, and a slot is freed by the kernel when its holder closes
// it or dies: a killed worker can't keep one. Take polls, so a wait ends
// with its context.
//
// Waiters are served in the order they came, so that none waits its whole
// time behind later ones' luck: within one process they queue on a
// channel before they poll (a long-lived door such as the Go API makes
// all of a node's containers), and between processes each polling waiter
// holds a ticket, a file in the same directory named by the time it came
// and locked for as long as it waits. Only the n oldest tickets try the
// slots; a ticket whose lock is free is a waiter that died, and the
// waiters behind it remove it.
//
// loomfs uses it to bound the containers a node asks its engine to create
// and start at once: dockerd was seen to deadlock when 50 came in one
// second on a 2-CPU node (RELIABILITY.md).
package slots

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/ofdlock"
)

// backoff is the wait between tries while every slot is held: short,
// since holds are short and a slot left idle is a container not started;
// at most n waiters of a process poll at once (queue).
var backoff = ofdlock.Backoff{First: 2 * time.Millisecond, Most: 20 * time.Millisecond}

// sweepEvery is how often a waiter that is not among the n oldest looks
// for tickets of dead waiters ahead of it; a dead one delays it by at
// most this. youngTicket is the age below which a ticket is never taken
// for dead: its waiter may not have locked it yet. A ticket older than
// oldTicket no longer keeps anyone behind it, so that a waiter that was
// stopped or frozen rather than killed (its lock still held) can't stall
// the node's starts for good; every start waits for far less.
const (
	sweepEvery  = 500 * time.Millisecond
	youngTicket = time.Second
	oldTicket   = 5 * time.Minute
)

// ticketPrefix starts the name of every ticket in a Set's directory.
const ticketPrefix = "wait-"

// ErrBusy is wrapped by Take's error when its context ended while every
// slot was held.
var ErrBusy = errors.New("every slot is held")

// Set is n slots in a directory. Its methods are safe for concurrent use.
type Set struct {
	dir   string
	n     int
	queue chan struct{} // this process's turns to poll, shared by the Sets of dir and n
}

// queues holds a process's queue for each directory and size, so that
// every Set of one process for the same slots serves its waiters in turn.
var queues struct {
	sync.Mutex
	m map[string]chan struct{}
}

// New returns the set of n slots in dir, which is made (0700) at the first
// Take if missing. Every process that names the same dir and n shares the
// bound; a process naming a larger n uses more of the same files.
func New(dir string, n int) *Set {
	n = max(n, 1)
	key := dir + "\x00" + strconv.Itoa(n)
	queues.Lock()
	defer queues.Unlock()
	q, ok := queues.m[key]
	if !ok {
		if queues.m == nil {
			queues.m = make(map[string]chan struct{})
		}
		q = make(chan struct{}, n)
		queues.m[key] = q
	}
	return &Set{dir: dir, n: n, queue: q}
}

// Size returns the number of slots.
func (s *Set) Size() int { return s.n }

// Take waits for a free slot and holds it until release is called. It
// returns an error wrapping ErrBusy and ctx's error when ctx ends first,
// and the file system's error when the slots can't be opened.
func (s *Set) Take(ctx context.Context) (release func(), err error) {
	// Blocked senders on a channel are served in the order they came.
	select {
	case s.queue <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("slots: all %d held: %w: %w", s.n, ErrBusy, ctx.Err())
	}
	defer func() {
		if err != nil {
			<-s.queue
		}
	}()
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return nil, fmt.Errorf("slots: %w", err)
	}
	// A ticket that can't be made (the directory's file system full) costs
	// the waiter its place in the queue, not its start: it polls as if
	// first in line.
	tk, _ := s.enqueue()
	defer tk.remove()
	files := make([]*os.File, s.n)
	defer func() {
		for _, f := range files {
			if f != nil {
				f.Close()
			}
		}
	}()
	for i := range files {
		f, err := os.OpenFile(filepath.Join(s.dir, "slot-"+strconv.Itoa(i)), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, fmt.Errorf("slots: %w", err)
		}
		files[i] = f
	}
	var held *os.File
	take := func() error {
		turn, err := tk.turn(s.n)
		if err != nil {
			return err
		}
		if !turn {
			return unix.EAGAIN
		}
		// From a random slot, so that waiters don't all try slot 0 first.
		start := rand.IntN(s.n)
		for k := range s.n {
			i := (start + k) % s.n
			lk := unix.Flock_t{Type: unix.F_WRLCK}
			err := unix.FcntlFlock(files[i].Fd(), unix.F_OFD_SETLK, &lk)
			if err == nil {
				held, files[i] = files[i], nil
				return nil
			}
			if !ofdlock.Busy(err) {
				return err
			}
		}
		return unix.EAGAIN
	}
	if err := ofdlock.Poll(ctx, backoff, take); err != nil {
		if ctx.Err() != nil {
			ahead := 0
			if tk != nil {
				ahead = tk.waitersAhead
			}
			return nil, fmt.Errorf("slots: all %d held, %d waiters ahead in the node's queue: %w: %w", s.n, ahead, ErrBusy, ctx.Err())
		}
		return nil, fmt.Errorf("slots: lock: %w", err)
	}
	return sync.OnceFunc(func() {
		held.Close()
		<-s.queue
	}), nil
}

// ticket is a polling waiter's place in the queue of a Set's directory.
type ticket struct {
	dir, name string
	f         *os.File // locked while the waiter waits
	swept     time.Time
	// waitersAhead is how many tickets were ahead at the last count.
	waitersAhead int
}

// enqueue takes a ticket: a file named by the time and a unique suffix,
// created and locked by this waiter.
func (s *Set) enqueue() (*ticket, error) {
	name := fmt.Sprintf("%s-%d-%08x", ticketName(time.Now()), os.Getpid(), rand.Uint32())
	f, err := os.OpenFile(filepath.Join(s.dir, name), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	lk := unix.Flock_t{Type: unix.F_WRLCK}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk); err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, fmt.Errorf("lock ticket: %w", err)
	}
	return &ticket{dir: s.dir, name: name, f: f, swept: time.Now()}, nil
}

// remove gives the ticket up.
func (t *ticket) remove() {
	if t == nil {
		return
	}
	os.Remove(t.f.Name())
	t.f.Close()
}

// turn reports whether fewer than n tickets are ahead of t. Every
// sweepEvery while it is not, it removes the tickets ahead of it that no
// live waiter holds, and counts again.
func (t *ticket) turn(n int) (bool, error) {
	if t == nil {
		return true, nil
	}
	ahead, err := t.ahead()
	t.waitersAhead = len(ahead)
	if err != nil || len(ahead) < n || time.Since(t.swept) < sweepEvery {
		return err == nil && len(ahead) < n, err
	}
	t.swept = time.Now()
	t.waitersAhead = 0
	for _, name := range ahead {
		if !t.sweep(name) {
			t.waitersAhead++
		}
	}
	return t.waitersAhead < n, nil
}

// ahead lists the tickets in t's directory older than t.
func (t *ticket) ahead() ([]string, error) {
	d, err := os.Open(t.dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	oldest := ticketName(time.Now().Add(-oldTicket))
	var ahead []string
	for _, name := range names {
		if strings.HasPrefix(name, ticketPrefix) && name < t.name && name > oldest {
			ahead = append(ahead, name)
		}
	}
	return ahead, nil
}

// ticketName is the start of the name of a ticket taken at when: names
// sort as the times they were taken.
func ticketName(when time.Time) string {
	return fmt.Sprintf("%s%020d", ticketPrefix, when.UnixNano())
}

// sweep removes the ticket name if no live waiter holds it, and reports
// whether it is gone.
func (t *ticket) sweep(name string) bool {
	if name > ticketName(time.Now().Add(-youngTicket)) {
		return false
	}
	path := filepath.Join(t.dir, name)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return errors.Is(err, fs.ErrNotExist)
	}
	defer f.Close()
	lk := unix.Flock_t{Type: unix.F_WRLCK}
	if unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk) != nil {
		return false
	}
	os.Remove(path)
	return true
}
