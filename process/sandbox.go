package process

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/sandbox"
	"github.com/agentloom/loomfs/store"
)

// keepAlive is the session container's own command: it does nothing but
// keep the container up for the execs.
const keepAlive = "mkdir -p /tmp/.loomfs && while :; do sleep 3600; done"

// sessionStartTimeout bounds the engine's start of a session container.
// An engine that does not answer in that time is stuck (dockerd was seen
// to deadlock in a burst of creations): the start fails, and the container
// is removed or the scope quarantined, instead of the caller waiting for
// good. sessionSlotWait bounds the wait for a start slot before it, as
// long as a command's (sandbox.MaxTimeout): the node's waiters are served
// in turn, so on a node with more starts queued than its engine does in a
// minute a session start waits behind the commands that came first (at 50
// agents it waited 70 s) rather than being refused sooner than they are.
var (
	sessionStartTimeout = 60 * time.Second // variables for tests
	sessionSlotWait     = sandbox.MaxTimeout
)

// Sandbox is a scope's session sandbox: one container over the scope's
// projection, alive across calls, in which processes run as execs.
type Sandbox struct {
	svc     *Service
	scope   store.Scope
	ws      *store.Workspace // the sandbox's own, open for its life
	log     audit.Sink
	closeWS func()
	release func() // the session lease
	proj    sandbox.Projection
	mp      string
	name    string
	id      string
	callID  string // the call that started it: its projection's records name it between commands
	started time.Time
	// tmpWasFull: /tmp was full when a process last ended, so a start asks
	// again (tmpUse); other starts don't ask.
	tmpWasFull atomic.Bool
	idle       time.Duration
	life       time.Duration
	output     int

	// The container's limits, for the answer that says one is spent.
	pidsLimit, memLimit int64
	gvisor              bool // the runtime is gVisor's runsc

	ctlMu   sync.Mutex
	control *controller // see tree.go

	// One host kill at a time (cgroup.go): a pass's thaw must not end
	// another's freeze. Read-held by each exec from its create until it
	// has started: the runtime refuses to exec in a frozen container, and
	// a process start must not fail for another process's end.
	hostKillMu sync.RWMutex

	mu       sync.Mutex
	procs    map[string]*Process
	nextGID  int  // the group id of the next process (tree.go)
	oomSeen  int  // OOM kills already told to a process's record
	endedOOM bool // the container ended for want of memory
	cmds     int  // workspace_command calls running as execs ("commands: session")
	lastUse  time.Time
	stopping bool
	done     chan struct{} // closed once stopped
	stopErr  error
}

// SandboxInfo describes a running session sandbox.
type SandboxInfo struct {
	Scope     string    `json:"scope"`
	Container string    `json:"container"`
	Node      string    `json:"node"`
	Started   time.Time `json:"started_at"`
	LastUse   time.Time `json:"last_use"`
	Running   int       `json:"running_processes"`
}

