package tools

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.uber.org/zap"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/callrec"
	"github.com/agentloom/loomfs/hooks"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
	"github.com/agentloom/loomfs/tracing"
)

// CommandRequest is one workspace_command call handed to a CommandRunner.
type CommandRequest struct {
	Command string
	Timeout time.Duration
	CallID  string
}

// CommandResult is what a command did (SPEC §4, workspace_command).
type CommandResult struct {
	ExitCode        int    `json:"exit_code"`
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	TimedOut        bool   `json:"timed_out"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
	Container       string `json:"container,omitempty"`
	DurationMS      int64  `json:"duration_ms"`
	// PolicyEvents are the refusals the command met in the workspace.
	PolicyEvents PolicyEvents `json:"policy_events"`
}

// PolicyEvents are the refusals a command met in its projection of the
// workspace. Refusals of the same operation on the same path for the same
// reason are one event with a count (a program retrying a write that
// meets the quota is refused once per write); MaxPolicyEvents events are
// listed, and Total and Dropped count every refusal.
type PolicyEvents struct {
	Events  []PolicyEvent `json:"events"`
	Total   int           `json:"total"`
	Dropped int           `json:"dropped"`
}

// PolicyEvent is one refusal: the filesystem operation, the path in the
// workspace, the errno the program got, the code and message a tool would
// have given (the first one's, when Count is more than 1), and how many
// times it happened.
type PolicyEvent struct {
	Op      string `json:"op"`
	Path    string `json:"path"`
	Errno   string `json:"errno"`
	Code    string `json:"code"`
	Message string `json:"message"`
	Count   int    `json:"count"`
}

// MaxPolicyEvents is how many events a command's result lists; the
// refusals of the others are counted in Dropped.
const MaxPolicyEvents = 50

// Add counts the refusal e, into a listed event of the same operation,
// path and code or a new one while fewer than MaxPolicyEvents are listed.
func (p *PolicyEvents) Add(e PolicyEvent) {
	p.Total++
	for i := range p.Events {
		if x := &p.Events[i]; x.Op == e.Op && x.Path == e.Path && x.Code == e.Code && x.Errno == e.Errno {
			x.Count++
			return
		}
	}
	if len(p.Events) >= MaxPolicyEvents {
		p.Dropped++
		return
	}
	e.Count = 1
	p.Events = append(p.Events, e)
}

// CommandRunner runs a command in a sandbox over the workspace. The caller
// already holds the scope lock.
type CommandRunner interface {
	RunCommand(ctx context.Context, ws *store.Workspace, req CommandRequest) (CommandResult, error)
}

// Toolbox serves the tools over one workspace.
type Toolbox struct {
	WS       *store.Workspace
	Commands CommandRunner // nil: workspace_command answers sandbox_unavailable
	// Processes runs the process tools (SPEC §5.1); nil: they answer
	// process_service_unavailable.
	Processes ProcessRunner
	Audit     audit.Sink // nil: audit.Discard
	// Changed is told of every path the tools changed, so an in-process
	// FUSE projection can drop its caches.
	Changed func(rel string)
	// Log receives what a model must not read: the detail of operator
	// trouble (host paths, system errors). nil: discarded.
	Log *zap.Logger
	// LockWait bounds the wait for the scope lock (default 30 s).
	LockWait time.Duration
	// TraceID and Actor are copied into every audit record. A call whose
	// context carries a span (package tracing) is recorded with that
	// span's trace id instead.
	TraceID string
	Actor   audit.Actor
	// Hooks are the platform's tool.before and tool.after hooks (package
	// hooks); nil runs none.
	Hooks *hooks.Chain
	// Fenced, if set, is asked before every call: once it answers an
	// error (the volume shut this node out, store.WatchFence), every call
	// is refused with it, unaudited, for a fenced node writes nothing.
	Fenced func() error

	inflight sync.WaitGroup
}

// Call runs the named tool with JSON input. callID, if set, makes a change
// replayable (SPEC §4); a read is not recorded and runs again. The result is JSON; a refusal is a *policy.Error
// as a model may read it (policy.Public): operator trouble is logged to Log
// with its detail and answered without it.
func (t *Toolbox) Call(ctx context.Context, name, callID string, input json.RawMessage) (json.RawMessage, error) {
	ctx, span := tracing.Start(ctx, "tool "+name, attribute.String("loomfs.tool", name),
		attribute.String("loomfs.call_id", callID), attribute.String("loomfs.scope", t.WS.Scope().Hash()))
	defer span.End()
	var res json.RawMessage
	var err error
	if t.Fenced != nil {
		err = t.Fenced()
	}
	if err == nil {
		res, err = t.audited(ctx, name, callID, input)
	}
	if err != nil {
		orig, pe := policy.AsError(err), policy.Public(err)
		span.SetAttributes(attribute.String("loomfs.code", string(pe.Code)))
		span.SetStatus(codes.Error, string(pe.Code))
		// The operator hears of what a model can't fix: trouble whose
		// message the boundary replaced, and a full volume.
		if pe.Message != orig.Message || pe.Code == policy.NoSpace {
			fields := []zap.Field{zap.String("tool", name), zap.String("call_id", callID),
				zap.String("code", string(orig.Code)), zap.Error(orig)}
			if orig.Err != nil && !strings.Contains(orig.Message, orig.Err.Error()) {
				fields = append(fields, zap.NamedError("cause", orig.Err))
			}
			t.log().Warn("tool call failed", fields...)
		}
		return nil, pe
	}
	return res, nil
}

// traceID is the trace a call in ctx belongs to: its span's, else the
// one the toolbox was given.
func (t *Toolbox) traceID(ctx context.Context) string {
	if id := tracing.TraceID(ctx); id != "" {
		return id
	}
	return t.TraceID
}

// audited runs the call between its audit records.
func (t *Toolbox) audited(ctx context.Context, name, callID string, input json.RawMessage) (res json.RawMessage, err error) {
	begun := time.Now()
	h, ok := handlers[name]
	if !ok {
		return nil, policy.Errorf(policy.InvalidInput, "unknown tool %q; known tools: %s", name, strings.Join(Names, ", "))
	}
	if len(bytes.TrimSpace(input)) == 0 {
		input = json.RawMessage("{}")
	}
	ev := audit.Event{TraceID: t.traceID(ctx), CallID: callID, Actor: t.Actor, Scope: t.WS.Scope().Hash(), Source: audit.SourceTool, Op: name}
	fields, ferr := topFields(name, input)
	if !t.Hooks.Empty() {
		// The after hooks see every outcome; the before hooks see
		// validated arguments, and a rewrite is validated again.
		defer func() { t.after(ctx, name, callID, input, res, err) }()
		if ferr == nil {
			input, fields, ferr = t.before(ctx, name, callID, input, &ev)
		}
	}
	json.Unmarshal(fields["path"], &ev.Path)
	// A change is recorded before it is made ("started"), so nothing
	// changes unrecorded. A read changes nothing, and input refused before
	// anything runs is known at once: each is one record, its outcome, one
	// append instead of two.
	mutating := Mutating(name) && ferr == nil
	var start *startRecord
	if mutating {
		started := ev
		started.Result = "started"
		start = t.recordStart(ctx, name, started)
	}

	err = ferr
	if err == nil {
		res, err = t.callWithin(ctx, h, name, callID, input, start)
		// The scope's I/O limits (throttle): the call's bytes are its
		// input and its result. It answers late, never fails.
		lim := t.WS.Limiter()
		if d := lim.Wait(ctx, len(input)+len(res)); d > 0 {
			ev.Detail = map[string]any{"throttled_ms": d.Milliseconds()}
		}
	}

	ev.Duration = time.Since(begun)
	// The outcome follows its start in the log; a change whose start
	// record was not written has done nothing and gets no outcome record.
	if serr := start.wait(ctx); serr != nil {
		return nil, serr
	}
	if err != nil {
		pe := policy.AsError(err)
		ev.Result, ev.Code = "refused", string(pe.Code)
		if pe.Code == policy.Internal {
			ev.Result = "error"
		}
		if rerr := t.sink().Record(ctx, ev); rerr != nil && !mutating {
			return nil, auditErr(rerr)
		}
		return nil, pe
	}
	ev.Result = "ok"
	if mutating {
		// Results of changes are small; reads' would cost a second parse.
		var m struct {
			Bytes  int64  `json:"bytes"`
			SHA256 string `json:"sha256"`
		}
		json.Unmarshal(res, &m)
		ev.Bytes, ev.SHA256 = m.Bytes, m.SHA256
		if name == ApplyPatch {
			ev.Detail = patchDetail(res)
		}
	}
	// A change is made by now: a failure to record its outcome is kept in
	// the log's status, not turned into a false refusal. A read whose only
	// record could not be written is refused: nothing goes unrecorded.
	if err := t.sink().Record(ctx, ev); err != nil && !mutating {
		return nil, auditErr(err)
	}
	return res, nil
}

// callWithin runs the call in its own goroutine and waits at most until
// ctx is done. A handler blocked in a system call that can't be interrupted
// (a hung NFS server) then keeps its goroutine, but the caller gets its
// answer within its budget: a timeout for a read, unknown_outcome for a
// change that may yet complete. The call record tells a replay which.
func (t *Toolbox) callWithin(ctx context.Context, h handler, name, callID string, input json.RawMessage, start *startRecord) (json.RawMessage, error) {
	type outcome struct {
		res json.RawMessage
		err error
	}
	done := make(chan outcome, 1)
	t.inflight.Add(1)
	go func() {
		defer t.inflight.Done()
		res, err := t.call(ctx, h, name, callID, input, start)
		done <- outcome{res, err}
	}()
	select {
	case o := <-done:
		return o.res, o.err
	case <-ctx.Done():
	}
	// A handler that honours ctx (a lock wait, a search) stops at once:
	// give it a moment to say how it ended.
	grace := time.NewTimer(cancelGrace)
	defer grace.Stop()
	select {
	case o := <-done:
		return o.res, o.err
	case <-grace.C:
	}
	if !start.written() {
		// The handler changes nothing before its start record is kept.
		return nil, start.notStarted()
	}
	if Mutating(name) {
		return nil, policy.Errorf(policy.UnknownOutcome, "%s was still running when the call's budget ran out (%v); it may yet complete: re-read the files concerned before retrying", name, ctx.Err())
	}
	if ctx.Err() == context.Canceled {
		return nil, policy.Errorf(policy.Cancelled, "%s was cancelled", name)
	}
	return nil, policy.Errorf(policy.Timeout, "%s did not finish within the call's budget; the storage may be slow or hung", name)
}

// cancelGrace is how long a call whose budget ran out may take to report
// its real outcome before the caller is answered without it.
const cancelGrace = 250 * time.Millisecond

// Wait waits for calls that outlived their caller's budget. Call it before
// closing the workspace when the process goes on.
func (t *Toolbox) Wait() { t.inflight.Wait() }

func (t *Toolbox) call(ctx context.Context, h handler, name, callID string, input json.RawMessage, start *startRecord) (json.RawMessage, error) {
	// Only changes are recorded for replay (SPEC §4): replaying a read
	// is reading again.
	recordID := ""
	if Mutating(name) {
		recordID = callID
	}
	rec, err := t.WS.BeginCall(ctx, recordID, name, input)
	if err != nil {
		return nil, err
	}
	if rec != nil {
		switch {
		case rec.State == callrec.Done && rec.Error != nil:
			return nil, rec.Error
		case rec.State == callrec.Done:
			return rec.Result, nil
		}
		return nil, policy.Errorf(policy.UnknownOutcome, "call %q started earlier but its outcome was never recorded (the worker may have stopped); it is not re-run: re-read the files concerned and decide", callID)
	}
	// A change takes the scope lock; so does a read that finds a change
	// set under way or cut by a crash (store/intent.go), which it then
	// waits out or finishes: no read sees a patch half applied. A process
	// tool's runner takes it itself, briefly.
	if !selfLocking[name] && (Mutating(name) || t.WS.ChangeSetPending()) {
		wait := t.LockWait
		if wait == 0 {
			wait = 30 * time.Second
		}
		lctx, cancel := context.WithTimeout(ctx, wait)
		unlock, err := t.WS.Lock(lctx)
		cancel()
		if err != nil {
			return nil, t.finish(recordID, name, input, nil, err)
		}
		if Mutating(name) {
			defer t.letGo(unlock)
		} else {
			unlock()
		}
	}
	// Nothing changes before the change's start record is kept (audited).
	if err := start.wait(ctx); err != nil {
		return nil, t.finish(recordID, name, input, nil, err)
	}
	// The change journal's lines say the tool door and the call made them.
	ctx = store.WithChange(ctx, store.Change{Source: store.SourceTool, Call: callID})
	out, err := h(context.WithValue(ctx, callIDKey{}, callID), t, input)
	if err != nil {
		return nil, t.finish(recordID, name, input, nil, err)
	}
	b, merr := json.Marshal(out)
	if merr != nil {
		return nil, fmt.Errorf("encode %s result: %w", name, merr)
	}
	return b, t.finish(recordID, name, input, b, nil)
}

// letGo lets a change's scope lock go in a goroutine of its own, so that
// the call's answer and its outcome record do not wait for the unlock, a
// round trip to a shared volume's server. A Lock of the workspace made
// meanwhile waits for it as for any other holder's (each Lock holds its
// own open of the lock file). Wait waits for it too.
func (t *Toolbox) letGo(unlock func()) {
	t.inflight.Add(1)
	go func() {
		defer t.inflight.Done()
		unlock()
	}()
}

// finish records the outcome for replay and returns err unchanged, or the
// recording failure when the outcome can't be kept.
func (t *Toolbox) finish(callID, name string, input, result json.RawMessage, err error) error {
	var pe *policy.Error
	if err != nil {
		pe = policy.AsError(err)
	}
	if ferr := t.WS.FinishCall(callID, name, input, result, pe); ferr != nil && err == nil {
		return ferr
	}
	return err
}

// startRecord is a change's "started" audit record on its way to the log.
// It is written while the call records its call id and takes the scope
// lock, each a round trip to the volume's storage too: on CephFS a record
// is up to three (the chain's lock, its stat, the append; BENCHMARKS.md).
// The handler waits for it before it changes anything (call), and the
// outcome is recorded after it (audited), so the log still holds every
// change's start before its effect.
type startRecord struct {
	op   string
	done chan struct{}
	err  error // set before done is closed
}

// recordStart writes e, a change's start, in a goroutine of its own. The
// audit log is on the volume, whose storage may not answer: the caller's
// wait ends with its budget (wait), and nothing has been done then.
func (t *Toolbox) recordStart(ctx context.Context, op string, e audit.Event) *startRecord {
	s := &startRecord{op: op, done: make(chan struct{})}
	t.inflight.Add(1)
	go func() {
		defer t.inflight.Done()
		defer close(s.done)
		if err := t.sink().Record(ctx, e); err != nil {
			s.err = auditErr(err)
		}
	}()
	return s
}

// wait waits until the start record is written or ctx is done and says
// whether the change may go ahead. A nil startRecord (a call that changes
// nothing) always may.
func (s *startRecord) wait(ctx context.Context) error {
	if s == nil {
		return nil
	}
	select {
	case <-s.done: // written, even if ctx is done too
		return s.err
	default:
	}
	select {
	case <-s.done:
		return s.err
	case <-ctx.Done():
		return s.notStarted()
	}
}

// written reports whether the record's write has ended, kept or not.
func (s *startRecord) written() bool {
	if s == nil {
		return true
	}
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

func (s *startRecord) notStarted() error {
	return policy.Errorf(policy.Timeout, "%s was not started: the audit log's storage did not answer within the call's budget; nothing was changed, retry later", s.op)
}

func (t *Toolbox) sink() audit.Sink {
	if t.Audit == nil {
		return audit.Discard
	}
	return t.Audit
}

func (t *Toolbox) log() *zap.Logger {
	if t.Log == nil {
		return zap.NewNop()
	}
	return t.Log
}

func (t *Toolbox) changed(rel string) {
	if t.Changed != nil {
		t.Changed(rel)
	}
}

func auditErr(err error) error {
	return policy.Unavailable(policy.AuditUnavailable, "the audit log", err)
}

type callIDKey struct{}

// CallID returns the call id a handler runs under.
func CallID(ctx context.Context) string {
	id, _ := ctx.Value(callIDKey{}).(string)
	return id
}

// handler runs one tool; it returns a value to encode as the result.
type handler func(ctx context.Context, t *Toolbox, input json.RawMessage) (any, error)

var handlers = map[string]handler{
	List:    handleList,
	Stat:    handleStat,
	Glob:    handleGlob,
	Grep:    handleGrep,
	Read:    handleRead,
	Write:   handleWrite,
	Edit:    handleEdit,
	Mkdir:   handleMkdir,
	Delete:  handleDelete,
	Command: handleCommand,

	ApplyPatch: handleApplyPatch,
	ReadImage:  handleReadImage,
	Changes:    handleChanges,
	ForkStatus: handleForkStatus,
}

// decode parses input strictly into v: unknown fields and wrong types are
// refused with a message naming the field.
func decode(input json.RawMessage, v any) error {
	dec := json.NewDecoder(bytes.NewReader(input))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &te):
			return policy.Errorf(policy.InvalidInput, "input field %q must be %s, not %s", te.Field, te.Type, te.Value)
		case strings.HasPrefix(err.Error(), "json: unknown field"):
			return policy.Errorf(policy.InvalidInput, "input has an %s; see the tool's input schema", strings.TrimPrefix(err.Error(), "json: "))
		default:
			return policy.Errorf(policy.InvalidInput, "input is not a JSON object: %v", err)
		}
	}
	if _, err := dec.Token(); err != io.EOF {
		return policy.Errorf(policy.InvalidInput, "input has trailing data after the JSON object")
	}
	return nil
}

// required lists each tool's required fields, from the schemas in defs.go.
var required = func() map[string][]string {
	m := map[string][]string{}
	for _, d := range Definitions(policy.Default()) {
		var s struct {
			Required []string `json:"required"`
		}
		json.Unmarshal(d.InputSchema, &s)
		m[d.Name] = s.Required
	}
	return m
}()

// topFields parses the input's top level once, refusing a non-object and
// an input that lacks a required field (so a missing field is never read as
// its zero value: "" for new_text would delete).
func topFields(name string, input json.RawMessage) (map[string]json.RawMessage, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(input, &fields); err != nil || fields == nil {
		return nil, policy.Errorf(policy.InvalidInput, "input is not a JSON object; see the tool's input schema")
	}
	for _, f := range required[name] {
		if _, ok := fields[f]; !ok {
			return fields, policy.Errorf(policy.InvalidInput, "input field %q is required; see the tool's input schema", f)
		}
	}
	return fields, nil
}
