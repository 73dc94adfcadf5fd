package sandbox

import (
	"context"
	"errors"
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
//
// With a projection, the pool keeps the container Commands prepared for
// the workspace's next command (Prepared), and removes it, confirmed,
// before the projection is unmounted: at Idle, at Close, and when the
// projection is discarded. What Commands does after a command's answer
// (Lease.after: the holder scan, the next container's creation) is waited
// for by the workspace's next Acquire and by Close.
type Pool struct {
	Mount MountFunc     // mounts a projection; what it returns must be a ReusableProjection
	Dir   string        // root-only 0700 directory for mountpoints
	Idle  time.Duration // 0 means DefaultPoolIdle

	mu     sync.Mutex
	live   map[*store.Workspace]*Lease
	closed bool
	bg     int        // work after answers and expiries under way
	bgDone *sync.Cond // on mu, broadcast when bg falls
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

	spare    *Prepared     // the container prepared for the next command
	taken    *Prepared     // the one the command lent the lease took
	settling chan struct{} // closed when the work after the last answer is done
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
//
// If the workspace's last command is still being settled after its
// answer (Lease.after), Acquire waits for that first. If a container was
// prepared for the workspace, the lease takes it for this command, and
// call.Container is its name.
func (p *Pool) Acquire(ctx context.Context, ws *store.Workspace, call CallInfo) (*Lease, error) {
	p.mu.Lock()
	for {
		if p.closed {
			p.mu.Unlock()
			return nil, fmt.Errorf("projection pool closed")
		}
		l := p.live[ws]
		if l == nil || l.settling == nil {
			break
		}
		ch := l.settling
		p.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for the last command's projection scan: %w", context.Cause(ctx))
		}
		p.mu.Lock()
	}
	if l := p.live[ws]; l != nil && !l.busy {
		l.busy = true
		l.idle.Stop()
		l.reuse++
		if l.spare != nil {
			l.taken, l.spare = l.spare, nil
			call.Container = l.taken.Name
		}
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
// holding it; it is unmounted after Idle unless another command takes it,
// and at once if the pool was closed meanwhile.
func (l *Lease) Release() {
	p := l.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.live[l.ws] != l || p.closed {
		if p.live[l.ws] == l {
			delete(p.live, l.ws)
		}
		l.idle.Stop()
		p.mu.Unlock()
		l.unmount()
		p.mu.Lock()
		return
	}
	l.busy = false
	l.idle.Reset(p.idleTime())
}

func (p *Pool) idleTime() time.Duration {
	if p.Idle <= 0 {
		return DefaultPoolIdle
	}
	return p.Idle
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

// Unmount removes the container prepared over the projection, if any,
// then unmounts the projection and removes its mountpoint.
func (l *Lease) Unmount() error { return l.unmount() }

func (l *Lease) unmount() error {
	p := l.pool
	p.mu.Lock()
	spare := l.spare
	l.spare = nil
	p.mu.Unlock()
	var serr error
	if spare != nil {
		serr = spare.Remove(context.Background())
	}
	err := l.proj.Unmount()
	removeMountpoint(l.dir)
	return errors.Join(err, serr)
}

// after runs work, what is left of the lent command once it was answered,
// in the background. The workspace's next Acquire waits until it is done,
// and so does Close.
func (l *Lease) after(work func()) {
	p := l.pool
	ch := make(chan struct{})
	p.mu.Lock()
	l.settling = ch
	p.bg++
	p.mu.Unlock()
	go func() {
		defer func() {
			p.mu.Lock()
			if l.settling == ch {
				l.settling = nil
			}
			p.done()
			p.mu.Unlock()
			close(ch)
		}()
		work()
	}()
}

// wantsSpare reports whether the lease, back in the pool, has no prepared
// container and may keep one.
func (l *Lease) wantsSpare() bool {
	p := l.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.closed && p.live[l.ws] == l && !l.busy && l.spare == nil
}

// offer keeps sp as the container of the workspace's next command. It
// reports false, and the caller removes sp, if the lease is no longer the
// pool's or has one.
func (l *Lease) offer(sp *Prepared) bool {
	p := l.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.live[l.ws] != l || l.spare != nil {
		return false
	}
	l.spare = sp
	return true
}

// done counts one background task finished; p.mu is held.
func (p *Pool) done() {
	p.bg--
	if p.bgDone != nil {
		p.bgDone.Broadcast()
	}
}

// expire unmounts a projection that stayed idle, and removes the
// container prepared over it.
func (p *Pool) expire(l *Lease) {
	p.mu.Lock()
	if p.live[l.ws] != l || l.busy {
		p.mu.Unlock()
		return
	}
	if l.settling != nil { // the last command's work is not done: later
		l.idle.Reset(p.idleTime())
		p.mu.Unlock()
		return
	}
	delete(p.live, l.ws)
	p.bg++
	p.mu.Unlock()
	l.unmount()
	p.mu.Lock()
	p.done()
	p.mu.Unlock()
}

// Prepared returns how many prepared containers the pool keeps.
func (p *Pool) Prepared() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, l := range p.live {
		if l.spare != nil {
			n++
		}
	}
	return n
}

// Live returns how many projections the pool holds.
func (p *Pool) Live() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.live)
}

// Close refuses new leases, waits for the work after the last answers and
// for idle projections being unmounted, removes every prepared container
// and unmounts every idle projection; one lent to a command still running
// is unmounted when it is given back (and no container is prepared for
// it). No prepared container of the pool is left when it returns, unless
// its removal was not confirmed, which it reports.
func (p *Pool) Close() error {
	p.mu.Lock()
	p.closed = true
	if p.bgDone == nil {
		p.bgDone = sync.NewCond(&p.mu)
	}
	for p.bg > 0 {
		p.bgDone.Wait()
	}
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