// startSandbox starts sc's session sandbox: the lease, the projection and
// its probe, the marker, then the container. The caller holds the scope
// lock. Anything that fails after the marker was set and can't be undone
// with confirmation quarantines the scope.
func startSandbox(ctx context.Context, svc *Service, sc store.Scope, callID string) (b *Sandbox, err error) {
	r := svc.cfg.Runner
	if err := r.CheckImage(ctx); err != nil {
		return nil, policy.Errorf(policy.SandboxUnavailable, "%v", err)
	}
	ws, log, closeWS, err := svc.cfg.Open(ctx, sc)
	if err != nil {
		return nil, err
	}
	lim, def := ws.Policy().Limits, policy.DefaultLimits()
	if lim.SessionIdle <= 0 {
		lim.SessionIdle = def.SessionIdle
	}
	if lim.SessionLifetime <= 0 {
		lim.SessionLifetime = def.SessionLifetime
	}
	if lim.ProcessOutput <= 0 {
		lim.ProcessOutput = def.ProcessOutput
	}
	b = &Sandbox{svc: svc, scope: sc, ws: ws, log: log, closeWS: closeWS, name: sandbox.NewContainerName(sc.Hash()), callID: callID,
		idle: lim.SessionIdle, life: lim.SessionLifetime, output: int(lim.ProcessOutput),
		procs: map[string]*Process{}, done: make(chan struct{}), nextGID: firstGID}
	// The undo steps use sb, not b: an error return sets the result b
	// to nil before the deferred undo runs.
	sb := b
	undo := []func(){closeWS}
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()
	release, ok, err := ws.TakeSessionLease()
	if err != nil {
		return nil, err
	}
	if !ok {
		if m, _ := ws.SessionMarkerOf(); m != nil && m.Node != svc.Node() {
			return nil, otherNode(m.Node, "this workspace's session sandbox")
		}
		return nil, policy.Errorf(policy.Conflict, "another worker holds this workspace's session sandbox; retry when it has ended")
	}
	b.release = release
	undo = append(undo, release)

	if err := os.MkdirAll(svc.cfg.MountDir, 0o700); err != nil {
		return nil, fmt.Errorf("mount dir: %w", err)
	}
	sandbox.SweepStaleMounts(svc.cfg.MountDir)
	b.mp, err = os.MkdirTemp(svc.cfg.MountDir, "session-")
	if err != nil {
		return nil, fmt.Errorf("mountpoint: %w", err)
	}
	undo = append(undo, func() { os.Remove(sb.mp) })
	fuseLog := audit.Sink(audit.Discard)
	if log != nil {
		fuseLog = attributing{log, b}
	}
	b.proj, err = svc.cfg.Mount(ctx, ws, fuseLog, b.mp, sandbox.CallInfo{CallID: callID, Run: sc.Run, Container: b.name})
	if err != nil {
		return nil, policy.Errorf(policy.SandboxUnavailable, "mount the workspace projection: %v", err)
	}
	undo = append(undo, func() { sb.unmount() })
	if err := b.proj.Probe(ctx); err != nil {
		return nil, policy.Errorf(policy.SandboxUnavailable, "the workspace projection failed its health probe, so no container was started: %v", err)
	}

	req := sandbox.Request{
		Command: keepAlive, Workspace: b.proj.Dir(), Skills: svc.cfg.Skills,
		Scope: sc.String(), ScopeHash: sc.Hash(), Run: sc.Run, Call: callID, Name: b.name,
		Marker: noMarker{},
	}
	if err := req.Check(); err != nil {
		return nil, policy.Errorf(policy.InvalidInput, "%v", err)
	}
	b.started = time.Now()
	m := store.Marker{Container: b.name, Node: svc.Node(), PID: pid(), Run: sc.Run, Call: callID, Time: b.started.UTC()}
	if err := ws.SetSessionMarker(m); err != nil {
		ws.ClearSessionMarker() // no container was asked for
		return nil, err
	}
	undo = append(undo, func() { ws.ClearSessionMarker() })

	cc, hc := r.ContainerConfig(req)
	init := true
	hc.Init = &init // reaps what the execs leave behind
	if hc.PidsLimit != nil {
		b.pidsLimit = *hc.PidsLimit
	}
	b.memLimit = hc.Memory
	b.gvisor = strings.HasPrefix(hc.Runtime, "runsc")
	cli := r.Engine()
	freeSlot, err := r.StartSlot(ctx, sessionSlotWait)
	if err != nil {
		if errors.Is(err, sandbox.ErrEngineBusy) {
			b.record("container_engine_busy", callID, 0, map[string]any{"session": true, "waited_ms": sessionSlotWait.Milliseconds()})
			// A model is told to retry later (policy.Public).
			return nil, &policy.Error{Code: policy.SandboxUnavailable, Message: err.Error(), Err: err}
		}
		return nil, err
	}
	started := sync.OnceFunc(freeSlot)
	defer started()
	octx := context.WithoutCancel(ctx)
	cctx, cancel := context.WithTimeout(octx, 30*time.Second)
	created, err := cli.ContainerCreate(cctx, cc, hc, nil, nil, b.name)
	cancel()
	if err != nil {
		// The create may have been done without an answer: remove by
		// name, and quarantine unless that is confirmed.
		if qerr := b.removeOrQuarantine(octx, b.name, callID, "create failed: "+err.Error()); qerr != nil {
			undo = undo[:len(undo)-1] // the marker moved into the quarantine
			return nil, qerr
		}
		return nil, policy.Errorf(policy.SandboxUnavailable, "create the session container: %v", policy.MaskHostPaths(err.Error()))
	}
	b.id = created.ID
	b.record("container_create", callID, 0, map[string]any{"image": r.Image(), "session": true})
	sctx, scancel := context.WithTimeout(octx, sessionStartTimeout)
	err = cli.ContainerStart(sctx, created.ID, container.StartOptions{})
	scancel()
	started()
	if err != nil {
		msg := policy.MaskHostPaths(err.Error())
		if qerr := b.removeOrQuarantine(octx, created.ID, callID, "start failed: "+msg); qerr != nil {
			undo = undo[:len(undo)-1]
			return nil, qerr
		}
		return nil, policy.Errorf(policy.SandboxStartFailed, "%v: %s", sandbox.ErrStartFailed, msg)
	}
	b.record("container_start", callID, 0, map[string]any{"session": true, "idle_timeout_ms": b.idle.Milliseconds(), "max_lifetime_ms": b.life.Milliseconds()})
	// The controller starts with the container, while a fork is sure to
	// succeed: it is what kills a process's tree at the pids limit.
	if b.control, err = b.startController(ctx); err != nil {
		msg := policy.MaskHostPaths(err.Error())
		if qerr := b.removeOrQuarantine(octx, created.ID, callID, "controller failed: "+msg); qerr != nil {
			undo = undo[:len(undo)-1]
			return nil, qerr
		}
		return nil, policy.Errorf(policy.SandboxStartFailed, "%v: %s", sandbox.ErrStartFailed, msg)
	}
	b.lastUse = time.Now()
	svc.wg.Add(1)
	go b.watch()
	return b, nil
}

