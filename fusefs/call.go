package fusefs

import "github.com/agentloom/loomfs/audit"

// Call is the tool call a mount serves: what its audit records carry and
// whom it tells of its refusals. A mount kept for one command after
// another (sandbox.Pool) is told each command's call as it starts.
type Call struct {
	TraceID, CallID string
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
	m.fsys.call.Store(&servedCall{Call: c, actor: a})
	if m.follower != nil {
		m.follower.catchUp()
	}
}

type servedCall struct {
	Call
	actor audit.Actor
}

// served returns the call the mount serves now.
func (f *fsys) served() (traceID, callID string, actor audit.Actor, refused func(Refusal)) {
	if c := f.call.Load(); c != nil {
		return c.TraceID, c.CallID, c.actor, c.Refused
	}
	return f.opts.TraceID, f.opts.CallID, f.actor, f.opts.Refused
}
