package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/budget"
	"github.com/agentloom/loomfs/fusefs"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/sandbox"
	"github.com/agentloom/loomfs/stage"
	"github.com/agentloom/loomfs/store"
	"github.com/agentloom/loomfs/tools"
)

// session is everything one command opens over one scope: the volume, the
// workspace, the audit log, and the tools over them.
type session struct {
	ws    *store.Workspace
	log   *audit.Log
	tools *tools.Toolbox
	close func()
}

// actorOf names the scope's ids for audit records.
func actorOf(sc store.Scope) audit.Actor {
	return audit.Actor{Space: sc.Space, Agent: sc.Agent, Session: sc.Session, Run: sc.Run, Instance: sc.Instance}
}

// openSession opens the scope, its audit log and a Toolbox whose
// workspace_command runs in a sandbox over a fresh projection.
func (g *globals) openSession(ctx context.Context, scopeArg string) (*session, error) {
	ws, done, err := g.openWorkspace(ctx, scopeArg)
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
		return nil, auditUnavailable(err)
	}
	cmds := &lazyCommands{g: g, log: log}
	s := &session{
		ws:  ws,
		log: log,
		tools: &tools.Toolbox{
			WS:       ws,
			Audit:    log,
			Commands: cmds,
			Actor:    actorOf(ws.Scope()),
			Log:      g.log,
		},
	}
	s.close = func() {
		cmds.close()
		if err := log.Close(); err != nil {
			g.log.Warn("close audit log", zap.Error(err))
		}
		done()
	}
	return s, nil
}

// recordLayout audits, as the platform's, the layout directories opening
// ws made (none once the scope has them), before any door serves it.
func recordLayout(ctx context.Context, ws *store.Workspace) error {
	if len(ws.LayoutMade()) == 0 {
		return nil
	}
	log, err := audit.Open(ws.Volume().Path(), audit.Options{})
	if err != nil {
		return auditUnavailable(err)
	}
	defer log.Close()
	return (&stage.Platform{WS: ws, Audit: log, Actor: actorOf(ws.Scope())}).RecordLayout(ctx)
}

// lazyCommands connects to the Docker engine on the first command only, so
// file tools work on a machine without one.
type lazyCommands struct {
	g    *globals
	log  *audit.Log
	once sync.Once
	cmds *sandbox.Commands
	err  error
}

func (l *lazyCommands) RunCommand(ctx context.Context, ws *store.Workspace, req tools.CommandRequest) (tools.CommandResult, error) {
	l.once.Do(func() { l.cmds, l.err = l.g.newCommands(ctx, ws, l.log) })
	if l.err != nil {
		return tools.CommandResult{}, l.err
	}
	return l.cmds.RunCommand(ctx, ws, req)
}

func (l *lazyCommands) close() {
	if l.cmds != nil {
		if err := l.cmds.Pool.Close(); err != nil {
			l.g.log.Warn("unmount the session's projection", zap.Error(err))
		}
		l.cmds.Runner.Close()
	}
}

// newCommands builds the sandbox door: a Runner on the local engine and one
// projection of the scope kept for the session's commands (sandbox.Pool),
// each command's FUSE records carrying its own call and container.
func (g *globals) newCommands(ctx context.Context, ws *store.Workspace, log *audit.Log) (*sandbox.Commands, error) {
	cfg := sandbox.ConfigFromEnv()
	actor := actorOf(ws.Scope())
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
		return nil, sandboxUnavailable(err)
	}
	g.reportOrphans(ctx, r)
	mount := func(ctx context.Context, ws *store.Workspace, mountpoint string, call sandbox.CallInfo) (sandbox.Projection, error) {
		a := actor
		a.Container = call.Container
		m, err := fusefs.Mount(ctx, ws, mountpoint, fusefs.Options{
			AllowOther: true,
			Audit:      log,
			Actor:      a,
			CallID:     call.CallID,
			Refused:    policyEvent(call.Refused),
		})
		if err != nil {
			return nil, err
		}
		return servingMount{m}, nil
	}
	return &sandbox.Commands{
		Runner: r,
		Run:    ws.Scope().Run,
		Pool:   &sandbox.Pool{Mount: mount, Dir: sandbox.DefaultMountDir},
	}, nil
}

// servingMount is a mount the pool keeps for one command after another.
type servingMount struct{ *fusefs.Mounted }

func (s servingMount) Serve(call sandbox.CallInfo) {
	s.Mounted.Serve(fusefs.Call{CallID: call.CallID, Container: call.Container, Refused: policyEvent(call.Refused)})
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

// auditAdmin records an administrator's command; a failure is reported,
// not fatal, since the command has already been done.
func (g *globals) auditAdmin(ctx context.Context, op string, sc store.Scope, detail map[string]any) {
	vol, err := store.OpenVolume(ctx, g.storeConfig())
	if err != nil {
		return
	}
	defer vol.Close()
	log, err := audit.Open(vol.Path(), audit.Options{})
	if err != nil {
		fmt.Fprintf(os.Stderr, "loomfs: warning: audit log unavailable, %s not recorded: %v\n", op, err)
		return
	}
	defer log.Close()
	log.Record(ctx, audit.Event{Actor: actorOf(sc), Scope: sc.Hash(), Source: audit.SourceAdmin, Op: op, Result: "ok", Detail: detail})
}

func auditUnavailable(err error) error {
	return &policy.Error{Code: policy.AuditUnavailable, Message: "the audit log can't be written, so nothing is done: " + err.Error(), Err: err}
}

func sandboxUnavailable(err error) error {
	return &policy.Error{Code: policy.SandboxUnavailable, Message: "no sandbox engine: " + err.Error() + " (run scripts/setup, or make sure dockerd answers on AGENT_LOOM_DOCKER_HOST)", Err: err}
}

// reportOrphans says which loomfs containers exist on the engine as this
// process starts using it. Each command removes its container before it
// returns, so one still there belongs to a command running elsewhere or to
// a worker that died (its scope is then quarantined).
func (g *globals) reportOrphans(ctx context.Context, r *sandbox.Runner) {
	list, err := r.Orphans(ctx)
	if err != nil {
		g.log.Warn("list loomfs containers", zap.Error(err))
		return
	}
	for _, c := range list {
		g.log.Warn("loomfs container found at start: running elsewhere or orphaned (see loomfs quarantine list)",
			zap.String("container", c.Name), zap.String("state", c.State), zap.String("scope", c.Scope),
			zap.String("node", c.Node), zap.String("call", c.Call), zap.Time("created", c.Created))
	}
}
