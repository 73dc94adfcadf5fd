package main

import (
	"context"

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

// openWorkspace opens the volume and the scope named by scopeArg. The
// caller closes both through the returned func.
func (g *globals) openWorkspace(ctx context.Context, scopeArg string) (*store.Workspace, func(), error) {
	if scopeArg == "" {
		return nil, nil, usagef("--scope is required (SPACE/AGENT/SESSION or SPACE/AGENT/SESSION/RUN/INSTANCE)")
	}
	sc, err := store.ParseScope(scopeArg)
	if err != nil {
		return nil, nil, usageError{err}
	}
	pol, err := g.loadPolicy()
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
