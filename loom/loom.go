package loom

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/budget"
	"github.com/agentloom/loomfs/fusefs"
	"github.com/agentloom/loomfs/hooks"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/process"
	"github.com/agentloom/loomfs/sandbox"
	"github.com/agentloom/loomfs/stage"
	"github.com/agentloom/loomfs/store"
	"github.com/agentloom/loomfs/tools"
)

// Config configures a Node. Nothing is read from the environment here;
// sandbox.ConfigFromEnv and the CLI's flags do that.
type Config struct {
	Store   store.Config   // the volume
	Policy  *policy.Policy // nil means policy.Default()
	Sandbox sandbox.Config // the engine, image, runtime and this worker's node name
	// MountDir is the root-only directory for the projections of commands
	// and session sandboxes; "" means sandbox.DefaultMountDir.
	MountDir string
	// Processes runs the process tools. nil: the Node's own
	// process.Service (Node.Processes), so processes live as long as this
	// program; a nodeservice.Client reaches another program's (loomfs
	// serve) instead.
	Processes tools.ProcessRunner
	// Hooks are the platform's tool.before and tool.after Go hooks
	// (package hooks), run before the policy file's command hooks on every
	// session's tool calls. nil: the policy's alone.
	Hooks *hooks.Chain
	Log   *zap.Logger // nil: discarded

	// Observe, if set, is handed every audit log the Node opens and
	// returns the sink the doors record into instead (metrics.Registry.Sink
	// counts what passes): the doors themselves know nothing of it.
	Observe func(audit.Sink) audit.Sink
	// Requests is given to every mount the Node makes, as
	// fusefs.Options.Requests.
	Requests func(op string, errno syscall.Errno, took time.Duration)
	// Mounted, if set, is told of every projection the Node mounts for a
	// command or a session sandbox (a periodic self-check probes it);
	// the func it returns is called once the projection is unmounted.
	Mounted func(sc store.Scope, m *fusefs.Mounted) (unmounted func())
}

// Node is loomfs on one worker. It is safe for concurrent use.
type Node struct {
	cfg Config

	hooksOnce sync.Once
	hooks     *hooks.Chain
	hooksErr  error

	once      sync.Once
	runner    *sandbox.Runner
	svc       *process.Service
	err       error
	sweepOnce sync.Once
	swept     <-chan struct{} // closed when SweepStaleMounts's sweep is done

	poolsMu sync.Mutex
	pools   map[*sandbox.Pool]bool // the sessions' command pools, closed at a fence
}

