package store

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/newname"
	"github.com/agentloom/loomfs/ofdlock"
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

// The call records of a scope live in its state directory's CallsDir, in
// append-only logs, each appended to by one writer (a Workspace that began
// a call) at a time, so a busy session adds lines, not files. Each line is one CallRecord in JSON:
// a "started" line, fsynced before the call runs, and a "done" line,
// written once its outcome is known but not fsynced on its own: if a crash
// loses it, the call answers unknown_outcome, the answer that is always
// safe, and otherwise it reaches the disk with the log's next fsync or the
// kernel's writeback. That saves one of a write's four fsyncs. A reader looks an id up across every
// writer's log; an id whose last line is "started" was begun and never
// finished. A line not ending in a newline (a writer that died while
// appending it) is ignored.
//
// Two writers racing to begin the same id are decided by an OFD lock on
// CallsLock, held while the logs are read and the started line appended:
// one of them appends, the other finds its line. No exclusive rename is
// needed. A writer holds an OFD lock on its log while it may append, and
// only the holder appends; a later writer takes over a log nobody holds,
// so a process per call still leaves one log, not one per process.

// CallsLock is the lock file in CallsDir that decides who begins a call.
const CallsLock = "claim.lock"

const callLogSuffix = ".log"

// callLog is one Workspace's view of the scope's call logs.
type callLog struct {
	mu    sync.Mutex
	f     *os.File         // this writer's log; nil until its first call
	read  map[string]int64 // log name -> offset read up to (after a newline)
	index map[string]*CallRecord
}

// BeginCall records that call id starts running tool with input. If the id
// was seen before it returns that record instead and records nothing; the
// caller replays a done record and decides what an unfinished one means.
// Reusing an id for another tool or input is a conflict.
//
// The wait for CallsLock ends with ctx: on CephFS a node that died holding
// it keeps it for about a minute.
func (w *Workspace) BeginCall(ctx context.Context, id, tool string, input []byte) (*CallRecord, error) {
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
	c := &w.calls
	c.mu.Lock()
	defer c.mu.Unlock()
	unlock, err := lockCalls(ctx, dfd)
	if err != nil {
		return nil, fmt.Errorf("record call %s: %w", id, err)
	}
	defer unlock()
	if err := c.refresh(dfd); err != nil {
		return nil, fmt.Errorf("record call %s: %w", id, err)
	}
	if prev := c.index[id]; prev != nil {
		if prev.Tool != tool || prev.InputSHA != rec.InputSHA {
			return nil, policy.Errorf(policy.Conflict, "call id %q was already used for another call (%s); use a new call id", id, prev.Tool)
		}
		cp := *prev
		return &cp, nil
	}
	if err := c.append(dfd, &rec, true); err != nil {
		return nil, fmt.Errorf("record call %s: %w", id, err)
	}
	return nil, nil
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
	c := &w.calls
	c.mu.Lock()
	defer c.mu.Unlock()
	if prev := c.index[id]; prev != nil {
		rec.Started = prev.Started
	}
	if err := c.append(dfd, &rec, false); err != nil {
		return fmt.Errorf("record outcome of call %s: %w", id, err)
	}
	return nil
}

// callsLockBackoff paces a wait for CallsLock, held only while the logs
// are read and one line appended.
var callsLockBackoff = ofdlock.Backoff{First: 100 * time.Microsecond, Most: 20 * time.Millisecond}

// lockCalls takes the OFD write lock of CallsLock in dfd, waiting for it
// until ctx ends (polling, package ofdlock).
func lockCalls(ctx context.Context, dfd int) (unlock func(), err error) {
	fd, err := unix.Openat(dfd, CallsLock, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, policy.FilePerm)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", CallsLock, err)
	}
	if err := ofdlock.Wait(ctx, uintptr(fd), unix.Flock_t{Type: unix.F_WRLCK}, callsLockBackoff); err != nil {
		unix.Close(fd)
		if ctx.Err() != nil {
			return nil, policy.WaitEnded(ctx, "the workspace's call record is busy (another process or node holds its lock, or the storage did not answer); retry later with the same call id")
		}
		return nil, fmt.Errorf("lock %s: %w", CallsLock, err)
	}
	return func() {
		un := unix.Flock_t{Type: unix.F_UNLCK}
		unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLK, &un)
		unix.Close(fd)
	}, nil
}

// refresh reads the lines the logs in dfd gained since the last refresh.
func (c *callLog) refresh(dfd int) error {
	names, err := dirNames(dfd, callLogSuffix)
	if err != nil {
		return err
	}
	if c.read == nil {
		c.read = map[string]int64{}
		c.index = map[string]*CallRecord{}
	}
	for _, name := range names {
		if err := c.readLog(dfd, name); err != nil {
			return err
		}
	}
	return nil
}

