package fusefs

import (
	"go.opentelemetry.io/otel/trace"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/tracing"
)

// Call is the tool call a mount serves: what its audit records carry and
// whom it tells of its refusals. A mount kept for one command after
// another (sandbox.Pool) is told each command's call as it starts.
type Call struct {
	TraceID, CallID string
	// Trace is the call's span (package tracing); a valid one names the
	// trace in place of TraceID, and is the parent of the spans of the
	// mount's operations, if the call is sampled for them.
	Trace trace.SpanContext
	// Container fills Actor.Container of the records.
	Container string
	// Refused, if set, is told of every refusal (see Options.Refused).
	Refused func(Refusal)
}

// Serve makes the mount's records name c from now on, in place of the
// call Options named. Calls over one scope hold its lock (SPEC §4), so one
// call is served at a time.
//
// The mount first reads the change journals to their end, so the command
// sees every change made before it started, through any door, at once.
func (m *Mounted) Serve(c Call) {
	a := m.fsys.actor
	a.Container = c.Container
	m.fsys.call.Store(newServedCall(c, a))
	if m.follower != nil {
		m.follower.catchUp()
	}
}

type servedCall struct {
	Call
	actor  audit.Actor
	traced bool // the mount's operations get spans (tracing.SampleFUSE)
}

func newServedCall(c Call, a audit.Actor) *servedCall {
	if c.Trace.IsValid() {
		c.TraceID = c.Trace.TraceID().String()
	}
	return &servedCall{Call: c, actor: a, traced: tracing.SampleFUSE(c.Trace)}
}

// served returns the call the mount serves now.
func (f *fsys) served() (traceID, callID string, actor audit.Actor, refused func(Refusal)) {
	c := f.servedCall()
	return c.TraceID, c.CallID, c.actor, c.Refused
}

// servedCall is the call the mount serves now: the one Serve named last,
// else the one its Options named.
func (f *fsys) servedCall() *servedCall {
	if c := f.call.Load(); c != nil {
		return c
	}
	return f.first
}
