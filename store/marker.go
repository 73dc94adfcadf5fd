package store

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/agentloom/loomfs/nodeid"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
)

// Names in the scope's state directory (SPEC §5).
const (
	ExecMarker     = "execution.json"
	QuarantineFile = ".quarantine"
)

// Marker records a command in flight: written before its container starts,
// removed only once the engine confirmed the container is gone.
type Marker struct {
	Scope     string `json:"scope"`
	ScopeHash string `json:"scope_hash"`
	Container string `json:"container_name"`
	Node      string `json:"node"`
	PID       int    `json:"pid"`
	// PIDStart is the owning process's start time in clock ticks since
	// boot (see Holder.Start): with PID, it names the owner for good.
	PIDStart uint64    `json:"pid_start_ticks,omitempty"`
	Run      string    `json:"run,omitempty"`
	Call     string    `json:"call,omitempty"`
	Time     time.Time `json:"time"`
	Reason   string    `json:"reason,omitempty"`
	// Holders are the processes, not loomfs's own, that still held the
	// command's projection after its container was removed.
	Holders []Holder `json:"holders,omitempty"`
}

// Holder is a process on Node that held a projection. Start, the process's
// start time in clock ticks since boot, tells it apart from a later process
// given the same pid.
type Holder struct {
	PID     int    `json:"pid"`
	Start   uint64 `json:"start_ticks"`
	Cmdline string `json:"cmdline"`
}

// SetMarker persists m atomically. The caller holds the scope lock.
func (w *Workspace) SetMarker(m Marker) error {
	if err := w.checkSessionNode(m.Node); err != nil {
		return err
	}
	m.Scope, m.ScopeHash = w.scope.String(), w.scope.Hash()
	return w.writeState(ExecMarker, m, true)
}

// ClearMarker removes the execution marker after confirmed cleanup.
func (w *Workspace) ClearMarker() error {
	var err error = unix.EINTR
	for err == unix.EINTR { // interrupted is not failed: a quarantine would follow
		err = unix.Unlinkat(int(w.state.Fd()), ExecMarker, 0)
	}
	if err != nil && err != unix.ENOENT {
		return fmt.Errorf("clear execution marker: %w", err)
	}
	syncDir(int(w.state.Fd()))
	return nil
}

// Quarantine marks the scope: writes and commands are refused until an
// administrator clears it. The marker of the command concerned moves into
// the quarantine file.
func (w *Workspace) Quarantine(m Marker, reason string) error {
	if err := w.writeQuarantine(m, reason); err != nil {
		return err
	}
	return w.ClearMarker()
}

// writeQuarantine writes the quarantine flag with the marker m and why.
// A lock hold whose look found the scope clear no longer counts as
// checked (checkWritable): a change later in it is refused.
func (w *Workspace) writeQuarantine(m Marker, reason string) error {
	m.Scope, m.ScopeHash, m.Reason = w.scope.String(), w.scope.Hash(), reason
	w.clearHeld.Store(false)
	return w.writeState(QuarantineFile, m, false)
}

// quarantineFlagged tells whether the quarantine flag is there (or can't
// be told absent).
func (w *Workspace) quarantineFlagged() bool {
	var st unix.Stat_t
	return unix.Fstatat(int(w.state.Fd()), QuarantineFile, &st, unix.AT_SYMLINK_NOFOLLOW) != unix.ENOENT
}

// QuarantineMarker returns the quarantine record, or nil if the scope is
// not quarantined.
func (w *Workspace) QuarantineMarker() (*Marker, error) {
	return w.readState(QuarantineFile)
}

// CheckQuarantine refuses a change to a quarantined scope.
func (w *Workspace) CheckQuarantine() error {
	if !w.quarantineFlagged() {
		return nil
	}
	m, _ := w.readState(QuarantineFile)
	if late, err := w.lateRecord(m); err == nil && late {
		return nil // a fenced node's, written after its fence: set aside at the next lock
	}
	msg := "this workspace is quarantined: a sandbox command's cleanup could not be confirmed; writes and commands are refused until an administrator clears it (reads still work)"
	if m != nil {
		msg += fmt.Sprintf(" [container %s, node %s, since %s]", m.Container, m.Node, m.Time.UTC().Format(time.RFC3339))
	}
	return policy.Errorf(policy.Quarantined, "%s", msg)
}

// quarantineStaleMarker runs right after the scope lock is taken: an
// execution marker found then was left by a command whose owner died.
// found says whether there was one. One a fenced node wrote after its
// fence is set aside instead (fencemarks.go).
func (w *Workspace) quarantineStaleMarker() (found bool, err error) {
	m, err := w.readState(ExecMarker)
	if err != nil || m == nil {
		return false, err
	}
	if late, err := w.lateRecord(m); err != nil || late {
		if err == nil {
			err = w.setAsideLate(ExecMarker)
		}
		return !late, err
	}
	return true, w.Quarantine(*m, "execution marker found without a live owner (worker died or cleanup unconfirmed)")
}

func (w *Workspace) readState(name string) (*Marker, error) {
	fd, err := unix.Openat(int(w.state.Fd()), name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err == unix.ENOENT {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	var m Marker
	if err := json.Unmarshal(b, &m); err != nil {
		// An unreadable marker still counts: return what we know.
		return &Marker{Reason: "unreadable marker: " + err.Error()}, nil
	}
	return &m, nil
}

// writeState writes a JSON file into the state directory atomically.
func (w *Workspace) writeState(name string, v any, noReplace bool) error {
	err := writeJSONAt(int(w.state.Fd()), name, v, noReplace)
	if err == unix.EEXIST {
		return fmt.Errorf("write %s: a marker already exists", name)
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	return nil
}

// SelfCheckFile records the last periodic self-check of a projection of
// the scope (SPEC §6), for loomfs check.
const SelfCheckFile = "selfcheck.json"

// SelfCheck is one self-check outcome.
type SelfCheck struct {
	Scope string    `json:"scope"`
	Node  string    `json:"node"`
	PID   int       `json:"pid"`
	Time  time.Time `json:"time"`
	OK    bool      `json:"ok"`
	Error string    `json:"error,omitempty"`
}

// RecordSelfCheck keeps the outcome of a self-check (err nil: passed).
func (w *Workspace) RecordSelfCheck(err error) error {
	node, _ := nodeid.Name()
	sc := SelfCheck{Scope: w.scope.String(), Node: node, PID: os.Getpid(), Time: time.Now().UTC(), OK: err == nil}
	if err != nil {
		sc.Error = err.Error()
	}
	return writeJSONAt(int(w.state.Fd()), SelfCheckFile, sc, false)
}
