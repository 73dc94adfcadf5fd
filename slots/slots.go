// Package slots bounds how many of one kind of work the processes of a
// node do at once.
//
// A set of n slots is n lock files in a node-local directory. A slot is
// held by an OFD write lock on one of them (ofdlock), so the bound holds
// across every process on the node and across the goroutines of one
// process alike, and a slot is freed by the kernel when its holder closes
// it or dies: a killed worker can't keep one. Take polls, so a wait ends
// with its context. Within one process waiters queue in the order they
// came before they poll (a long-lived door such as the Go API makes all
// of a node's containers), so none waits behind a later one's luck;
// between processes, whoever polls first after a release wins.
//
// loomfs uses it to bound the containers a node asks its engine to create
// and start at once: dockerd was seen to deadlock when 50 came in one
// second on a 2-CPU node (RELIABILITY.md).
package slots

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/ofdlock"
)

// backoff is the wait between tries while every slot is held: short,
// since holds are short and a slot left idle is a container not started;
// at most n waiters of a process poll at once (queue).
var backoff = ofdlock.Backoff{First: 2 * time.Millisecond, Most: 20 * time.Millisecond}

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
			return nil, fmt.Errorf("slots: all %d held: %w: %w", s.n, ErrBusy, ctx.Err())
		}
		return nil, fmt.Errorf("slots: lock: %w", err)
	}
	return sync.OnceFunc(func() {
		held.Close()
		<-s.queue
	}), nil
}