// noMarker satisfies sandbox.Request's check: the session's marker is set
// by startSandbox itself, for the container's life.
type noMarker struct{}

func (noMarker) Set(context.Context, sandbox.Marker) error { return nil }
func (noMarker) Clear(context.Context) error               { return nil }

// removeOrQuarantine removes ref with confirmation; if that fails the
// scope is quarantined with the session marker.
func (b *Sandbox) removeOrQuarantine(ctx context.Context, ref, callID, why string) error {
	r := b.svc.cfg.Runner
	if fz, ok := hostFreezer(ref); ok {
		fz.thaw() // a kill pass that failed to thaw would keep the KILL from landing
	}
	cctx, cancel := context.WithTimeout(ctx, r.CleanupTimeout())
	defer cancel()
	err := r.RemoveConfirmed(cctx, ref)
	if err == nil {
		b.record("container_removed", callID, 0, map[string]any{"session": true})
		return nil
	}
	b.record("container_remove_unconfirmed", callID, 0, map[string]any{"session": true, "error": err.Error()})
	reason := fmt.Sprintf("session container %s: %s; its removal was not confirmed: %v", b.name, why, err)
	if b.svc.writesNothing() {
		return fmt.Errorf("%s; not quarantined: this node was fenced and writes nothing", reason)
	}
	m := store.Marker{Container: b.name, Node: b.svc.Node(), PID: pid(), Run: b.scope.Run, Call: callID, Time: b.started.UTC()}
	if qerr := b.ws.QuarantineSession(m, reason); qerr != nil {
		return fmt.Errorf("%s; and quarantining failed: %w", reason, qerr)
	}
	return policy.Errorf(policy.Quarantined, "the session container's removal could not be confirmed, so the workspace is quarantined until an administrator clears it")
}

func (b *Sandbox) alive() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return !b.stopping
}

// touch counts a call as use, for the idle timeout.
func (b *Sandbox) touch() {
	b.mu.Lock()
	b.lastUse = time.Now()
	b.mu.Unlock()
}

// watch stops the sandbox once it has been idle (no running process, no
// call) for the policy's session_idle, or alive for its session_lifetime.
func (b *Sandbox) watch() {
	defer b.svc.wg.Done()
	tick := min(time.Second, b.idle/4)
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-b.done:
			return
		case <-t.C:
		}
		b.mu.Lock()
		running := b.cmds
		for _, p := range b.procs {
			if !p.exited() {
				running++
			}
		}
		if running > 0 {
			b.lastUse = time.Now()
		}
		idle := time.Since(b.lastUse)
		b.mu.Unlock()
		switch {
		case time.Since(b.started) >= b.life:
			b.Stop(context.Background(), "max_lifetime", "")
		case idle >= b.idle:
			b.Stop(context.Background(), "idle_timeout", "")
		}
	}
}

// Stop ends the sandbox: its container is removed with confirmation (its
// processes end with it), then the marker is cleared, the projection
// unmounted and the lease released. Unconfirmed removal quarantines the
// scope. Stopping twice waits for the first.
func (b *Sandbox) Stop(ctx context.Context, reason, callID string) error {
	b.mu.Lock()
	if b.stopping {
		b.mu.Unlock()
		<-b.done
		return b.stopErr
	}
	b.stopping = true
	b.mu.Unlock()
	defer close(b.done)
	defer b.svc.forget(b)

	octx := context.WithoutCancel(ctx)
	b.record("container_kill", callID, 0, map[string]any{"session": true, "reason": reason})
	b.ctlMu.Lock()
	if b.control != nil {
		b.control.close()
	}
	b.ctlMu.Unlock()
	err := b.removeOrQuarantine(octx, b.id, callID, reason)
	b.mu.Lock()
	procs := make([]*Process, 0, len(b.procs))
	for _, p := range b.procs {
		procs = append(procs, p)
	}
	b.mu.Unlock()
	b.mu.Lock()
	oom := b.endedOOM
	b.mu.Unlock()
	for _, p := range procs {
		p.ended(reason, oom)
	}
	if err == nil && !b.svc.writesNothing() { // a fenced node's marker is the taking-over node's
		if cerr := b.ws.ClearSessionMarker(); cerr != nil {
			err = cerr
		}
	}
	b.unmount()
	os.Remove(b.mp)
	b.release()
	b.closeWS()
	b.stopErr = err
	if err != nil {
		b.svc.cfg.Log.Warn("session sandbox stop", zap.String("container", b.name), zap.Error(err))
	}
	return err
}

