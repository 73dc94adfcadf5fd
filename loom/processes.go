package loom

import (
	"context"

	"go.uber.org/zap"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/fusefs"
	"github.com/agentloom/loomfs/process"
	"github.com/agentloom/loomfs/sandbox"
	"github.com/agentloom/loomfs/store"
	"github.com/agentloom/loomfs/tools"
)

// Processes returns the Node's own process service (SPEC §5.1), started
// on first use: the session sandboxes of every scope this program opens,
// each over a projection audited in its scope's log. loomfs serve runs
// exactly this behind its socket.
func (n *Node) Processes(ctx context.Context) (*process.Service, error) {
	n.once.Do(func() {
		r, err := sandbox.NewRunner(ctx, n.cfg.Sandbox)
		if err != nil {
			n.err = SandboxUnavailable(err)
			return
		}
		n.ReportOrphans(ctx, r)
		n.runner = r
		n.svc = process.NewService(process.Config{
			Runner:   r,
			MountDir: n.cfg.MountDir,
			Log:      n.cfg.Log,
			Open:     n.openForSandbox,
			Mount: func(ctx context.Context, ws *store.Workspace, log audit.Sink, mp string, call sandbox.CallInfo) (sandbox.Projection, error) {
				a := Actor(ws.Scope())
				a.Container = call.Container
				m, err := fusefs.Mount(ctx, ws, mp, fusefs.Options{AllowOther: true, Audit: log, Actor: a, CallID: call.CallID, Trace: call.Trace, Requests: n.cfg.Requests})
				if err != nil {
					return nil, err
				}
				// Reusable: a workspace_command run in the session
				// sandbox names its own call and takes its refusals.
				return servingMount{Mounted: m, gone: n.mounted(ws.Scope(), m)}, nil
			},
		})
	})
	return n.svc, n.err
}

// openForSandbox opens a scope and its audit log for a session sandbox's
// life.
func (n *Node) openForSandbox(ctx context.Context, sc store.Scope) (*store.Workspace, audit.Sink, func(), error) {
	ws, done, err := n.OpenWorkspace(ctx, sc.String())
	if err != nil {
		return nil, nil, nil, err
	}
	// A session sandbox's mount lives as long as the sandbox and records on
	// its requests' path: the log is queued (audit.Options.Queue).
	log, err := audit.Open(ws.Volume().Path(), audit.Options{Queue: audit.DefaultQueue})
	if err != nil {
		done()
		return nil, nil, nil, AuditUnavailable(err)
	}
	return ws, n.observe(log), func() {
		if err := log.Close(); err != nil {
			n.cfg.Log.Warn("close audit log", zap.Error(err))
		}
		done()
	}, nil
}

// lazyProcesses is the Node's own service as a Toolbox's ProcessRunner,
// started at the first process call.
type lazyProcesses struct{ n *Node }

var _ tools.ProcessRunner = lazyProcesses{}

func (l lazyProcesses) svc(ctx context.Context) (*process.Service, error) { return l.n.Processes(ctx) }

func (l lazyProcesses) StartProcess(ctx context.Context, ws *store.Workspace, req tools.ProcessStartRequest) (tools.ProcessOutput, error) {
	s, err := l.svc(ctx)
	if err != nil {
		return tools.ProcessOutput{}, err
	}
	return s.StartProcess(ctx, ws, req)
}

func (l lazyProcesses) WriteProcess(ctx context.Context, ws *store.Workspace, req tools.ProcessInput) (tools.ProcessOutput, error) {
	s, err := l.svc(ctx)
	if err != nil {
		return tools.ProcessOutput{}, err
	}
	return s.WriteProcess(ctx, ws, req)
}

func (l lazyProcesses) ReadProcess(ctx context.Context, ws *store.Workspace, req tools.ProcessReadRequest) (tools.ProcessOutput, error) {
	s, err := l.svc(ctx)
	if err != nil {
		return tools.ProcessOutput{}, err
	}
	return s.ReadProcess(ctx, ws, req)
}

func (l lazyProcesses) ResizeProcess(ctx context.Context, ws *store.Workspace, req tools.ProcessResizeRequest) (tools.ProcessInfo, error) {
	s, err := l.svc(ctx)
	if err != nil {
		return tools.ProcessInfo{}, err
	}
	return s.ResizeProcess(ctx, ws, req)
}

func (l lazyProcesses) SignalProcess(ctx context.Context, ws *store.Workspace, req tools.ProcessSignalRequest) (tools.ProcessInfo, error) {
	s, err := l.svc(ctx)
	if err != nil {
		return tools.ProcessInfo{}, err
	}
	return s.SignalProcess(ctx, ws, req)
}

func (l lazyProcesses) ListProcesses(ctx context.Context, ws *store.Workspace) ([]tools.ProcessInfo, error) {
	s, err := l.svc(ctx)
	if err != nil {
		return nil, err
	}
	return s.ListProcesses(ctx, ws)
}
