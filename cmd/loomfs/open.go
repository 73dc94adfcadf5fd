package main

import (
	"context"
	"errors"
	"strings"
	"syscall"

	"github.com/agentloom/loomfs/loom"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// storeConfig is the volume configuration the global flags name.
func (g *globals) storeConfig() store.Config {
	return store.Config{Backend: g.backend, Root: g.root, VolumeID: g.volumeID, DataDir: g.data}
}

// loadPolicy returns the policy in force: the --policy file, else the open
// layout. A file that is invalid, missing or not this user's to read is
// refused at start, with its line and reason: a usage error, the
// operator's to fix. A fault while reading it (out of descriptors, an I/O
// error) is not, and is answered as any fault is.
func (g *globals) loadPolicy() (*policy.Policy, error) {
	if g.policy == "" {
		return policy.Default(), nil
	}
	pol, err := policy.Load(g.policy)
	var errno syscall.Errno
	switch {
	case err == nil:
		return pol, nil
	case errors.As(err, &errno) && !configErrno(errno):
		return nil, err
	}
	return nil, usageError{err}
}

// configErrno tells the errors of reading a file that its name or its
// modes cause, which the operator fixes, from the faults of the moment.
func configErrno(e syscall.Errno) bool {
	switch e {
	case syscall.ENOENT, syscall.ENOTDIR, syscall.EISDIR, syscall.EACCES, syscall.EPERM, syscall.ELOOP, syscall.ENAMETOOLONG:
		return true
	}
	return false
}

// openWorkspace opens the volume and the scope named by scopeArg: either
// SPACE/AGENT/SESSION[/RUN/INSTANCE], or run:RUN[/INSTANCE] to resume a run
// through its recorded binding (SPEC §2.3, loom.Node.OpenWorkspace). The
// layout directories the opening made are audited as the platform's. The
// caller closes everything through the returned func.
func (g *globals) openWorkspace(ctx context.Context, scopeArg string) (*store.Workspace, func(), error) {
	if err := checkScopeArg(scopeArg); err != nil {
		return nil, nil, err
	}
	n, err := g.node(loom.Config{})
	if err != nil {
		return nil, nil, err
	}
	return n.OpenWorkspace(ctx, scopeArg)
}

// checkScopeArg refuses a missing or malformed --scope as a usage error.
func checkScopeArg(scopeArg string) error {
	if scopeArg == "" {
		return usagef("--scope is required (SPACE/AGENT/SESSION, SPACE/AGENT/SESSION/RUN/INSTANCE, or run:RUN[/INSTANCE])")
	}
	run, ok := strings.CutPrefix(scopeArg, "run:")
	if !ok {
		_, err := parseScopeFlag(scopeArg)
		return err
	}
	runID, instance, child := strings.Cut(run, "/")
	if err := store.ValidateID("run", runID); err != nil {
		return usageError{err}
	}
	if child {
		if err := store.ValidateID("instance", instance); err != nil {
			return usageError{err}
		}
	}
	return nil
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
