package sandbox

import (
	"context"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/client"
)

// The pieces below let a package that keeps a container alive across calls
// (a scope's session sandbox, SPEC §5.1) reuse this package's hardening and
// cleanup instead of copying them.

// Engine returns the runner's engine connection.
func (r *Runner) Engine() *client.Client { return r.cli }

// Node returns the worker name the runner puts in labels and markers.
func (r *Runner) Node() string { return r.cfg.Node }

// User returns the numeric uid:gid containers run as.
func (r *Runner) User() string { return r.cfg.User }

// CleanupTimeout returns how long a removal may take to be confirmed.
func (r *Runner) CleanupTimeout() time.Duration { return r.cfg.CleanupTimeout }

// ContainerConfig returns the whole security posture of a container for
// req (mounts, limits, user, labels), as Run would create it. req is not
// validated here; Check does that.
func (r *Runner) ContainerConfig(req Request) (*container.Config, *container.HostConfig) {
	return r.containerConfig(req, false)
}

// Check validates req as Run would, apart from its timeout.
func (req Request) Check() error {
	if req.Timeout == 0 {
		req.Timeout = DefaultTimeout
	}
	_, err := req.check()
	return err
}

// RemoveConfirmed force-removes the container ref and returns only once
// the engine no longer knows it, or ctx ends.
func (r *Runner) RemoveConfirmed(ctx context.Context, ref string) error {
	return r.removeConfirmed(ctx, ref)
}

// Observe hands an event to the runner's Config.Observe, if set.
func (r *Runner) Observe(ctx context.Context, op string, detail map[string]any) {
	if r.cfg.Observe != nil {
		r.cfg.Observe(ctx, op, detail)
	}
}

// SweepStaleMounts detaches the projections under dir whose daemon died.
func SweepStaleMounts(dir string) { sweepStaleMounts(dir) }
