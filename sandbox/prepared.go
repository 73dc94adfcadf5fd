package sandbox

import (
	"context"
	"fmt"
	"maps"
)

// preparedEntrypoint is the entrypoint of a prepared container. A
// container's command is fixed when it is created, and a prepared one is
// created before its command is asked for; the engine has no way to give
// a created container another command, and an exec needs it running,
// which the marker protocol forbids before the command's marker is set.
// So the command comes on the container's standard input, attached before
// the start and closed after the command (StdinOnce): the shell reads it
// whole with its read builtin (nothing but /bin/sh is needed in the
// image, as for a fresh container), lines joined as they came, the last
// one kept without its newline, and execs it exactly as a fresh
// container's entrypoint does, its input /dev/null as a fresh container's
// is. No file or extra mount carries it: the container's mounts stay
// /workspace and the skills (SPEC §5). The shell reads a pipe one byte
// per system call, which costs a command of some kilobytes a few
// milliseconds.
var preparedEntrypoint = []string{"/bin/sh", "-c",
	"umask 077 && c= && while IFS= read -r l; do c=\"$c$l\n\"; done; exec /bin/sh -c \"$c$l\" </dev/null"}

// Prepared is a container created, not started, ahead of a command still
// to come (Runner.Prepare): a command then pays only its start, its wait
// and its removal. It carries the hardening of a fresh container
// (containerConfig), LabelPrepared and no call; its command comes on its
// standard input (preparedEntrypoint). No execution marker names it until
// a command takes it: Run sets the command's marker before it starts it,
// as for a container it creates. One never started is removed with
// Remove, or, after a crash, by SweepPrepared.
type Prepared struct {
	Name string // the container's name, which the command's records carry
	ID   string

	r         *Runner
	image     string            // the image's id when it was created
	workspace string            // its mounts
	skills    map[string]string //
}

// Prepare creates a container for a command still to come over
// req.Workspace and req.Skills, labelled with req's scope and run; req's
// command, timeout, call and marker are not used. It does not start it.
func (r *Runner) Prepare(ctx context.Context, req Request) (*Prepared, error) {
	if !validHash(req.ScopeHash) || req.Scope == "" {
		return nil, fmt.Errorf("%w: scope %q, hash %q", ErrInvalidRequest, req.Scope, req.ScopeHash)
	}
	if err := checkDir("workspace", req.Workspace); err != nil {
		return nil, err
	}
	for id, dir := range req.Skills {
		if !validName(id, 64) {
			return nil, fmt.Errorf("%w: skill id %q", ErrInvalidRequest, id)
		}
		if err := checkDir("skill "+id, dir); err != nil {
			return nil, err
		}
	}
	image, err := r.imageID(ctx)
	if err != nil {
		return nil, err
	}
	p := &Prepared{Name: NewContainerName(req.ScopeHash), r: r, image: image, workspace: req.Workspace, skills: maps.Clone(req.Skills)}
	req.Call = ""
	cc, hc := r.containerConfig(req, true)
	release, err := r.StartSlot(ctx, engineTimeout)
	if err != nil {
		return nil, err
	}
	octx := context.WithoutCancel(ctx)
	cctx, cancel := context.WithTimeout(octx, engineTimeout)
	created, err := r.cli.ContainerCreate(cctx, cc, hc, nil, nil, p.Name)
	cancel()
	release()
	if err != nil {
		if !answered(err) {
			// It may appear still; it never runs, but it must not stay.
			rctx, rcancel := context.WithTimeout(octx, r.cfg.CleanupTimeout)
			r.removeConfirmed(rctx, p.Name)
			rcancel()
		}
		return nil, fmt.Errorf("sandbox: create container %s: %w", p.Name, err)
	}
	p.ID = created.ID
	r.observe(octx, "container_prepare", req, &Result{ContainerName: p.Name, ContainerID: p.ID}, map[string]any{"image": r.cfg.Image})
	return p, nil
}

// fits refuses req for p unless p was prepared by r for req's mounts.
func (p *Prepared) fits(r *Runner, req Request) error {
	if p.r != r || p.workspace != req.Workspace || !maps.Equal(p.skills, req.Skills) || req.Name != "" && req.Name != p.Name {
		return fmt.Errorf("%w: container %s was prepared for other mounts or another runner", ErrInvalidRequest, p.Name)
	}
	return nil
}

// current reports whether p was created from the image its runner's tag
// names now, whose id is image.
func (p *Prepared) current(image string) bool { return p.image == image }

// Remove removes p, never started, and waits until the engine confirms it
// is gone, within the runner's cleanup timeout.
func (p *Prepared) Remove(ctx context.Context) error {
	ctx = context.WithoutCancel(ctx)
	cctx, cancel := context.WithTimeout(ctx, p.r.cfg.CleanupTimeout)
	defer cancel()
	err := p.r.removeConfirmed(cctx, p.ID)
	res := &Result{ContainerName: p.Name, ContainerID: p.ID}
	if err != nil {
		p.r.observe(ctx, "container_remove_unconfirmed", Request{}, res, map[string]any{"prepared": true, "error": err.Error()})
		return fmt.Errorf("sandbox: remove prepared container %s: %w", p.Name, err)
	}
	p.r.observe(ctx, "container_removed", Request{}, res, map[string]any{"prepared": true})
	return nil
}

// SweepPrepared removes the prepared containers no live loomfs process
// owns that never started (state "created"): a worker that died left
// them. Nothing ran in them, so nothing is quarantined for them; a scope
// whose command had set its marker before the crash is quarantined by
// that marker as ever. Another process's prepared containers, and
// containers that ran, are left alone. It returns those it removed.
func (r *Runner) SweepPrepared(ctx context.Context) ([]Container, error) {
	orphans, err := r.Orphans(ctx)
	if err != nil {
		return nil, err
	}
	var removed []Container
	for _, c := range orphans {
		if !c.Prepared || c.State != "created" {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, r.cfg.CleanupTimeout)
		err := r.removeConfirmed(cctx, c.ID)
		cancel()
		if err != nil {
			return removed, fmt.Errorf("sandbox: remove prepared container %s: %w", c.Name, err)
		}
		removed = append(removed, c)
	}
	return removed, nil
}
