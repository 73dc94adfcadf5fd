// Package callrec keeps the record of a scope's tool calls (SPEC §4): once
// a call is done, replaying its id returns its result or its error; if it
// was only started, its outcome is unknown.
//
// The records of a scope live in a directory of its state directory (Dir,
// opened by the caller: package store), in append-only logs, each
// appended to by one writer (a Log that began a call) at a time, so a
// busy session adds lines, not files. Each line is one Record in JSON: a
// "started" line, fsynced before the call runs, and a "done" line,
// written once its outcome is known but not fsynced on its own: if a
// crash loses it, the call answers unknown_outcome, the answer that is
// always safe, and otherwise it reaches the disk with the log's next
// fsync or the kernel's writeback. That saves one of a write's four
// fsyncs. A reader looks an id up across every writer's log
// (incrementally: each Log keeps how far it read); an id whose last line
// is "started" was begun and never finished. A line not ending in a
// newline (a writer that died while appending it) is ignored.
//
// Two writers racing to begin the same id are decided by an OFD lock on
// LockName, held while the logs are read and the started line appended:
// one of them appends, the other finds its line. No exclusive rename is
// needed (CephFS has none). A writer holds an OFD lock on its log while it
// may append, and only the holder appends; a later writer takes over a log
// nobody holds, so a process per call still leaves one log, not one per
// process.
package callrec

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

	"github.com/agentloom/loomfs/nodeid"
	"github.com/agentloom/loomfs/ofdlock"
	"github.com/agentloom/loomfs/policy"
)

// Dir holds the record of tool calls in the scope's state directory.
const Dir = "calls"

// Call states.
const (
	Started = "started"
	Done    = "done"
)

// Record is what is remembered of one tool call.
type Record struct {
	CallID   string          `json:"call_id"`
	Tool     string          `json:"tool"`
	InputSHA string          `json:"input_sha256"`
	State    string          `json:"state"`
	Result   json.RawMessage `json:"result,omitempty"`
	Error    *policy.Error   `json:"error,omitempty"`
	Started  time.Time       `json:"started"`
	Finished time.Time       `json:"finished,omitzero"`
	// Node is the node whose writer appended the line, so that a reader
	// can tell a fenced node's late lines (Log.Late) from those of the
	// writer that took its log over.
	Node string `json:"node,omitempty"`
}

// LockName is the lock file in Dir that decides who begins a call.
const LockName = "claim.lock"

const logSuffix = ".log"

// OpenDir opens (creating it on first use) the scope's Dir for reading
// (not O_PATH: a new log's name is fsynced through it) and returns its fd,
// which the caller of OpenDir closes.
type OpenDir func() (dfd int, err error)

// Log is one writer's view of the scope's call logs. The zero Log is
// ready to use.
type Log struct {
	// Late, if set, tells whether the line [off, end) of log name, which
	// names node (another node than this one), was written after a fence
	// of that node: such a line is ignored, as if never written (package
	// fence, Marks).
	Late func(node, name string, off, end int64) (bool, error)

	mu    sync.Mutex
	f     *os.File         // this writer's log; nil until its first call
	read  map[string]int64 // log name -> offset read up to (after a newline)
	index map[string]*Record
}