// unmount takes the projection down, detaching it if its session hangs.
func (b *Sandbox) unmount() {
	if b.proj == nil {
		return
	}
	done := make(chan error, 1)
	go func() { done <- b.proj.Unmount() }()
	select {
	case <-done:
	case <-time.After(b.svc.cfg.Runner.CleanupTimeout()):
		unix.Unmount(b.proj.Dir(), unix.MNT_DETACH)
		b.record("projection_detached", "", 0, map[string]any{"session": true})
	}
}

// Info describes the sandbox.
func (b *Sandbox) Info() SandboxInfo {
	b.mu.Lock()
	defer b.mu.Unlock()
	running := 0
	for _, p := range b.procs {
		if !p.exited() {
			running++
		}
	}
	return SandboxInfo{Scope: b.scope.String(), Container: b.name, Node: b.svc.Node(), Started: b.started, LastUse: b.lastUse, Running: running}
}

// running reports whether the sandbox's container still runs. A container
// whose init ended (under gVisor, a fork bomb or the memory limit ends the
// whole sandbox) is stopped by the caller, so the next call starts afresh.
func (b *Sandbox) running(ctx context.Context) (running bool, oomKilled bool, err error) {
	ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	st, err := b.svc.cfg.Runner.Engine().ContainerInspect(ictx, b.id)
	if err != nil {
		if cerrdefs.IsNotFound(err) {
			return false, false, nil
		}
		return false, false, err
	}
	if st.State == nil {
		return false, false, nil
	}
	return st.State.Running, st.State.OOMKilled, nil
}

// endedWithin reports whether the sandbox's container is seen to have
// ended within d, and whether the memory limit ended it. The engine may
// learn of the memory limit's kill a moment after the end (under gVisor
// the runtime's shim reports the two apart): an end without it is asked
// about again for oomSettle.
func (b *Sandbox) endedWithin(ctx context.Context, d time.Duration) (ended, oomKilled bool) {
	for deadline := time.Now().Add(d); ; {
		running, oomKilled, err := b.running(ctx)
		if err == nil && !running {
			for settle := time.Now().Add(oomSettle); !oomKilled && time.Now().Before(settle); {
				time.Sleep(100 * time.Millisecond)
				if _, o, err := b.running(ctx); err == nil {
					oomKilled = o
				}
			}
			return true, oomKilled
		}
		if time.Now().After(deadline) {
			return false, false
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// oomSettle is how long an ended container's record is watched for the
// memory limit's kill.
const oomSettle = time.Second

// died stops a sandbox whose container ended on its own, from a
// goroutine of the service's, and returns why it ended: its processes are
// marked ended (by the memory limit when the engine says so), the
// container removed with confirmation, and the next process start starts
// a new sandbox.
func (b *Sandbox) died(oomKilled bool) string {
	reason := "the session container ended on its own (under gVisor a process tree that spends the pids limit ends the whole sandbox); the next process starts a new one"
	if oomKilled {
		reason = fmt.Sprintf("the session container ran out of memory (limit %s) and ended; the next process starts a new one", policy.Bytes(b.memLimit))
	}
	b.mu.Lock()
	b.endedOOM = oomKilled
	b.mu.Unlock()
	b.svc.wg.Add(1)
	go func() {
		defer b.svc.wg.Done()
		b.Stop(context.Background(), reason, "")
	}()
	return reason
}

// newOOMKill reports whether the container's memory cgroup counted an OOM
// kill not yet told to a process, and counts it told.
func (b *Sandbox) newOOMKill(ctx context.Context) bool {
	n := b.oomKills(ctx)
	b.mu.Lock()
	defer b.mu.Unlock()
	if n > b.oomSeen {
		b.oomSeen++
		return true
	}
	return false
}

// errStopped answers a call on a sandbox that is going away.
var errStopped = errors.New("the session sandbox has stopped")
