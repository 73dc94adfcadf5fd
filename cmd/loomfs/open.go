package main

import (
	"context"
	"strings"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// storeConfig is the volume configuration the global flags name.
func (g *globals) storeConfig() store.Config {
	return store.Config{Backend: g.backend, Root: g.root, VolumeID: g.volumeID, DataDir: g.data}
}

// loadPolicy returns the policy in force: the --policy file, else the open
// layout. An invalid file is refused at start, with its line and reason.
func (g *globals) loadPolicy() (*policy.Policy, error) {
	if g.policy == "" {
		return policy.Default(), nil
	}
	pol, err := policy.Load(g.policy)
	if err != nil {
		return nil, usageError{err}
	}
	return pol, nil
}

// openWorkspace opens the volume and the scope named by scopeArg: either
// SPACE/AGENT/SESSION[/RUN/INSTANCE], or run:RUN[/INSTANCE] to resume a run
// through its recorded binding (SPEC §2.3) — its volume, layout and scope
// as they were when it was created, or <data>/runs/RUN for a run from
// before bindings. The layout directories the opening made are audited as
// the platform's. The caller closes everything through the returned func.
func (g *globals) openWorkspace(ctx context.Context, scopeArg string) (*store.Workspace, func(), error) {
	if scopeArg == "" {
		return nil, nil, usagef("--scope is required (SPACE/AGENT/SESSION, SPACE/AGENT/SESSION/RUN/INSTANCE, or run:RUN[/INSTANCE])")
	}
	pol, err := g.loadPolicy()
	if err != nil {
		return nil, nil, err
	}
	var ws *store.Workspace
	var done func()
	if run, ok := strings.CutPrefix(scopeArg, "run:"); ok {
		ws, done, err = g.resumeRun(ctx, run, pol)
	} else {
		ws, done, err = g.openScope(ctx, scopeArg, pol)
	}
	if err != nil {
		return nil, nil, err
	}
	if err := recordLayout(ctx, ws); err != nil {
		done()
		return nil, nil, err
	}
	return ws, done, nil
}

// openScope opens SPACE/AGENT/SESSION[/RUN/INSTANCE] on the configured
// volume.
func (g *globals) openScope(ctx context.Context, scopeArg string, pol *policy.Policy) (*store.Workspace, func(), error) {
	sc, err := parseScopeFlag(scopeArg)
	if err != nil {
		return nil, nil, err
	}
	vol, err := store.OpenVolume(ctx, g.storeConfig())
	if err != nil {
		return nil, nil, err
	}
	ws, err := vol.Open(ctx, sc, pol)
	if err != nil {
		vol.Close()
		return nil, nil, err
	}
	return ws, func() { ws.Close(); vol.Close() }, nil
}

// resumeRun opens run:RUN[/INSTANCE] through the run's binding.
func (g *globals) resumeRun(ctx context.Context, arg string, pol *policy.Policy) (*store.Workspace, func(), error) {
	runID, instance, child := strings.Cut(arg, "/")
	if err := store.ValidateID("run", runID); err != nil {
		return nil, nil, usageError{err}
	}
	if child {
		if err := store.ValidateID("instance", instance); err != nil {
			return nil, nil, usageError{err}
		}
	}
	r, err := store.ResumeRun(ctx, g.storeConfig(), runID)
	if err != nil {
		return nil, nil, err
	}
	var ws *store.Workspace
	if child {
		ws, err = r.Instance(ctx, instance, pol)
	} else {
		ws, err = r.Main(ctx, pol)
	}
	if err != nil {
		r.Close()
		return nil, nil, err
	}
	return ws, func() { ws.Close(); r.Close() }, nil
}

// parseScopeFlag parses --scope SPACE/AGENT/SESSION[/RUN/INSTANCE]; a
// missing or malformed one is a usage error.
func parseScopeFlag(s string) (store.Scope, error) {
	if s == "" {
		return store.Scope{}, usagef("--scope is required (SPACE/AGENT/SESSION or SPACE/AGENT/SESSION/RUN/INSTANCE)")
	}
	sc, err := store.ParseScope(s)
	if err != nil {
		return store.Scope{}, usageError{err}
	}
	return sc, nil
}

// scopeVolume parses --scope and opens the configured volume, for the
// commands that work on a scope's records rather than its files.
func (g *globals) scopeVolume(ctx context.Context, scope string) (store.Scope, *store.Volume, error) {
	sc, err := parseScopeFlag(scope)
	if err != nil {
		return store.Scope{}, nil, err
	}
	vol, err := store.OpenVolume(ctx, g.storeConfig())
	if err != nil {
		return store.Scope{}, nil, err
	}
	return sc, vol, nil
}
