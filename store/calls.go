package store

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
)

// CallsDir holds the record of tool calls in the scope's state directory.
const CallsDir = "calls"

// Call states.
const (
	CallStarted = "started"
	CallDone    = "done"
)

// CallRecord is what the store remembers of one tool call (SPEC §4): once
// done, replaying its id returns Result or Error; if only started, the
// outcome is unknown.
type CallRecord struct {
	CallID   string          `json:"call_id"`
	Tool     string          `json:"tool"`
	InputSHA string          `json:"input_sha256"`
	State    string          `json:"state"`
	Result   json.RawMessage `json:"result,omitempty"`
	Error    *policy.Error   `json:"error,omitempty"`
	Started  time.Time       `json:"started"`
	Finished time.Time       `json:"finished,omitzero"`
}

// BeginCall records that call id starts running tool with input. If the id
// was seen before it returns that record instead and records nothing; the
// caller replays a done record and decides what an unfinished one means.
// Reusing an id for another tool or input is a conflict.
func (w *Workspace) BeginCall(id, tool string, input []byte) (*CallRecord, error) {
	if id == "" {
		return nil, nil
	}
	if len(id) > 256 {
		return nil, policy.Errorf(policy.InvalidInput, "call id is %d bytes; the limit is 256", len(id))
	}
	sum := sha256.Sum256(input)
	rec := CallRecord{CallID: id, Tool: tool, InputSHA: hex.EncodeToString(sum[:]), State: CallStarted, Started: time.Now().UTC()}
	dfd, err := w.callsDir()
	if err != nil {
		return nil, err
	}
	defer unix.Close(dfd)
	name := callFile(id)
	err = writeJSONAt(dfd, name, rec, true)
	if err == nil {
		return nil, nil
	}
	if err != unix.EEXIST {
		return nil, fmt.Errorf("record call %s: %w", id, err)
	}
	prev, err := readCall(dfd, name)
	if err != nil {
		return nil, err
	}
	if prev.Tool != tool || prev.InputSHA != rec.InputSHA {
		return nil, policy.Errorf(policy.Conflict, "call id %q was already used for another call (%s); use a new call id", id, prev.Tool)
	}
	return prev, nil
}

// FinishCall records the outcome of call id.
func (w *Workspace) FinishCall(id, tool string, input []byte, result json.RawMessage, perr *policy.Error) error {
	if id == "" {
		return nil
	}
	sum := sha256.Sum256(input)
	dfd, err := w.callsDir()
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	rec := CallRecord{CallID: id, Tool: tool, InputSHA: hex.EncodeToString(sum[:]), State: CallDone, Result: result, Error: perr, Finished: time.Now().UTC()}
	if prev, err := readCall(dfd, callFile(id)); err == nil {
		rec.Started = prev.Started
	}
	if err := writeJSONAt(dfd, callFile(id), rec, false); err != nil {
		return fmt.Errorf("record outcome of call %s: %w", id, err)
	}
	return nil
}

// recordFile names the record of key (a call id, a token) by its hash, so
// no key reaches the filesystem as a name.
func recordFile(key string) string {
	s := sha256.Sum256([]byte(key))
	return hex.EncodeToString(s[:16]) + ".json"
}

func callFile(id string) string { return recordFile(id) }

func (w *Workspace) callsDir() (int, error) { return w.stateSubdir(CallsDir) }

// stateSubdir opens (creating) a directory of the scope's state directory.
func (w *Workspace) stateSubdir(name string) (int, error) {
	sfd := int(w.state.Fd())
	open := func() (int, error) {
		return unix.Openat(sfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	}
	fd, err := open()
	if err == unix.ENOENT {
		// First use: made here, not before every call.
		if err := unix.Mkdirat(sfd, name, policy.DirPerm); err != nil && err != unix.EEXIST {
			return -1, fmt.Errorf("%s dir: %w", name, err)
		}
		fd, err = open()
	}
	if err != nil {
		return -1, fmt.Errorf("%s dir: %w", name, err)
	}
	return fd, nil
}

func readCall(dfd int, name string) (*CallRecord, error) {
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("read call record: %w", err)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("read call record: %w", err)
	}
	var rec CallRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, fmt.Errorf("read call record: %w", err)
	}
	return &rec, nil
}

// writeJSONAt writes v as name in directory dfd via a temporary file, fsync
// and rename; with noReplace an existing name answers EEXIST (PlaceNew).
func writeJSONAt(dfd int, name string, v any, noReplace bool) error {
	tmp, err := writeTempJSON(dfd, v)
	if err != nil {
		return err
	}
	if noReplace {
		err = PlaceNew(dfd, tmp, name)
	} else {
		err = unix.Renameat(dfd, tmp, dfd, name)
	}
	if err != nil {
		unix.Unlinkat(dfd, tmp, 0)
		return err
	}
	return syncDir(dfd)
}

// writeTempJSON writes v, fsynced, to a new reserved temporary name in dfd
// and returns the name.
func writeTempJSON(dfd int, v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	tmp := tempName()
	fd, err := unix.Openat(dfd, tmp, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, policy.FilePerm)
	if err != nil {
		return "", err
	}
	f := os.NewFile(uintptr(fd), tmp)
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	f.Close()
	if err != nil {
		unix.Unlinkat(dfd, tmp, 0)
		return "", err
	}
	return tmp, nil
}
