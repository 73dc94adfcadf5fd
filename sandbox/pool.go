package sandbox

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/store"
)

// ReusableProjection is a projection that can serve one command after
// another: each is announced with Serve before it starts, so the FUSE
// records and refusals name that command.
type ReusableProjection interface {
	Projection
	Serve(call CallInfo)
}

// DefaultPoolIdle is how long Pool keeps a projection no command uses.
const DefaultPoolIdle = 2 * time.Minute

// Pool keeps one live projection per workspace on this worker, so the
// commands of a session reuse a mounted projection instead of mounting
// and unmounting one per command: its kernel caches stay warm from one
// command to the next (the change journals keep them coherent with the
// tool door). Each command still gets the health probe before its
// container starts. A projection is unmounted when no command used it for
// Idle, when a command left it held by some process (it is not trusted
// again), and at Close (the end of the run). It is safe for concurrent
// use; one workspace's commands take turns (they hold the scope lock).
type Pool struct {
	Mount MountFunc     // mounts a projection; what it returns must be a ReusableProjection
	Dir   string        // root-only 0700 directory for mountpoints
	Idle  time.Duration // 0 means DefaultPoolIdle

	mu     sync.Mutex
	live   map[*store.Workspace]*Lease
	closed bool
}

// Lease is a pooled projection lent to one command.
type Lease struct {
	pool  *Pool
	ws    *store.Workspace
	proj  ReusableProjection
	dir   string // the mountpoint, removed with the mount
	dev   uint64 // the projection's device, to find its holders
	busy  bool
	idle  *time.Timer
	reuse int // commands served before this one
}

// Projection returns the leased projection; its Unmount removes the
// mountpoint too.
func (l *Lease) Projection() Projection { return l }

// Dir, Probe and Unmount make a Lease the Projection it lends.
func (l *Lease) Dir() string                     { return l.proj.Dir() }
func (l *Lease) Probe(ctx context.Context) error { return l.proj.Probe(ctx) }

// Dev returns the projection's device number.
func (l *Lease) Dev() uint64 { return l.dev }

// Reused reports how many commands the projection served before this one.
func (l *Lease) Reused() int { return l.reuse }

// Acquire lends the live projection of ws, mounting one if there is none,
// to the command call. The caller probes it, and gives it back with
// Release, or Discard if it can't be trusted any more.
func (p *Pool) Acquire(ctx context.Context, ws *store.Workspace, call CallInfo) (*Lease, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, fmt.Errorf("projection pool closed")
	}
	if l := p.live[ws]; l != nil && !l.busy {
		l.busy = true
		l.idle.Stop()
		l.reuse++
		p.mu.Unlock()
		l.proj.Serve(call)
		return l, nil
	}
	p.mu.Unlock()
	l, err := p.mount(ctx, ws, call)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.live == nil {
		p.live = map[*store.Workspace]*Lease{}
	}
	if p.closed || p.live[ws] != nil {
		// Closed meanwhile, or a second command of the workspace at once
		// (which the scope lock rules out): this one is not kept.
		return l, nil
	}
	p.live[ws] = l
	return l, nil
}

func (p *Pool) mount(ctx context.Context, ws *store.Workspace, call CallInfo) (*Lease, error) {
	if err := os.MkdirAll(p.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("mount dir: %w", err)
	}
	sweepStaleMounts(p.Dir)
	mp, err := os.MkdirTemp(p.Dir, MountpointPrefix(ws.Scope()))
	if err != nil {
		return nil, fmt.Errorf("mountpoint: %w", err)
	}
	if err := shareMountpoint(mp); err != nil {
		os.Remove(mp)
		return nil, err
	}
	proj, err := p.Mount(ctx, ws, mp, call)
	if err != nil {
		removeMountpoint(mp)
		return nil, err
	}
	rp, ok := proj.(ReusableProjection)
	if !ok {
		proj.Unmount()
		removeMountpoint(mp)
		return nil, fmt.Errorf("the projection can't serve more than one command")
	}
	var st unix.Stat_t
	if err := unix.Stat(proj.Dir(), &st); err != nil {
		proj.Unmount()
		removeMountpoint(mp)
		return nil, fmt.Errorf("the workspace projection does not answer: %w", err)
	}
	l := &Lease{pool: p, ws: ws, proj: rp, dir: mp, dev: st.Dev, busy: true}
	l.idle = time.AfterFunc(time.Hour, func() { p.expire(l) })
	l.idle.Stop()
	return l, nil
}

// Release gives the projection back after a command that left nothing
// holding it; it is unmounted after Idle unless another command takes it.
func (l *Lease) Release() {
	p := l.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.live[l.ws] != l || p.closed {
		go l.unmount()
		return
	}
	l.busy = false
	idle := p.Idle
	if idle <= 0 {
		idle = DefaultPoolIdle
	}
	l.idle.Reset(idle)
}

// Discard takes the projection out of the pool; the caller unmounts it
// (Unmount), since it knows how long it may wait.
func (l *Lease) Discard() {
	p := l.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.live[l.ws] == l {
		delete(p.live, l.ws)
	}
	l.idle.Stop()
}

// Unmount unmounts the projection and removes its mountpoint.
func (l *Lease) Unmount() error { return l.unmount() }

func (l *Lease) unmount() error {
	err := l.proj.Unmount()
	removeMountpoint(l.dir)
	return err
}

// expire unmounts a projection that stayed idle.
func (p *Pool) expire(l *Lease) {
	p.mu.Lock()
	if p.live[l.ws] != l || l.busy {
		p.mu.Unlock()
		return
	}
	delete(p.live, l.ws)
	p.mu.Unlock()
	l.unmount()
}

// Live returns how many projections the pool holds.
func (p *Pool) Live() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.live)
}

// Close unmounts every idle projection and refuses new leases; one lent to
// a command still running is unmounted when it is given back.
func (p *Pool) Close() error {
	p.mu.Lock()
	p.closed = true
	var idle []*Lease
	for ws, l := range p.live {
		if !l.busy {
			l.idle.Stop()
			idle = append(idle, l)
			delete(p.live, ws)
		}
	}
	p.mu.Unlock()
	var first error
	for _, l := range idle {
		if err := l.unmount(); err != nil && first == nil {
			first = err
		}
	}
	return first
}