// Begin records that call id starts running tool with input. If the id
// was seen before it returns that record instead and records nothing; the
// caller replays a done record and decides what an unfinished one means.
// Reusing an id for another tool or input is a conflict. An empty id
// records nothing.
//
// The wait for LockName ends with ctx: on CephFS a node that died holding
// it keeps it for about a minute.
func (c *Log) Begin(ctx context.Context, open OpenDir, id, tool string, input []byte) (*Record, error) {
	if id == "" {
		return nil, nil
	}
	if len(id) > 256 {
		return nil, policy.Errorf(policy.InvalidInput, "call id is %d bytes; the limit is 256", len(id))
	}
	sum := sha256.Sum256(input)
	node, _ := nodeid.Name()
	rec := Record{CallID: id, Tool: tool, InputSHA: hex.EncodeToString(sum[:]), State: Started, Started: time.Now().UTC(), Node: node}
	dfd, err := open()
	if err != nil {
		return nil, err
	}
	defer unix.Close(dfd)
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

// Finish records the outcome of call id. An empty id records nothing.
func (c *Log) Finish(open OpenDir, id, tool string, input []byte, result json.RawMessage, perr *policy.Error) error {
	if id == "" {
		return nil
	}
	sum := sha256.Sum256(input)
	dfd, err := open()
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	node, _ := nodeid.Name()
	rec := Record{CallID: id, Tool: tool, InputSHA: hex.EncodeToString(sum[:]), State: Done, Result: result, Error: perr, Finished: time.Now().UTC(), Node: node}
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

// Close closes this writer's log, which another writer may then take
// over.
func (c *Log) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.f != nil {
		c.f.Close()
		c.f = nil
	}
}

// callsLockBackoff paces a wait for LockName, held only while the logs
// are read and one line appended.
var callsLockBackoff = ofdlock.Backoff{First: 100 * time.Microsecond, Most: 20 * time.Millisecond}

// lockCalls takes the OFD write lock of LockName in dfd, waiting for it
// until ctx ends (polling, package ofdlock).
func lockCalls(ctx context.Context, dfd int) (unlock func(), err error) {
	fd, err := unix.Openat(dfd, LockName, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, policy.FilePerm)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", LockName, err)
	}
	if err := ofdlock.Wait(ctx, uintptr(fd), unix.Flock_t{Type: unix.F_WRLCK}, callsLockBackoff); err != nil {
		unix.Close(fd)
		if ctx.Err() != nil {
			return nil, policy.WaitEnded(ctx, "the workspace's call record is busy (another process or node holds its lock, or the storage did not answer); retry later with the same call id")
		}
		return nil, fmt.Errorf("lock %s: %w", LockName, err)
	}
	return func() {
		un := unix.Flock_t{Type: unix.F_UNLCK}
		unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLK, &un)
		unix.Close(fd)
	}, nil
}

// refresh reads the lines the logs in dfd gained since the last refresh.
func (c *Log) refresh(dfd int) error {
	names, err := logNames(dfd)
	if err != nil {
		return err
	}
	if c.read == nil {
		c.read = map[string]int64{}
		c.index = map[string]*Record{}
	}
	for _, name := range names {
		if err := c.readLog(dfd, name); err != nil {
			return err
		}
	}
	return nil
}

func (c *Log) readLog(dfd int, name string) error {
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
	node, _ := nodeid.Name()
	for {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			break
		}
		var rec Record
		if json.Unmarshal(b[:i], &rec) == nil && rec.CallID != "" {
			late := false
			if rec.Node != "" && rec.Node != node && c.Late != nil {
				if late, err = c.Late(rec.Node, name, off, off+int64(i+1)); err != nil {
					return fmt.Errorf("read call log %s: %w", name, err)
				}
			}
			if !late {
				c.index[rec.CallID] = &rec
			}
		}
		b = b[i+1:]
		off += int64(i + 1)
	}
	c.read[name] = off
	return nil
}

// append writes rec as one line of this writer's log, fsynced if durable,
// opening the log (a new file) on first use.
func (c *Log) append(dfd int, rec *Record, durable bool) error {
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
		c.index = map[string]*Record{}
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
	names, err := logNames(dfd)
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
		name := rand.Text() + logSuffix
		fd, err := unix.Openat(dfd, name, unix.O_RDWR|unix.O_APPEND|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, policy.FilePerm)
		if err != nil {
			return nil, fmt.Errorf("create call log: %w", err)
		}
		if err := unix.Fsync(dfd); err != nil { // the new log's name
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

// IsLog tells whether name, in Dir, is a call log.
func IsLog(name string) bool {
	return strings.HasSuffix(name, logSuffix) && !strings.HasPrefix(name, ".")
}

// logNames lists the call logs in dfd.
func logNames(dfd int) ([]string, error) {
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
		if IsLog(n) {
			names = append(names, n)
		}
	}
	return names, nil
}
