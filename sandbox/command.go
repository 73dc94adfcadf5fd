package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
	"github.com/agentloom/loomfs/tools"
)

// Projection is a mounted, policed view of one scope (the fusefs door).
type Projection interface {
	// Dir is the host path of the mountpoint, bound at /workspace.
	Dir() string
	// Probe writes, reads back and deletes a file through the mount.
	Probe(ctx context.Context) error
	// Unmount unmounts and waits until the mount is gone.
	Unmount() error
}

// MountFunc mounts ws's projection at mountpoint for one command, so the
// FUSE records of that command can carry its call id and container.
type MountFunc func(ctx context.Context, ws *store.Workspace, mountpoint string, call CallInfo) (Projection, error)

// CallInfo says which command a projection serves.
type CallInfo struct {
	CallID    string
	Run       string
	Container string
	// Refused is to be told of every refusal the projection makes, for
	// the command's policy_events; it may be called concurrently.
	Refused func(tools.PolicyEvent)
	// Trace is the span of the call (package tracing): the projection's
	// operations for the command are its children.
	Trace trace.SpanContext
}

// Commands runs workspace_command calls (SPEC §5): for each, it mounts the
// scope's projection in a root-only directory, checks it with a probe,
// persists the execution marker, runs one container over it, and removes
// the marker only once the engine confirmed the container is gone. If that
// can't be confirmed, the scope is quarantined.
//
// With a Pool, a command's container is made before it is asked for, in
// a scope recently used: one whose kept projection already served a
// command. Once such a command is answered, the projection's holder scan
// runs, and then a container is created, not started, over the
// projection for the scope's next command (Runner.Prepare), which pays
// only its start, its wait and its removal. The marker protocol is the
// same: the next command's marker is set before its container starts.
// A scope's first command over a projection (all that loomfs run does) is
// answered as before, after the scan, and prepares nothing: a process
// that ends after one command would only create a container to remove it.
// So is a command that did not end by itself (timed out, cancelled, failed
// to start, or whose removal was not confirmed), the ones that leave
// leftovers.
//
// The holder scan after the answer means a command whose container's
// leftovers still hold the projection is answered with what it did, and
// the scope is quarantined right after (projection_held in the audit
// log), so the next write or command is refused; it was answered
// quarantined instead before. SPEC §5's guarantees hold: the container it
// ran in is confirmed gone before the answer, and the marker was set
// before its start. What is not covered is the time between the answer
// and the scan's end (milliseconds; two seconds at most when it finds a
// holder, which it gives that long to go), during which the scope's next
// call may be served; its next command waits for the scan.
type Commands struct {
	Runner   *Runner
	Mount    MountFunc
	MountDir string            // root-only 0700 directory for mountpoints
	Run      string            // run id for labels and markers
	Skills   map[string]string // skill id → host dir, mounted read-only
	// Pool, if set, keeps the projection of each workspace mounted from
	// one command to the next (Mount and MountDir are then the pool's).
	Pool *Pool
}

var _ tools.CommandRunner = (*Commands)(nil)

