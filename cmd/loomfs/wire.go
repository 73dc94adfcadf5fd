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
	"github.com/agentloom/loomfs/fusefs"
	"github.com/agentloom/loomfs/nodeservice"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/sandbox"
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
	log, err := audit.Open(ws.Volume().Path(), audit.Options{})
	if err != nil {
		done()
		return nil, auditUnavailable(err)
	}
	cmds := &lazyCommands{g: g, log: log}
	procs := nodeservice.NewClient(socketPath())
	s := &session{
		ws:  ws,
		log: log,
		tools: &tools.Toolbox{
			WS:        ws,
			Audit:     log,
			Commands:  cmds,
			Processes: procs,
			Actor:     actorOf(ws.Scope()),
			Log:       g.log,
		},
	}
	s.close = func() {
		cmds.close()
		procs.Close()
		if err := log.Close(); err != nil {
			g.log.Warn("close audit log", zap.Error(err))
		}
		done()
	}
	return s, nil
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
		l.cmds.Runner.Close()
	}
}

// newCommands builds the sandbox door: a Runner on the local engine and a
// projection mounted per command, audited as the command's own.
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
	return &sandbox.Commands{
		Runner:   r,
		MountDir: sandbox.DefaultMountDir,
		Run:      ws.Scope().Run,
		Mount: func(ctx context.Context, ws *store.Workspace, mountpoint string, call sandbox.CallInfo) (sandbox.Projection, error) {
			a := actor
			a.Container = call.Container
			return fusefs.Mount(ctx, ws, mountpoint, fusefs.Options{
				AllowOther: true,
				Audit:      log,
				Actor:      a,
				CallID:     call.CallID,
				Refused:    policyEvent(call.Refused),
			})
		},
	}, nil
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
