package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
	"github.com/agentloom/loomfs/tools"
)

// Projection is a mounted, policed view of one scope (the fusefs door).
type Projection interface {
	// Dir is the host path of the mountpoint, bound at /workspace.
	Dir() string
	// Probe writes, reads back and deletes a file through the mount.
	Probe(ctx context.Context) error
	// Unmount unmounts and waits until the mount is gone.
	Unmount() error
}

// MountFunc mounts ws's projection at mountpoint for one command, so the
// FUSE records of that command can carry its call id and container.
type MountFunc func(ctx context.Context, ws *store.Workspace, mountpoint string, call CallInfo) (Projection, error)

// CallInfo says which command a projection serves.
type CallInfo struct {
	CallID    string
	Run       string
	Container string
	// Refused is to be told of every refusal the projection makes, for
	// the command's policy_events; it may be called concurrently.
	Refused func(tools.PolicyEvent)
}

// Commands runs workspace_command calls (SPEC §5): for each, it mounts the
// scope's projection in a root-only directory, checks it with a probe,
// persists the execution marker, runs one container over it, and removes
// the marker only once the engine confirmed the container is gone. If that
// can't be confirmed, the scope is quarantined.
type Commands struct {
	Runner   *Runner
	Mount    MountFunc
	MountDir string            // root-only 0700 directory for mountpoints
	Run      string            // run id for labels and markers
	Skills   map[string]string // skill id → host dir, mounted read-only
}

var _ tools.CommandRunner = (*Commands)(nil)

// RunCommand implements tools.CommandRunner. The caller holds the scope lock.
func (c *Commands) RunCommand(ctx context.Context, ws *store.Workspace, req tools.CommandRequest) (tools.CommandResult, error) {
	if err := ws.CheckQuarantine(); err != nil {
		return tools.CommandResult{}, err
	}
	if err := c.Runner.CheckImage(ctx); err != nil {
		return tools.CommandResult{}, policy.Errorf(policy.SandboxUnavailable, "%v", err)
	}
	if err := os.MkdirAll(c.MountDir, 0o700); err != nil {
		return tools.CommandResult{}, fmt.Errorf("mount dir: %w", err)
	}
	sweepStaleMounts(c.MountDir)
	mp, err := os.MkdirTemp(c.MountDir, "ws-")
	if err != nil {
		return tools.CommandResult{}, fmt.Errorf("mountpoint: %w", err)
	}
	defer os.Remove(mp)
	name := NewContainerName(ws.Scope().Hash())
	var refused refusals
	proj, err := c.Mount(ctx, ws, mp, CallInfo{CallID: req.CallID, Run: c.Run, Container: name, Refused: refused.add})
	if err != nil {
		return tools.CommandResult{}, policy.Errorf(policy.SandboxUnavailable, "mount the workspace projection: %v", err)
	}
	defer proj.Unmount()
	if err := proj.Probe(ctx); err != nil {
		return tools.CommandResult{}, policy.Errorf(policy.SandboxUnavailable, "the workspace projection failed its health probe, so no container was started: %v", err)
	}
	hooks := &markerHooks{ws: ws}
	res, err := c.Runner.Run(ctx, Request{
		Command:   req.Command,
		Timeout:   req.Timeout,
		Workspace: proj.Dir(),
		Skills:    c.Skills,
		Scope:     ws.Scope().String(),
		ScopeHash: ws.Scope().Hash(),
		Run:       c.Run,
		Call:      req.CallID,
		Marker:    hooks,
		Name:      name,
	})
	if errors.Is(err, ErrQuarantined) {
		if qerr := hooks.quarantine(err.Error()); qerr != nil {
			return tools.CommandResult{}, fmt.Errorf("%v; and quarantining failed: %w", err, qerr)
		}
		return tools.CommandResult{}, policy.Errorf(policy.Quarantined, "the container's removal could not be confirmed, so the workspace is quarantined until an administrator clears it: %v", err)
	}
	out := tools.CommandResult{
		ExitCode:        res.ExitCode,
		Stdout:          res.Stdout,
		Stderr:          res.Stderr,
		TimedOut:        res.TimedOut,
		StdoutTruncated: res.StdoutTruncated,
		StderrTruncated: res.StderrTruncated,
		Container:       res.ContainerName,
		DurationMS:      res.Duration.Milliseconds(),
		// The container is gone: nothing more reaches the projection.
		PolicyEvents: refused.events(),
	}
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return out, policy.Errorf(policy.Cancelled, "the command was cancelled; its container was removed")
		}
		if errors.Is(err, ErrInvalidRequest) {
			return out, policy.Errorf(policy.InvalidInput, "%v", err)
		}
		return out, err
	}
	return out, nil
}

// refusals collects the refusals of one command's projection.
type refusals struct {
	mu sync.Mutex
	ev tools.PolicyEvents
}

func (r *refusals) add(e tools.PolicyEvent) {
	r.mu.Lock()
	r.ev.Add(e)
	r.mu.Unlock()
}

func (r *refusals) events() tools.PolicyEvents {
	r.mu.Lock()
	defer r.mu.Unlock()
	ev := r.ev
	if ev.Events == nil {
		ev.Events = []tools.PolicyEvent{}
	}
	return ev
}

// markerHooks keeps the execution marker in the scope's state directory.
type markerHooks struct {
	ws   *store.Workspace
	mu   sync.Mutex
	last store.Marker
}

func (h *markerHooks) Set(ctx context.Context, m Marker) error {
	sm := store.Marker{Container: m.Container, Node: m.Node, PID: m.PID, Run: m.Run, Call: m.Call, Time: m.Time}
	h.mu.Lock()
	h.last = sm
	h.mu.Unlock()
	return h.ws.SetMarker(sm)
}

func (h *markerHooks) Clear(ctx context.Context) error { return h.ws.ClearMarker() }

func (h *markerHooks) quarantine(reason string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ws.Quarantine(h.last, reason)
}

// DefaultMountDir is where projections for commands are mounted: inside a
// root-only directory, so allow_other exposes them to no other user.
const DefaultMountDir = "/run/loomfs/mnt"

// sweepStaleMounts detaches projections whose daemon died (the kernel
// answers ENOTCONN) and removes their mountpoints. Live mounts of other
// processes answer and are left alone. statfs, not stat: stat can still be
// answered from the kernel's attribute cache for a while after the daemon
// died.
func sweepStaleMounts(dir string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		var st unix.Statfs_t
		if err := unix.Statfs(p, &st); err == unix.ENOTCONN {
			unix.Unmount(p, unix.MNT_DETACH)
			os.Remove(p)
		}
	}
}