// RunCommand implements tools.CommandRunner. The caller holds the scope lock.
func (c *Commands) RunCommand(ctx context.Context, ws *store.Workspace, req tools.CommandRequest) (tools.CommandResult, error) {
	if err := ws.CheckQuarantine(); err != nil {
		return tools.CommandResult{}, err
	}
	image, err := c.Runner.imageID(ctx)
	if err != nil {
		return tools.CommandResult{}, policy.Errorf(policy.SandboxUnavailable, "%v", err)
	}
	name := NewContainerName(ws.Scope().Hash())
	var refused Refusals
	call := CallInfo{CallID: req.CallID, Run: c.Run, Container: name, Refused: refused.Add, Trace: trace.SpanContextFromContext(ctx)}
	proj, dev, lease, err := c.projection(ctx, ws, call)
	if err != nil {
		return tools.CommandResult{}, err
	}
	var prep *Prepared
	if lease != nil && lease.taken != nil {
		prep, lease.taken = lease.taken, nil
		name = prep.Name // the name the projection serves (Pool.Acquire)
	}
	hooks := &markerHooks{ws: ws}
	held := c.release(proj, dev, ws.Scope(), hooks, lease)
	settled := false
	defer func() {
		if settled {
			return
		}
		held()
		if prep != nil && !lease.offer(prep) {
			prep.Remove(ctx)
		}
	}()
	// The last command's holder scan may have quarantined the scope while
	// this one waited for it (Pool.Acquire).
	if err := ws.CheckQuarantine(); err != nil {
		return tools.CommandResult{}, err
	}
	if prep != nil && !prep.current(image) {
		// The image's tag names another image now (rebuilt): this
		// command runs in a container of the new one, by the same name.
		p := prep
		prep = nil
		if err := p.Remove(ctx); err != nil {
			return tools.CommandResult{}, policy.Errorf(policy.SandboxUnavailable, "%v", err)
		}
	}
	if err := proj.Probe(ctx); err != nil {
		return tools.CommandResult{}, policy.Errorf(policy.SandboxUnavailable, "the workspace projection failed its health probe, so no container was started: %v", err)
	}
	p := prep
	prep = nil // Run removes it
	res, err := c.Runner.Run(ctx, Request{
		Command:   req.Command,
		Timeout:   req.Timeout,
		Workspace: proj.Dir(),
		Skills:    c.Skills,
		Scope:     ws.Scope().String(),
		ScopeHash: ws.Scope().Hash(),
		Run:       c.Run,
		Call:      req.CallID,
		Marker:    hooks,
		Name:      name,
		Prepared:  p,
	})
	hooks.mu.Lock()
	hooks.id = res.ContainerID
	hooks.mu.Unlock()
	if lease != nil && lease.Reused() > 0 && err == nil && !res.TimedOut {
		// Answered now: the scan and the next container come after.
		settled = true
		lease.after(func() { c.afterAnswer(ws, held, hooks, lease, res.ContainerName, err) })
		return c.answer(res, err, &refused)
	}
	if holders := held(); len(holders) > 0 {
		reason := fmt.Sprintf("after container %s was removed, its projection was still held by %s", res.ContainerName, holderNames(holders))
		if err != nil {
			reason += "; the command had failed: " + policy.MaskHostPaths(err.Error())
		}
		if qerr := hooks.quarantineHeld(reason, holders); qerr != nil {
			return tools.CommandResult{}, fmt.Errorf("%s; and quarantining failed: %w", reason, qerr)
		}
		return tools.CommandResult{}, policy.Errorf(policy.Quarantined, "%s, so the workspace is quarantined until an administrator makes sure those processes are gone and clears it", reason)
	}
	if errors.Is(err, ErrQuarantined) {
		if qerr := hooks.quarantine(err.Error()); qerr != nil {
			return tools.CommandResult{}, fmt.Errorf("%v; and quarantining failed: %w", err, qerr)
		}
		return tools.CommandResult{}, policy.Errorf(policy.Quarantined, "the container's removal could not be confirmed, so the workspace is quarantined until an administrator clears it: %v", err)
	}
	return c.answer(res, err, &refused)
}

// answer is the tool result of a command whose container is confirmed gone.
func (c *Commands) answer(res Result, err error, refused *Refusals) (tools.CommandResult, error) {
	out := tools.CommandResult{
		ExitCode:        res.ExitCode,
		Stdout:          res.Stdout,
		Stderr:          res.Stderr,
		TimedOut:        res.TimedOut,
		StdoutTruncated: res.StdoutTruncated,
		StderrTruncated: res.StderrTruncated,
		Container:       res.ContainerName,
		DurationMS:      res.Duration.Milliseconds(),
		// The container is gone: nothing more reaches the projection.
		PolicyEvents: refused.Events(),
	}
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return out, policy.Errorf(policy.Cancelled, "the command was cancelled; its container was removed")
		}
		if errors.Is(err, ErrStartFailed) {
			return out, policy.Errorf(policy.SandboxStartFailed, "%v", err)
		}
		if errors.Is(err, ErrEngineBusy) {
			// A model is told to retry later (policy.Public).
			return out, &policy.Error{Code: policy.SandboxUnavailable, Message: err.Error(), Err: err}
		}
		if errors.Is(err, ErrInvalidRequest) {
			return out, policy.Errorf(policy.InvalidInput, "%v", err)
		}
		return out, err
	}
	return out, nil
}

// afterAnswer is what is left of a pooled command once it was answered
// (in a recently used scope, and ended by itself):
// the scan for processes that still hold its projection, which
// quarantines the scope if it finds any, as it did before the answer; and,
// when the projection goes back to the pool, the container of the
// scope's next command (Runner.Prepare).
func (c *Commands) afterAnswer(ws *store.Workspace, held func() []store.Holder, hooks *markerHooks, lease *Lease, container string, cmdErr error) {
	if holders := held(); len(holders) > 0 {
		reason := fmt.Sprintf("after container %s was removed, its projection was still held by %s (found after the command was answered)", container, holderNames(holders))
		if cmdErr != nil {
			reason += "; the command had failed: " + policy.MaskHostPaths(cmdErr.Error())
		}
		if qerr := hooks.quarantineHeld(reason, holders); qerr != nil {
			c.audit("quarantine_failed", ws.Scope(), hooks, map[string]any{"reason": reason, "error": qerr.Error()})
		}
		return
	}
	if !lease.wantsSpare() {
		return
	}
	sc := ws.Scope()
	sp, err := c.Runner.Prepare(context.Background(), Request{Workspace: lease.Dir(), Skills: c.Skills,
		Scope: sc.String(), ScopeHash: sc.Hash(), Run: c.Run})
	if err != nil {
		c.audit("container_prepare_failed", sc, hooks, map[string]any{"error": policy.MaskHostPaths(err.Error())})
		return
	}
	if !lease.offer(sp) {
		sp.Remove(context.Background())
	}
}

