// Package audit keeps loomfs's tamper-evident operation log: one JSON record
// per operation, hash-chained, appended to files under <root>/.agentloom-audit
// that no scope, projection or container can reach.
//
// Every door (tools, FUSE, sandbox, admin commands) writes through a Sink; a
// Log is the Sink backed by files. All writers of one node append to the
// node's one chain, <node>.<day>.<n>.jsonl, taking turns under an OFD lock,
// so files grow with records, not with processes. Every record carries its
// sequence number and the sha256 of the exact bytes of the record before it,
// so Verify finds any edited, dropped, inserted or reordered record.
//
// Each node also keeps a ledger of its writers, <node>.ledger.jsonl, itself
// hash-chained: a writer is registered there before its first record and
// closed there with its count and last hash, so Verify finds a writer whose
// records were removed whole, a cut tail and a writer that ended without
// closing. With a node key (GenerateKey) writers sign the ledger's head at
// rotation, at close and every few minutes; Heads exports every node's head
// as an Anchor to keep elsewhere. Query, Tail and Follow read the log back.
//
// A Log writes synchronously unless opened with Options.Queue, which a
// long-lived writer on a request's path (a mount) uses. Record then checks
// and copies the event, stamps it with the time of the call and puts it
// in a bounded queue; one goroutine of the Log, woken by a record,
// gathers records for 5 ms (longer where a write is dear) and encodes,
// chains and appends them in one write(2) under one hold of the chain
// lock. It lets the lock go once a look finds no new record, and for a
// moment at least every 5 ms under load, so the node's other writers wait
// little longer than that. Records keep the order of the
// Record calls and their time stamps, and none is dropped: Record waits
// while the queue is full, for as long as the writer's writes take (only
// storage that does not answer makes that long); a failed write keeps its
// records queued and is retried, and from the first failure on Record
// returns ErrUnavailable until a write succeeds again. What the queue
// changes is which operation a failure refuses: a synchronous Log refuses
// the operation whose own record could not be written, a queued one has
// accepted that record and those queued with it, and refuses from the
// next operation on; Options.Sync keeps the old behaviour. Close writes
// the queue out before the writer's close entry; a queue it can't write
// (it retries for a few seconds) is lost, Close says how many records,
// and the writer has no close entry. A writer killed with SIGKILL loses
// what was still queued: the records of the last 5 ms on a local disk,
// of the last few tens of milliseconds at most where a write is dear, at
// most Queue records; Verify reports it, like any killed writer, as ended
// without closing.
//
// The package never reads workspace files and never decides policy: a caller
// that gets ErrUnavailable from Record must refuse the operation itself.
package audit

import (
	"context"
	"errors"
	"path/filepath"
	"time"
)

// DirName is the audit directory under a volume root, outside every scope.
const DirName = ".agentloom-audit"

// Dir returns the audit directory of the volume rooted at root.
func Dir(root string) string { return filepath.Join(root, DirName) }

// ErrUnavailable reports that a record could not be written. Callers refuse
// the operation it describes (error code audit_unavailable): an operation
// that cannot be audited does not happen.
var ErrUnavailable = errors.New("audit_unavailable: audit log cannot be written")

// Source says which door an operation came through.
type Source string

// Sources of records.
const (
	SourceTool    Source = "tool"
	SourceFUSE    Source = "fuse"
	SourceSandbox Source = "sandbox"
	SourceAdmin   Source = "admin"
	// SourcePlatform is the platform's own door (package stage): the
	// layout made at first use, inputs staged, outputs collected.
	SourcePlatform Source = "platform"
)

// Record kinds.
const (
	KindEvent      = "event"
	KindCheckpoint = "checkpoint"
)

// Actor names who acted, with ids from the platform's authorised run record.
// Container is set for operations of sandbox commands, Operator for the
// platform's (the identity it gave, e.g. loomfs stage --actor).
type Actor struct {
	Space     string `json:"space,omitempty"`
	Agent     string `json:"agent,omitempty"`
	Session   string `json:"session,omitempty"`
	Run       string `json:"run,omitempty"`
	Instance  string `json:"instance,omitempty"`
	Container string `json:"container,omitempty"`
	Operator  string `json:"operator,omitempty"`
}

// Event is one operation as a door reports it. The Log adds time, node, pid,
// sequence number and chain hash.
type Event struct {
	TraceID  string         `json:"trace_id,omitempty"`
	CallID   string         `json:"call_id,omitempty"`
	Actor    Actor          `json:"actor,omitzero"`
	Scope    string         `json:"scope,omitempty"` // scope hash
	Source   Source         `json:"source,omitempty"`
	Op       string         `json:"op,omitempty"` // e.g. workspace_write, create, unlink, release, container_start
	Path     string         `json:"path,omitempty"`
	NewPath  string         `json:"new_path,omitempty"`
	Bytes    int64          `json:"bytes,omitempty"`
	SHA256   string         `json:"sha256,omitempty"`
	Result   string         `json:"result,omitempty"` // ok, refused, error, started
	Code     string         `json:"code,omitempty"`   // loomfs error code when refused or failed
	Duration time.Duration  `json:"duration_ns,omitempty"`
	Detail   map[string]any `json:"detail,omitempty"` // optional extras: exit code, container id…
}

// Record is one line of the log as read back: an event or a checkpoint.
type Record struct {
	Time time.Time `json:"time"` // when the record was written, UTC
	Kind string    `json:"kind"` // KindEvent or KindCheckpoint
	Node string    `json:"node"`
	PID  int       `json:"pid"`
	// Writer is the writer's number in its node's ledger (0 in the legacy
	// per-process format).
	Writer uint64 `json:"writer,omitempty"`
	Seq    uint64 `json:"seq"`  // 1 for a chain's first record
	Prev   string `json:"prev"` // hex sha256 of the previous line, "" for seq 1

	Event

	// PathB64 and NewPathB64 hold the exact bytes of a path that is not
	// valid UTF-8 (JSON can only carry such a path lossily); reading a
	// record restores Path and NewPath from them.
	PathB64    string `json:"path_b64,omitempty"`
	NewPathB64 string `json:"new_path_b64,omitempty"`

	// Checkpoint fields, at the end of each file of a chain: the records
	// in the file before it (legacy: events in the chain), hash of the line
	// before it, why it was written ("rotate", legacy also "close") and the
	// file that continues the chain.
	Count  uint64 `json:"count,omitempty"`
	Head   string `json:"head,omitempty"`
	Reason string `json:"reason,omitempty"`
	Next   string `json:"next,omitempty"`
}

// A Sink accepts audit records. Record returns an error wrapping
// ErrUnavailable when the record could not be kept.
type Sink interface {
	Record(ctx context.Context, e Event) error
}

// Discard is a Sink that accepts and drops everything, for tests and for
// callers that run without auditing.
var Discard Sink = discard{}

type discard struct{}

func (discard) Record(context.Context, Event) error { return nil }