func (c *callLog) readLog(dfd int, name string) error {
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err == unix.ENOENT {
		return nil // removed by gc
	}
	if err != nil {
		return fmt.Errorf("read call log %s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	off := c.read[name]
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("read call log %s: %w", name, err)
	}
	if fi.Size() <= off {
		return nil
	}
	b := make([]byte, fi.Size()-off)
	n, err := f.ReadAt(b, off)
	if err != nil && err != io.EOF {
		return fmt.Errorf("read call log %s: %w", name, err)
	}
	b = b[:n]
	for {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			break
		}
		var rec CallRecord
		if json.Unmarshal(b[:i], &rec) == nil && rec.CallID != "" {
			c.index[rec.CallID] = &rec
		}
		b = b[i+1:]
		off += int64(i + 1)
	}
	c.read[name] = off
	return nil
}

// append writes rec as one line of this writer's log, fsynced if durable,
// opening the log (a new file) on first use.
func (c *callLog) append(dfd int, rec *CallRecord, durable bool) error {
	line, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	line = append(line, '\n')
	if c.f == nil {
		f, err := openCallLog(dfd)
		if err != nil {
			return err
		}
		c.f = f
	}
	if _, err := c.f.Write(line); err != nil {
		// A torn line is ignored by readers; start a new log next time.
		c.f.Close()
		c.f = nil
		return err
	}
	if durable {
		if err := c.f.Sync(); err != nil {
			c.f.Close()
			c.f = nil
			return err
		}
	}
	if c.index == nil {
		c.read = map[string]int64{}
		c.index = map[string]*CallRecord{}
	}
	c.index[rec.CallID] = rec
	return nil
}

// openCallLog returns a log for this writer to append to, holding its OFD
// write lock for as long as it is open: a log whose writer ended (no lock
// held) is taken over, so the number of logs stays that of the writers
// that ran at once, however many processes came and went. A new log is
// made only when every one is held.
func openCallLog(dfd int) (*os.File, error) {
	names, err := dirNames(dfd, callLogSuffix)
	if err != nil {
		return nil, fmt.Errorf("call logs: %w", err)
	}
	for _, name := range names {
		fd, err := unix.Openat(dfd, name, unix.O_RDWR|unix.O_APPEND|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			continue // removed meanwhile
		}
		if f, ok := adoptCallLog(fd, name); ok {
			return f, nil
		}
	}
	for range 3 {
		name := rand.Text() + callLogSuffix
		fd, err := unix.Openat(dfd, name, unix.O_RDWR|unix.O_APPEND|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, policy.FilePerm)
		if err != nil {
			return nil, fmt.Errorf("create call log: %w", err)
		}
		if err := syncDir(dfd); err != nil {
			unix.Close(fd)
			return nil, err
		}
		// Another writer may have taken it over between create and lock.
		if f, ok := adoptCallLog(fd, name); ok {
			return f, nil
		}
	}
	return nil, errors.New("create call log: every new log was taken by another writer")
}

// adoptCallLog takes the OFD write lock of log fd without waiting and, if
// it gets it, ends a line its last writer tore (died while appending), so
// the torn line stays one unreadable line and the next one is whole. It
// closes fd when the log is not taken.
func adoptCallLog(fd int, name string) (*os.File, bool) {
	lk := unix.Flock_t{Type: unix.F_WRLCK}
	if err := unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLK, &lk); err != nil {
		unix.Close(fd)
		return nil, false
	}
	f := os.NewFile(uintptr(fd), name)
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, false
	}
	if n := fi.Size(); n > 0 {
		last := make([]byte, 1)
		if _, err := f.ReadAt(last, n-1); err != nil {
			f.Close()
			return nil, false
		}
		if last[0] != '\n' {
			if _, err := f.Write([]byte{'\n'}); err != nil {
				f.Close()
				return nil, false
			}
		}
	}
	return f, true
}

func (c *callLog) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.f != nil {
		c.f.Close()
		c.f = nil
	}
}

// dirNames lists the names in dfd ending in suffix, not hidden.
func dirNames(dfd int, suffix string) ([]string, error) {
	dup, err := unix.Openat(dfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	d := os.NewFile(uintptr(dup), ".")
	defer d.Close()
	all, err := d.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	names := all[:0]
	for _, n := range all {
		if strings.HasSuffix(n, suffix) && !strings.HasPrefix(n, ".") {
			names = append(names, n)
		}
	}
	return names, nil
}

// recordFile names the record of key (a call id, a token) by its hash, so
// no key reaches the filesystem as a name.
func recordFile(key string) string {
	s := sha256.Sum256([]byte(key))
	return hex.EncodeToString(s[:16]) + ".json"
}

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

// writeJSONAt writes v as name in directory dfd via a temporary file, fsync
// and rename; with noReplace an existing name answers EEXIST (newname.Place).
func writeJSONAt(dfd int, name string, v any, noReplace bool) error {
	tmp, err := writeTempJSON(dfd, v)
	if err != nil {
		return err
	}
	if noReplace {
		err = newname.Place(dfd, tmp, name)
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