// projection returns a projection of ws to run the command call over: the
// pool's live one, or one mounted for this command alone.
func (c *Commands) projection(ctx context.Context, ws *store.Workspace, call CallInfo) (Projection, uint64, *Lease, error) {
	if c.Pool != nil {
		l, err := c.Pool.Acquire(ctx, ws, call)
		if err != nil {
			return nil, 0, nil, policy.Errorf(policy.SandboxUnavailable, "mount the workspace projection: %v", err)
		}
		return l.Projection(), l.Dev(), l, nil
	}
	if err := os.MkdirAll(c.MountDir, 0o700); err != nil {
		return nil, 0, nil, fmt.Errorf("mount dir: %w", err)
	}
	sweepStaleMounts(c.MountDir)
	mp, err := os.MkdirTemp(c.MountDir, MountpointPrefix(ws.Scope()))
	if err != nil {
		return nil, 0, nil, fmt.Errorf("mountpoint: %w", err)
	}
	if err := shareMountpoint(mp); err != nil {
		os.Remove(mp)
		return nil, 0, nil, err
	}
	proj, err := c.Mount(ctx, ws, mp, call)
	if err != nil {
		removeMountpoint(mp)
		return nil, 0, nil, policy.Errorf(policy.SandboxUnavailable, "mount the workspace projection: %v", err)
	}
	var st unix.Stat_t
	if err := unix.Stat(proj.Dir(), &st); err != nil {
		proj.Unmount()
		removeMountpoint(mp)
		return nil, 0, nil, policy.Errorf(policy.SandboxUnavailable, "the workspace projection does not answer: %v", err)
	}
	return removingDir{proj, mp}, st.Dev, nil, nil
}

// MountpointPrefix is how the name of every mountpoint of sc's command
// projections begins, "ws-" and the first 12 digits of its hash, so that
// an operator (or a test) tells whose projection a mount in the mount
// directory is without asking the mount.
func MountpointPrefix(sc store.Scope) string {
	h := sc.Hash()
	return "ws-" + h[:min(12, len(h))] + "-"
}

// removingDir removes a command's own mountpoint after the unmount.
type removingDir struct {
	Projection
	mp string
}

func (r removingDir) Unmount() error {
	err := r.Projection.Unmount()
	removeMountpoint(r.mp)
	return err
}

// Refusals collects the refusals one command met in its projection, from
// the mount's goroutines, for the command's result. The zero value is
// ready to use.
type Refusals struct {
	mu sync.Mutex
	ev tools.PolicyEvents
}

// Add is a CallInfo.Refused.
func (r *Refusals) Add(e tools.PolicyEvent) {
	r.mu.Lock()
	r.ev.Add(e)
	r.mu.Unlock()
}

// Events returns what was collected, an empty list rather than none.
func (r *Refusals) Events() tools.PolicyEvents {
	r.mu.Lock()
	defer r.mu.Unlock()
	ev := r.ev
	if ev.Events == nil {
		ev.Events = []tools.PolicyEvent{}
	}
	return ev
}

// markerHooks keeps the execution marker in the scope's state directory.
type markerHooks struct {
	ws   *store.Workspace
	mu   sync.Mutex
	last store.Marker
	id   string // the engine's id of the container, once created
}

func (h *markerHooks) Set(ctx context.Context, m Marker) error {
	sm := store.Marker{Container: m.Container, Node: m.Node, PID: m.PID, PIDStart: m.PIDStart, Run: m.Run, Call: m.Call, Time: m.Time}
	h.mu.Lock()
	h.last = sm
	h.mu.Unlock()
	return h.ws.SetMarker(sm)
}

func (h *markerHooks) Clear(ctx context.Context) error { return h.ws.ClearMarker() }

func (h *markerHooks) quarantine(reason string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ws.Quarantine(h.last, reason)
}

func (h *markerHooks) containerID() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.id
}

// quarantineHeld quarantines the scope naming the processes that hold its
// projection. The marker was cleared once the container was confirmed gone,
// so the record is the last marker set, now with the holders.
func (h *markerHooks) quarantineHeld(reason string, holders []store.Holder) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.last
	m.Holders = holders
	return h.ws.Quarantine(m, reason)
}

