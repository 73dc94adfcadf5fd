package store

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
)

// A scope's session sandbox (SPEC §5.1) is one long-lived container. Its
// marker is kept apart from the one-shot command's: the scope lock is not
// held for the session's life, so whoever takes that lock tells a live
// session from a dead one by its lease, an OFD lock the owning worker holds
// on SessionLease for the container's whole life (on a shared volume, across
// nodes as the scope lock is).
const (
	SessionMarker = "session.json"
	SessionLease  = "session.lease"
	ProcessesDir  = "processes"
)

// TakeSessionLease takes the scope's session lease without waiting; ok is
// false when another worker (or another open of this one) holds it. The
// lease is released by the returned func, or by the holder's death.
func (w *Workspace) TakeSessionLease() (release func(), ok bool, err error) {
	return tryLockFile(int(w.state.Fd()), SessionLease, "session lease of "+w.scope.String())
}

// SetSessionMarker persists the session container's marker. The caller
// holds the scope lock and the session lease.
func (w *Workspace) SetSessionMarker(m Marker) error {
	m.Scope, m.ScopeHash = w.scope.String(), w.scope.Hash()
	return w.writeState(SessionMarker, m, false)
}

// ClearSessionMarker removes the session marker once the container's
// removal is confirmed.
func (w *Workspace) ClearSessionMarker() error {
	err := unix.Unlinkat(int(w.state.Fd()), SessionMarker, 0)
	if err != nil && err != unix.ENOENT {
		return fmt.Errorf("clear session marker: %w", err)
	}
	syncDir(int(w.state.Fd()))
	return nil
}

// SessionMarkerOf returns the session marker, or nil when no session
// sandbox is recorded.
func (w *Workspace) SessionMarkerOf() (*Marker, error) { return w.readState(SessionMarker) }

// QuarantineSession quarantines the scope with the session marker m and
// removes that marker.
func (w *Workspace) QuarantineSession(m Marker, reason string) error {
	if err := w.writeQuarantine(m, reason); err != nil {
		return err
	}
	return w.ClearSessionMarker()
}

// quarantineStaleSession runs with the scope lock held: a session marker
// whose lease nobody holds was left by a worker that died with its
// container (SPEC §5.1: as for a one-shot command). found says whether
// there was a session marker, live or not. One a fenced node wrote after
// its fence is set aside instead (fencemarks.go).
func (w *Workspace) quarantineStaleSession() (found bool, err error) {
	m, err := w.readState(SessionMarker)
	if err != nil || m == nil {
		return false, err
	}
	release, ok, err := w.TakeSessionLease()
	if err != nil || !ok {
		return true, err // a live session: its owner holds the lease
	}
	defer release()
	if late, err := w.lateRecord(m); err != nil || late {
		if err == nil {
			err = w.setAsideLate(SessionMarker)
		}
		return !late, err
	}
	return true, w.QuarantineSession(*m, "session sandbox marker found without a live owner (worker died or cleanup unconfirmed)")
}

// checkSessionNode refuses a one-shot command's marker while another node
// runs the scope's session sandbox: two nodes never run sandboxes over one
// scope at once.
func (w *Workspace) checkSessionNode(node string) error {
	m, err := w.readState(SessionMarker)
	if err != nil || m == nil || m.Node == node {
		return err
	}
	return policy.Errorf(policy.Conflict, "node %s runs this workspace's session sandbox (container %s); commands run there until it ends", m.Node, m.Container)
}

// WriteProcessRecord persists one process record (a JSON value) under the
// scope's state directory, atomically.
func (w *Workspace) WriteProcessRecord(id string, v any) error {
	dfd, err := w.processesDir(true)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	if err := writeJSONAt(dfd, id+".json", v, false); err != nil {
		return fmt.Errorf("write process record %s: %w", id, err)
	}
	return nil
}

// ReadProcessRecord reads process id's record into v; ok is false when
// there is none.
func (w *Workspace) ReadProcessRecord(id string, v any) (ok bool, err error) {
	if !validRecordID(id) {
		return false, nil
	}
	dfd, err := w.processesDir(false)
	if err == unix.ENOENT {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer unix.Close(dfd)
	fd, err := unix.Openat(dfd, id+".json", unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err == unix.ENOENT {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("open process record %s: %w", id, err)
	}
	f := os.NewFile(uintptr(fd), id)
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 1<<20))
	if err != nil {
		return false, fmt.Errorf("read process record %s: %w", id, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return false, fmt.Errorf("process record %s: %w", id, err)
	}
	return true, nil
}

// ProcessRecordIDs lists the ids of the scope's process records, sorted.
func (w *Workspace) ProcessRecordIDs() ([]string, error) {
	dfd, err := w.processesDir(false)
	if err == unix.ENOENT {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	d := os.NewFile(uintptr(dfd), ProcessesDir)
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("list process records: %w", err)
	}
	var ids []string
	for _, n := range names {
		if id, ok := strings.CutSuffix(n, ".json"); ok && validRecordID(id) {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids, nil
}

// RemoveProcessRecord removes process id's record.
func (w *Workspace) RemoveProcessRecord(id string) error {
	dfd, err := w.processesDir(false)
	if err == unix.ENOENT {
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	if err := unix.Unlinkat(dfd, id+".json", 0); err != nil && err != unix.ENOENT {
		return fmt.Errorf("remove process record %s: %w", id, err)
	}
	return nil
}

func (w *Workspace) processesDir(create bool) (int, error) {
	if create {
		if err := unix.Mkdirat(int(w.state.Fd()), ProcessesDir, 0o700); err != nil && err != unix.EEXIST {
			return -1, fmt.Errorf("make %s: %w", ProcessesDir, err)
		}
	}
	fd, err := unix.Openat(int(w.state.Fd()), ProcessesDir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err == unix.ENOENT && !create {
		return -1, err
	}
	if err != nil {
		return -1, fmt.Errorf("open %s: %w", ProcessesDir, err)
	}
	return fd, nil
}

// validRecordID keeps a process id to a plain file name.
func validRecordID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}
