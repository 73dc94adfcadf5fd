package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"

	"github.com/agentloom/loomfs/store"
)

// Container is a sandbox container the engine still knows.
type Container struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	State     string    `json:"state"` // created, running, exited, …
	Created   time.Time `json:"created"`
	Scope     string    `json:"scope"`
	ScopeHash string    `json:"scope_hash"`
	Run       string    `json:"run"`
	Call      string    `json:"call"`
	Node      string    `json:"node"`
	Owner     string    `json:"owner"`    // LabelOwner; "" from a loomfs that did not label it
	Prepared  bool      `json:"prepared"` // LabelPrepared: created before its command was asked for
}

// Owner names a process on this node for good: its pid and its start time.
type Owner struct {
	PID   int
	Start uint64 // clock ticks after boot
}

// self is this process.
func self() Owner {
	pid := os.Getpid()
	start, _ := procStart(pid)
	return Owner{PID: pid, Start: start}
}

// String is the LabelOwner value, "PID:START".
func (o Owner) String() string { return fmt.Sprintf("%d:%d", o.PID, o.Start) }

// parseOwner reads a LabelOwner value.
func parseOwner(s string) (Owner, bool) {
	p, st, ok := strings.Cut(s, ":")
	pid, err1 := strconv.Atoi(p)
	start, err2 := strconv.ParseUint(st, 10, 64)
	if !ok || err1 != nil || err2 != nil || pid <= 0 {
		return Owner{}, false
	}
	return Owner{PID: pid, Start: start}, true
}

// Alive reports whether the owner still runs: the engine is local, so the
// owner of one of its containers is a process of this node.
func (o Owner) Alive() bool { return HolderAlive(store.Holder{PID: o.PID, Start: o.Start}) }

// Containers lists every container on the engine that carries loomfs
// labels, running or not: the containers of commands and session
// sandboxes in flight, and, since Run removes what it starts, any left
// over from a crash or an unconfirmed cleanup.
func (r *Runner) Containers(ctx context.Context) ([]Container, error) {
	list, err := r.cli.ContainerList(ctx, container.ListOptions{
		All:     true,
		Filters: filters.NewArgs(filters.Arg("label", LabelScopeHash)),
	})
	if err != nil {
		return nil, fmt.Errorf("sandbox: list containers: %w", err)
	}
	out := make([]Container, 0, len(list))
	for _, c := range list {
		name := c.ID
		if len(c.Names) > 0 {
			name = strings.TrimPrefix(c.Names[0], "/")
		}
		out = append(out, Container{
			ID: c.ID, Name: name, State: c.State, Created: time.Unix(c.Created, 0).UTC(),
			Scope: c.Labels[LabelScope], ScopeHash: c.Labels[LabelScopeHash],
			Run: c.Labels[LabelRun], Call: c.Labels[LabelCall], Node: c.Labels[LabelNode],
			Owner: c.Labels[LabelOwner], Prepared: c.Labels[LabelPrepared] == "1",
		})
	}
	return out, nil
}

// Orphans lists the loomfs containers on the engine that no live loomfs
// process owns: their owner (LabelOwner) has exited, or they carry none.
// Another call's container, starting or running, is not one of them, nor
// is one the engine is removing. The engine's list still shows a removed
// container for a moment after inspecting it answered that it is gone (so
// after its owner, having seen that answer, exited): each one found is
// inspected, and one the engine no longer knows is left out.
func (r *Runner) Orphans(ctx context.Context) ([]Container, error) {
	all, err := r.Containers(ctx)
	if err != nil {
		return nil, err
	}
	var out []Container
	for _, c := range all {
		if o, ok := parseOwner(c.Owner); ok && o.Alive() || c.State == "removing" {
			continue
		}
		if ok, err := r.ContainerExists(ctx, c.ID); err == nil && !ok {
			continue
		}
		out = append(out, c)
	}
	return out, nil
}

// ContainerExists reports whether the engine knows a container by this name
// or ID, in any state. An error means the answer is unknown: a quarantine
// must not be cleared on it.
func (r *Runner) ContainerExists(ctx context.Context, name string) (bool, error) {
	if name == "" {
		return false, fmt.Errorf("sandbox: empty container name")
	}
	_, err := r.cli.ContainerInspect(ctx, name)
	switch {
	case err == nil:
		return true, nil
	case isNotFound(err):
		return false, nil
	}
	return false, fmt.Errorf("sandbox: inspect container %s: %w", name, err)
}

func isNotFound(err error) bool { return err != nil && cerrdefs.IsNotFound(err) }

// RemoveNode removes, with confirmation, every container on the engine
// labelled with this runner's node, whoever started it: what a fenced
// node does to the commands it still runs (their writes land nowhere, and
// they must not outlive the fence). It returns those it removed.
func (r *Runner) RemoveNode(ctx context.Context) ([]Container, error) {
	all, err := r.Containers(ctx)
	if err != nil {
		return nil, err
	}
	var removed []Container
	var errs []error
	for _, c := range all {
		if c.Node != r.Node() {
			continue
		}
		if err := r.removeConfirmed(ctx, c.ID); err != nil {
			errs = append(errs, fmt.Errorf("sandbox: remove container %s: %w", c.Name, err))
			continue
		}
		removed = append(removed, c)
	}
	return removed, errors.Join(errs...)
}