// holderGrace is how long a process seen holding a projection after its
// container's removal may take to go before it counts as a holder: a
// runtime's helpers exit moments after the engine reports the removal.
const holderGrace = 2 * time.Second

// release returns a function, called once the command is over, that takes
// the projection down within the cleanup timeout and returns the processes,
// not this one, that still held it. With holders the session is aborted
// first, so that neither they nor the unmount wait on it; a session that
// does not end in time is aborted and detached too. A pooled projection
// (lease) nothing holds goes back to the pool instead. Later calls return
// the first answer.
func (c *Commands) release(proj Projection, dev uint64, sc store.Scope, h *markerHooks, lease *Lease) func() []store.Holder {
	var once sync.Once
	var held []store.Holder
	return func() []store.Holder {
		once.Do(func() {
			dir := proj.Dir()
			deadline := time.Now().Add(holderGrace)
			for {
				held, _ = Holders(dir, dev, h.containerID())
				if len(held) == 0 || time.Now().After(deadline) {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if len(held) == 0 && lease != nil {
				lease.Release()
				return
			}
			if lease != nil {
				lease.Discard()
			}
			if len(held) > 0 {
				abortConnection(dir, dev)
				c.audit("projection_held", sc, h, map[string]any{"holders": held})
			}
			done := make(chan error, 1)
			go func() { done <- proj.Unmount() }()
			select {
			case <-done:
			case <-time.After(c.Runner.cfg.CleanupTimeout):
				abortConnection(dir, dev)
				unix.Unmount(dir, unix.MNT_DETACH)
				c.audit("projection_detached", sc, h, map[string]any{"error": "the projection's session did not end within the cleanup timeout"})
			}
		})
		return held
	}
}

// audit records a projection event through the runner's observer.
func (c *Commands) audit(op string, sc store.Scope, h *markerHooks, extra map[string]any) {
	if c.Runner.cfg.Observe == nil {
		return
	}
	h.mu.Lock()
	m := h.last
	h.mu.Unlock()
	detail := map[string]any{"container": m.Container, "node": c.Runner.cfg.Node, "scope": sc.String(),
		"scope_hash": sc.Hash(), "run": m.Run, "call": m.Call}
	for k, v := range extra {
		detail[k] = v
	}
	c.Runner.cfg.Observe(context.Background(), op, detail)
}

// DefaultMountDir is where projections for commands are mounted: inside a
// root-only directory, so allow_other exposes them to no other user.
const DefaultMountDir = "/run/loomfs/mnt"

// sweepStaleMounts detaches projections whose daemon died (the kernel
// answers ENOTCONN) and removes their mountpoints. Live mounts of other
// processes answer and are left alone. statfs, not stat: stat can still be
// answered from the kernel's attribute cache for a while after the daemon
// died. Mounts are asked at once, and one that does not answer within
// sweepWait (its daemon stuck, or dying and blocked on a file open through
// its own mount) is not waited for, nor asked again until it answers.
func sweepStaleMounts(dir string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	answered := make(chan struct{}, len(ents))
	asked := 0
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		if _, asking := sweeping.LoadOrStore(p, true); asking {
			continue
		}
		asked++
		go func() {
			defer func() { sweeping.Delete(p); answered <- struct{}{} }()
			var st unix.Statfs_t
			switch err := unix.Statfs(p, &st); {
			case err == unix.ENOTCONN:
				unix.Unmount(p, unix.MNT_DETACH)
				removeMountpoint(p) // and the shared bind under it
			case err == nil && leftBind(p):
				removeMountpoint(p)
			}
		}()
	}
	timeout := time.After(sweepWait)
	for ; asked > 0; asked-- {
		select {
		case <-answered:
		case <-timeout:
			return
		}
	}
}

// leftBind reports whether p is a shared bind of shareMountpoint with no
// projection on it, made long enough ago that no process is about to mount
// one there: a worker killed between the two mounts, or between the two
// unmounts, left it.
func leftBind(p string) bool {
	var st unix.Stat_t
	fs, mounted := topMount(p)
	return mounted && !strings.HasPrefix(fs, "fuse") && unix.Lstat(p, &st) == nil &&
		time.Since(time.Unix(st.Mtim.Unix())) > leftBindAge
}

// leftBindAge is how old a bare bind in the mount directory must be to be
// taken for a leftover; a mount takes seconds at most.
const leftBindAge = 10 * time.Minute

// sweepWait bounds how long a sweep waits for the mounts it asks.
const sweepWait = time.Second

// sweeping holds the mountpoints a sweep is asking, so that a mount that
// does not answer costs one blocked thread, not one per sweep.
var sweeping sync.Map
