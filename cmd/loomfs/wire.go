package main

import (
	"context"
	"fmt"
	"os"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/loom"
	"github.com/agentloom/loomfs/nodeservice"
	"github.com/agentloom/loomfs/sandbox"
	"github.com/agentloom/loomfs/store"
	"github.com/agentloom/loomfs/tools"
)

// The wiring of workspace, audit, toolbox, sandbox and processes lives in
// package loom; the commands only describe it from their flags.

// session is everything one command opens over one scope.
type session struct {
	ws    *store.Workspace
	log   *audit.Log
	tools *tools.Toolbox
	node  *loom.Node
	close func()
}

// node returns the loom.Node the global flags and environment describe;
// cfg's MountDir, Processes and Sandbox.Node are kept.
func (g *globals) node(cfg loom.Config) (*loom.Node, error) {
	pol, err := g.loadPolicy()
	if err != nil {
		return nil, err
	}
	node := cfg.Sandbox.Node
	cfg.Sandbox = sandbox.ConfigFromEnv()
	cfg.Sandbox.Node = node
	cfg.Store, cfg.Policy, cfg.Log = g.storeConfig(), pol, g.log
	if g.obs != nil {
		cfg.Observe, cfg.Requests, cfg.Mounted = g.obs.sink, g.obs.requests(), g.obs.mounted
	}
	return loom.New(cfg), nil
}

// openSession opens the scope, its audit log and a Toolbox whose
// workspace_command runs in a sandbox over a fresh projection and whose
// process tools reach this node's service (loomfs serve).
func (g *globals) openSession(ctx context.Context, scopeArg string) (*session, error) {
	if err := checkScopeArg(scopeArg); err != nil {
		return nil, err
	}
	procs := nodeservice.NewClient(socketPath())
	n, err := g.node(loom.Config{Processes: procs})
	if err != nil {
		return nil, err
	}
	s, err := n.Open(ctx, scopeArg)
	if err != nil {
		return nil, err
	}
	return &session{ws: s.Workspace, log: s.Audit, tools: s.Tools, node: n, close: func() { s.Close(); procs.Close(); n.Close() }}, nil
}

// actorOf names the scope's ids for audit records.
func actorOf(sc store.Scope) audit.Actor { return loom.Actor(sc) }

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

func auditUnavailable(err error) error { return loom.AuditUnavailable(err) }

// recordLayout audits, as the platform's, the layout directories opening
// ws made (loom.RecordLayout).
func recordLayout(ctx context.Context, ws *store.Workspace) error { return loom.RecordLayout(ctx, ws) }
