package sandbox

import (
	"context"
	"fmt"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
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
}

// Orphans lists every container on the engine that carries loomfs labels,
// running or not: the containers of commands in flight, and, since Run
// removes what it starts, any left over from a crash or an unconfirmed
// cleanup.
func (r *Runner) Orphans(ctx context.Context) ([]Container, error) {
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
		})
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
