package store

import (
	"fmt"
	"os"
	"sort"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
)

// Quarantines lists the quarantine records of every scope on the volume,
// for administrators (SPEC §7.3): all but those a fenced node wrote after
// its fence, which quarantine nothing (fencemarks.go).
func (v *Volume) Quarantines() ([]Marker, error) {
	all, err := v.stateRecords(QuarantineFile)
	if err != nil {
		return nil, err
	}
	byNode, _, err := v.fenced()
	if err != nil || len(byNode) == 0 {
		return all, err
	}
	in := all[:0]
	for _, m := range all {
		if m.Node == "" || !byNode[m.Node].LateMarker(m.ScopeHash) {
			in = append(in, m)
		}
	}
	return in, nil
}

// Markers lists the execution and session sandbox markers of every scope
// on the volume: commands and sessions in flight, or ones a dead worker
// left, which the scope's next lock turns into quarantines.
func (v *Volume) Markers() ([]Marker, error) {
	exec, err := v.stateRecords(ExecMarker)
	if err != nil {
		return nil, err
	}
	sessions, err := v.stateRecords(SessionMarker)
	return append(exec, sessions...), err
}

// HasMarker tells whether scope s has an execution or a session sandbox
// marker (Markers). A scope with no state directory has none.
func (v *Volume) HasMarker(s Scope) (bool, error) {
	w, err := v.stateOnly(s)
	if policy.CodeOf(err) == policy.NotFound {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer w.state.Close()
	for _, name := range []string{ExecMarker, SessionMarker} {
		if m, err := w.readState(name); err != nil || m != nil {
			return m != nil, err
		}
	}
	return false, nil
}

// stateRecords reads the record called name in every scope's state
// directory that has one.
func (v *Volume) stateRecords(name string) ([]Marker, error) {
	var out []Marker
	err := v.eachState(1, func(h string, state *os.File) error {
		m, err := (&Workspace{state: state}).readState(name)
		if err != nil || m == nil {
			return err
		}
		if m.ScopeHash == "" {
			m.ScopeHash = h
		}
		out = append(out, *m)
		return nil
	})
	return out, err
}

// eachState calls fn with every scope's state directory (open for
// reading, closed after fn) and its name, the scope's hash: in name order one at a
// time, or with workers > 1 that many at once (fn must then be safe for
// concurrent use; on a shared filesystem each call waits for round trips
// to the servers, which other calls can overlap). A directory removed
// meanwhile, or not a directory, is passed over. The first error fn
// returns ends the walk.
func (v *Volume) eachState(workers int, fn func(h string, state *os.File) error) error {
	fd, err := openBeneath(int(v.root.Fd()), LocksDir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err == unix.ENOENT {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open %s: %w", LocksDir, err)
	}
	dir := os.NewFile(uintptr(fd), LocksDir)
	defer dir.Close()
	names, err := dir.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("read %s: %w", LocksDir, err)
	}
	sort.Strings(names)
	var g errgroup.Group
	g.SetLimit(max(workers, 1))
	for _, h := range names {
		g.Go(func() error {
			sfd, err := unix.Openat(fd, h, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err == unix.ENOENT || err == unix.ENOTDIR || err == unix.ELOOP {
				return nil
			}
			if err != nil {
				return fmt.Errorf("open state of %s: %w", h, err)
			}
			state := os.NewFile(uintptr(sfd), h)
			defer state.Close()
			return fn(h, state)
		})
	}
	return g.Wait()
}

// Quarantine returns the quarantine record of scope s, or nil.
func (v *Volume) Quarantine(s Scope) (*Marker, error) {
	w, err := v.stateOnly(s)
	if err != nil {
		return nil, err
	}
	defer w.state.Close()
	return w.readState(QuarantineFile)
}

// ClearQuarantine removes scope s's quarantine record, and nothing else,
// if it names exactly container. The caller has confirmed the container no
// longer exists on any engine that could have run it.
func (v *Volume) ClearQuarantine(s Scope, container string) error {
	w, err := v.stateOnly(s)
	if err != nil {
		return err
	}
	defer w.state.Close()
	m, err := w.readState(QuarantineFile)
	if err != nil {
		return err
	}
	if m == nil {
		return policy.Errorf(policy.NotFound, "scope %s is not quarantined", s)
	}
	if m.Container != container {
		return policy.Errorf(policy.Conflict, "scope %s is quarantined for container %q, not %q; nothing cleared", s, m.Container, container)
	}
	if err := unix.Unlinkat(int(w.state.Fd()), QuarantineFile, 0); err != nil {
		return fmt.Errorf("clear quarantine of %s: %w", s, err)
	}
	syncDir(int(w.state.Fd()))
	return nil
}

// stateOnly opens scope s's state directory without creating the scope.
func (v *Volume) stateOnly(s Scope) (*Workspace, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	if err := v.recheck(); err != nil {
		return nil, err
	}
	fd, err := openBeneath(int(v.root.Fd()), LocksDir+"/"+s.Hash(), unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, policy.FromErrno(err, "open state of", s.String())
	}
	return &Workspace{scope: s, vol: v, state: os.NewFile(uintptr(fd), s.Hash())}, nil
}
