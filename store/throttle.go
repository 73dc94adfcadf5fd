package store

import (
	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/throttle"
)

// ThrottleDir holds, in the scope's state directory, one locked file per
// process doing throttled I/O in the scope, so that every process and node
// holds the scope's I/O limits together (package throttle).
const ThrottleDir = "throttle"

// Limiter returns the scope's I/O limiter, shared by every door of this
// process and, through ThrottleDir, held together with every other process
// serving the scope; nil when the policy sets no I/O limit. If the
// directory can't be opened the limiter holds this process alone to the
// limits: throttling never fails a call.
func (w *Workspace) Limiter() *throttle.Limiter {
	l := throttle.For(w.scope.Hash(), throttle.RatesOf(w.pol.Limits))
	if l == nil || l.Sharing() {
		return l
	}
	if dfd, err := w.stateSubdir(ThrottleDir); err == nil {
		l.Share(dfd)
		unix.Close(dfd)
	}
	return l
}