// New returns a Node over cfg. It connects to nothing until it must.
func New(cfg Config) *Node {
	if cfg.Policy == nil {
		cfg.Policy = policy.Default()
	}
	if cfg.MountDir == "" {
		cfg.MountDir = sandbox.DefaultMountDir
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	return &Node{cfg: cfg}
}

// SweepStaleMounts starts a sweep of the mount directory in the
// background: projections whose daemon is gone (a worker killed during a
// command leaves a dead FUSE mount there) are detached and their
// mountpoints removed. A long-lived process that serves projections
// (loomfs serve, loomfs mcp) calls it when it starts; a command's
// projection sweeps again before it is made. The sweep asks each mount
// for its statistics, which a dead one answers at once; it runs beside the
// Node's work, so a live projection slow to answer (its daemon busy or
// stuck) never delays a call.
func (n *Node) SweepStaleMounts() {
	n.sweepOnce.Do(func() {
		done := make(chan struct{})
		n.swept = done
		go func() {
			sandbox.SweepStaleMounts(n.cfg.MountDir)
			close(done)
		}()
	})
}

// sweepWait bounds how long Close waits for the start's sweep.
const sweepWait = 100 * time.Millisecond

// observe is the sink the doors record into for log (Config.Observe).
func (n *Node) observe(log *audit.Log) audit.Sink {
	if n.cfg.Observe == nil {
		return log
	}
	return n.cfg.Observe(log)
}

// Close stops the Node's own session sandboxes, if it started any, and
// waits until their containers are confirmed gone.
func (n *Node) Close() error {
	n.sweepOnce.Do(func() {}) // none starts after Close
	if n.swept != nil {
		select {
		case <-n.swept:
		case <-time.After(sweepWait):
		}
	}
	if n.svc == nil {
		return nil
	}
	err := n.svc.Close()
	n.runner.Close()
	return err
}

// OpenWorkspace opens the scope named SPACE/AGENT/SESSION[/RUN/INSTANCE],
// or run:RUN[/INSTANCE] to resume a run through its recorded binding
// (SPEC §2.3): its volume, layout and scope as they were when it was
// created, or the legacy run directory for a run from before bindings.
func (n *Node) OpenWorkspace(ctx context.Context, scope string) (*store.Workspace, func(), error) {
	if run, ok := strings.CutPrefix(scope, "run:"); ok {
		return n.resumeRun(ctx, run)
	}
	sc, err := store.ParseScope(scope)
	if err != nil {
		return nil, nil, err
	}
	vol, err := store.OpenVolume(ctx, n.cfg.Store)
	if err != nil {
		return nil, nil, err
	}
	ws, err := vol.Open(ctx, sc, n.cfg.Policy)
	if err != nil {
		vol.Close()
		return nil, nil, err
	}
	return layoutRecorded(ctx, ws, func() { n.closeWorkspace(ws); vol.Close() })
}

// closeWorkspace closes ws, logging what it could not finish: a quota
// share left unfolded is folded in by the next holder, but an operator
// whose account drifts wants to see why.
func (n *Node) closeWorkspace(ws *store.Workspace) {
	if err := ws.Close(); err != nil {
		n.cfg.Log.Warn("close workspace", zap.String("scope", ws.Scope().String()), zap.Error(err))
	}
}

// layoutRecorded audits the layout directories opening ws made, closing
// it on failure.
func layoutRecorded(ctx context.Context, ws *store.Workspace, done func()) (*store.Workspace, func(), error) {
	if err := RecordLayout(ctx, ws); err != nil {
		done()
		return nil, nil, err
	}
	return ws, done, nil
}

// RecordLayout audits, as the platform's, the layout directories opening
// ws made (none once the scope has them), before any door serves it.
func RecordLayout(ctx context.Context, ws *store.Workspace) error {
	if len(ws.LayoutMade()) == 0 {
		return nil
	}
	log, err := audit.Open(ws.Volume().Path(), audit.Options{})
	if err != nil {
		return AuditUnavailable(err)
	}
	defer log.Close()
	return (&stage.Platform{WS: ws, Audit: log, Actor: Actor(ws.Scope())}).RecordLayout(ctx)
}

func (n *Node) resumeRun(ctx context.Context, arg string) (*store.Workspace, func(), error) {
	runID, instance, child := strings.Cut(arg, "/")
	if err := store.ValidateID("run", runID); err != nil {
		return nil, nil, err
	}
	if child {
		if err := store.ValidateID("instance", instance); err != nil {
			return nil, nil, err
		}
	}
	r, err := store.ResumeRun(ctx, n.cfg.Store, runID)
	if err != nil {
		return nil, nil, err
	}
	var ws *store.Workspace
	if child {
		ws, err = r.Instance(ctx, instance, n.cfg.Policy)
	} else {
		ws, err = r.Main(ctx, n.cfg.Policy)
	}
	if err != nil {
		r.Close()
		return nil, nil, err
	}
	return layoutRecorded(ctx, ws, func() { n.closeWorkspace(ws); r.Close() })
}

// Session is one scope opened for work: the workspace, its audit log, and
// the tools over them, whose commands run in sandbox containers over
// projections and whose processes run in the scope's session sandbox.
type Session struct {
	Workspace *store.Workspace
	Audit     *audit.Log
	Tools     *tools.Toolbox

	sink audit.Sink // Audit as the doors record into it (Config.Observe)

	node  *Node
	cmds  *lazyCommands
	close func()
}

// Open opens scope (as OpenWorkspace names it) and its audit log. The
// engine is reached only when a command or process first runs.
func (n *Node) Open(ctx context.Context, scope string) (*Session, error) {
	chain, err := n.toolHooks()
	if err != nil {
		return nil, err
	}
	ws, done, err := n.OpenWorkspace(ctx, scope)
	if err != nil {
		return nil, err
	}
	// The audit directory is on the volume: its storage may not answer.
	log, err := budget.Run(ctx, func() (*audit.Log, error) {
		return audit.Open(ws.Volume().Path(), audit.Options{})
	}, func(l *audit.Log) { l.Close() })
	if err != nil {
		done()
		if ctx.Err() != nil {
			return nil, policy.Errorf(policy.Timeout, "the audit log's storage did not answer within the call's budget; retry later")
		}
		return nil, AuditUnavailable(err)
	}
	procs := n.cfg.Processes
	if procs == nil {
		procs = &lazyProcesses{n}
	}
	sink := n.observe(log)
	s := &Session{Workspace: ws, Audit: log, sink: sink, node: n, cmds: &lazyCommands{n: n, log: sink}}
	s.Tools = &tools.Toolbox{
		WS:        ws,
		Audit:     sink,
		Commands:  s.cmds,
		Processes: procs,
		Actor:     Actor(ws.Scope()),
		Log:       n.cfg.Log,
		Hooks:     chain,
	}
	s.close = func() {
		s.cmds.close()
		if err := log.Close(); err != nil {
			n.cfg.Log.Warn("close audit log", zap.Error(err))
		}
		done()
	}
	return s, nil
}

// toolHooks is the sessions' hook chain: the Config's Go hooks, then the
// policy file's command hooks. nil when there are none, so a call pays
// nothing for them.
func (n *Node) toolHooks() (*hooks.Chain, error) {
	n.hooksOnce.Do(func() {
		cmds, err := hooks.FromPolicy(n.cfg.Policy.Hooks, tools.Names)
		if err != nil {
			n.hooksErr = &policy.Error{Code: policy.InvalidInput, Message: "the policy's hooks: " + err.Error(), Err: err}
			return
		}
		if ch := hooks.Join(n.cfg.Hooks, cmds); !ch.Empty() {
			n.hooks = ch
		}
	})
	return n.hooks, n.hooksErr
}

// Close closes the session's workspace and audit log. A program that
// goes on after it calls Tools.Wait first, for calls that outlived their
// caller's budget.
func (s *Session) Close() { s.close() }

// Project mounts the session's projection at mountpoint (SPEC §3): the
// same policy as the tools, audited in the session's log.
func (s *Session) Project(ctx context.Context, mountpoint string, opts fusefs.Options) (*fusefs.Mounted, error) {
	if opts.Audit == nil {
		opts.Audit = s.sink
	}
	if opts.Requests == nil {
		opts.Requests = s.node.cfg.Requests
	}
	return fusefs.Mount(ctx, s.Workspace, mountpoint, opts)
}

// Actor names a scope's ids for audit records.
func Actor(sc store.Scope) audit.Actor {
	return audit.Actor{Space: sc.Space, Agent: sc.Agent, Session: sc.Session, Run: sc.Run, Instance: sc.Instance}
}

// AuditUnavailable is the refusal when the audit log can't be written.
func AuditUnavailable(err error) error {
	return policy.Unavailable(policy.AuditUnavailable, "the audit log", err)
}

// SandboxUnavailable is the refusal when the engine does not answer.
func SandboxUnavailable(err error) error {
	return &policy.Error{Code: policy.SandboxUnavailable, Message: "no sandbox engine: " + err.Error() + " (run scripts/setup, or make sure dockerd answers on AGENT_LOOM_DOCKER_HOST)", Err: err}
}

// lazyCommands connects to the Docker engine on the first command only, so
// file tools work on a machine without one.
type lazyCommands struct {
	n    *Node
	log  audit.Sink
	once sync.Once
	cmds *sandbox.Commands
	err  error
}

func (l *lazyCommands) RunCommand(ctx context.Context, ws *store.Workspace, req tools.CommandRequest) (tools.CommandResult, error) {
	if ws.Policy().SessionCommands() {
		r, err := l.n.sessionCommands(ctx)
		if err != nil {
			return tools.CommandResult{}, err
		}
		res, err := r.RunCommand(ctx, ws, req)
		return l.n.fencedAfter(ctx, res, err)
	}
	l.once.Do(func() { l.cmds, l.err = l.n.newCommands(ctx, ws, l.log) })
	if l.err != nil {
		return tools.CommandResult{}, l.err
	}
	res, err := l.cmds.RunCommand(ctx, ws, req)
	return l.n.fencedAfter(ctx, res, err)
}

func (l *lazyCommands) close() {
	if l.cmds != nil {
		if err := l.cmds.Pool.Close(); err != nil {
			l.n.cfg.Log.Warn("unmount the session's projection", zap.Error(err))
		}
		l.n.poolsMu.Lock()
		delete(l.n.pools, l.cmds.Pool)
		l.n.poolsMu.Unlock()
		l.cmds.Runner.Close()
	}
}

// sessionCommands runs the commands of a "commands: session" policy: as
// execs in the scope's session sandbox, which lives where the process
// tools' processes do (the Node's own service, or loomfs serve's).
func (n *Node) sessionCommands(ctx context.Context) (tools.CommandRunner, error) {
	if n.cfg.Processes == nil {
		return n.Processes(ctx)
	}
	if r, ok := n.cfg.Processes.(tools.CommandRunner); ok {
		return r, nil
	}
	return nil, policy.Errorf(policy.SandboxUnavailable, "the policy says commands: session, but this node's process service does not run commands; set commands: fresh")
}

// newCommands builds the sandbox door: a Runner on the local engine and one
// projection of the scope kept for the session's commands (sandbox.Pool),
// each command's FUSE records carrying its own call and container.
func (n *Node) newCommands(ctx context.Context, ws *store.Workspace, log audit.Sink) (*sandbox.Commands, error) {
	cfg := n.cfg.Sandbox
	actor := Actor(ws.Scope())
	cfg.Observe = func(ctx context.Context, op string, detail map[string]any) {
		ev := audit.Event{Actor: actor, Scope: ws.Scope().Hash(), Source: audit.SourceSandbox, Op: op, Result: "ok", Detail: detail}
		if c, ok := detail["container"].(string); ok {
			ev.Actor.Container = c
		}
		if c, ok := detail["call"].(string); ok {
			ev.CallID = c
		}
		log.Record(ctx, ev)
	}
	r, err := sandbox.NewRunner(ctx, cfg)
	if err != nil {
		return nil, SandboxUnavailable(err)
	}
	n.ReportOrphans(ctx, r)
	mount := func(ctx context.Context, ws *store.Workspace, mountpoint string, call sandbox.CallInfo) (sandbox.Projection, error) {
		a := actor
		a.Container = call.Container
		// The projection records on its requests' path and outlives the
		// command: it gets a queued log of its own (audit.Options.Queue),
		// closed when it is unmounted. The session's log, shared with the
		// tool door, stays synchronous.
		plog, err := audit.Open(ws.Volume().Path(), audit.Options{Queue: audit.DefaultQueue})
		if err != nil {
			return nil, AuditUnavailable(err)
		}
		m, err := fusefs.Mount(ctx, ws, mountpoint, fusefs.Options{
			AllowOther: true,
			Audit:      n.observe(plog),
			Requests:   n.cfg.Requests,
			Actor:      a,
			CallID:     call.CallID,
			Trace:      call.Trace,
			Refused:    policyEvent(call.Refused),
		})
		if err != nil {
			plog.Close()
			return nil, err
		}
		return servingMount{Mounted: m, log: plog, warn: n.cfg.Log, gone: n.mounted(ws.Scope(), m)}, nil
	}
	pool := &sandbox.Pool{Mount: mount, Dir: n.cfg.MountDir}
	n.poolsMu.Lock()
	if n.pools == nil {
		n.pools = map[*sandbox.Pool]bool{}
	}
	n.pools[pool] = true
	n.poolsMu.Unlock()
	return &sandbox.Commands{
		Runner: r,
		Run:    ws.Scope().Run,
		Pool:   pool,
	}, nil
}

// closePools closes the command pools of the Node's sessions: the
// containers prepared for their next commands are removed, their idle
// projections unmounted, and they take no more commands.
func (n *Node) closePools() error {
	n.poolsMu.Lock()
	pools := make([]*sandbox.Pool, 0, len(n.pools))
	for p := range n.pools {
		pools = append(pools, p)
	}
	n.poolsMu.Unlock()
	var errs []error
	for _, p := range pools {
		errs = append(errs, p.Close())
	}
	return errors.Join(errs...)
}

// servingMount is a mount the pool keeps for one command after another,
// with the audit log it alone uses, if it has one.
type servingMount struct {
	*fusefs.Mounted
	log  *audit.Log // nil: the mount records into a log its owner closes
	warn *zap.Logger
	gone func() // Config.Mounted's, called once unmounted
}

// mounted tells Config.Mounted of m and returns what to call once m is
// unmounted.
func (n *Node) mounted(sc store.Scope, m *fusefs.Mounted) func() {
	if n.cfg.Mounted == nil {
		return func() {}
	}
	return n.cfg.Mounted(sc, m)
}

// Unmount unmounts and then closes the mount's own log, whose queue the
// unmount's last requests may still fill.
func (s servingMount) Unmount() error {
	if s.gone != nil {
		s.gone()
	}
	err := s.Mounted.Unmount()
	if s.log == nil {
		return err
	}
	if cerr := s.log.Close(); cerr != nil {
		s.warn.Warn("close the projection's audit log", zap.Error(cerr))
	}
	return err
}

func (s servingMount) Serve(call sandbox.CallInfo) {
	s.Mounted.Serve(fusefs.Call{CallID: call.CallID, Trace: call.Trace, Container: call.Container, Refused: policyEvent(call.Refused)})
}

// policyEvent hands each refusal of a command's projection to refused,
// told the way a tool result tells it.
func policyEvent(refused func(tools.PolicyEvent)) func(fusefs.Refusal) {
	if refused == nil {
		return nil
	}
	return func(r fusefs.Refusal) {
		errno := unix.ErrnoName(r.Errno)
		if errno == "" {
			errno = strconv.Itoa(int(r.Errno))
		}
		refused(tools.PolicyEvent{Op: r.Op, Path: r.Path, Errno: errno, Code: string(r.Code), Message: r.Message})
	}
}

// ReportOrphans logs the loomfs containers on the engine that no live
// loomfs process owns (sandbox.Runner.Orphans) as this program starts using
// it: each command removes its container before it returns, so one whose
// owner is gone was left by a worker that died (its scope is then
// quarantined). Other calls' containers, starting or running, are not
// reported. Containers prepared for a command that never started
// (sandbox.Runner.SweepPrepared) are removed first: nothing ran in them.
func (n *Node) ReportOrphans(ctx context.Context, r *sandbox.Runner) {
	swept, err := r.SweepPrepared(ctx)
	for _, c := range swept {
		n.cfg.Log.Info("removed a container prepared for a command that never started, left by a loomfs process that is gone",
			zap.String("container", c.Name), zap.String("scope", c.Scope), zap.String("owner", c.Owner), zap.Time("created", c.Created))
	}
	if err != nil {
		n.cfg.Log.Warn("remove prepared containers left over", zap.Error(err))
	}
	list, err := r.Orphans(ctx)
	if err != nil {
		n.cfg.Log.Warn("list loomfs containers", zap.Error(err))
		return
	}
	for _, c := range list {
		n.cfg.Log.Warn("loomfs container found at start whose owner is gone: orphaned (see loomfs quarantine list)",
			zap.String("container", c.Name), zap.String("state", c.State), zap.String("scope", c.Scope),
			zap.String("node", c.Node), zap.String("call", c.Call), zap.String("owner", c.Owner), zap.Time("created", c.Created))
	}
}
