package process

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/sandbox"
	"github.com/agentloom/loomfs/sandbox/enginetest"
	"github.com/agentloom/loomfs/slots"
	"github.com/agentloom/loomfs/tools"
)

// shortStarts makes session starts give up after d, waiting for a slot
// or for the engine, until restore is called or the test ends.
func shortStarts(t *testing.T, d time.Duration) (restore func()) {
	oldStart, oldSlot := sessionStartTimeout, sessionSlotWait
	sessionStartTimeout, sessionSlotWait = d, d
	restore = func() { sessionStartTimeout, sessionSlotWait = oldStart, oldSlot }
	t.Cleanup(restore)
	return restore
}

// sessionGone fails unless e's scope has no session marker, is not
// quarantined, and no container of it is left.
func sessionGone(t *testing.T, e *env) {
	t.Helper()
	if m, err := e.ws.SessionMarkerOf(); m != nil || err != nil {
		t.Errorf("session marker %+v, %v left", m, err)
	}
	if err := e.ws.CheckQuarantine(); err != nil {
		t.Errorf("scope quarantined: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if n, err := removeLabelled(ctx, sandbox.LabelScopeHash+"="+e.ws.Scope().Hash()); n > 0 || err != nil {
		t.Errorf("%d containers of the scope left (%v)", n, err)
	}
}

// TestSessionStartWaitsForASlot: a session sandbox is created in one of
// the node's start slots. With them all held, a process start waits its
// time and is refused sandbox_unavailable, which tells a model to retry
// later, leaving nothing; once a slot is free the same start runs.
func TestSessionStartWaitsForASlot(t *testing.T) {
	restore := shortStarts(t, time.Second)
	dir := t.TempDir()
	e := newEnvRunner(t, "", testNode, "acme/coder/slots", "", time.Minute, func(c *sandbox.Config) {
		c.Starts, c.StartDir = 1, dir
	})
	release, err := slots.New(dir, 1).Take(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	err = e.call(tools.ProcessStart, map[string]any{"command": "echo hi"}, nil)
	if policy.CodeOf(err) != policy.SandboxUnavailable || !errors.Is(err, sandbox.ErrEngineBusy) || !strings.Contains(err.Error(), "retry later") {
		t.Fatalf("start with the node's start slot held: %v, want sandbox_unavailable telling the model to retry later, from ErrEngineBusy", err)
	}
	sessionGone(t, e)
	release()
	restore() // the start that runs has the whole time a loaded engine may take
	out := e.start(map[string]any{"command": "echo hi", "yield_ms": 5000})
	if out.Status != tools.StatusExited || !strings.Contains(out.Output, "hi") {
		t.Fatalf("start after the slot was freed: %+v", out)
	}
}

// TestSessionStartBounded: an engine that never answers a session
// container's start request (dockerd deadlocked in a burst of creations)
// fails the start within its bound instead of holding the caller for
// good; the container is removed and the scope left usable.
func TestSessionStartBounded(t *testing.T) {
	shortStarts(t, 2*time.Second)
	stuck := func(_ http.ResponseWriter, r *http.Request) (bool, func()) {
		if enginetest.IsStart(r) {
			<-r.Context().Done() // until the caller gives up
			return false, nil
		}
		return true, nil
	}
	e := newEnvRunner(t, "", testNode, "acme/coder/stuck", "", time.Minute, func(c *sandbox.Config) {
		c.Host = enginetest.Proxy(t, c.Host, stuck)
	})
	began := time.Now()
	err := e.call(tools.ProcessStart, map[string]any{"command": "echo hi"}, nil)
	if policy.CodeOf(err) != policy.SandboxStartFailed || !strings.Contains(err.Error(), "deadline") {
		t.Fatalf("start on an engine that never starts it: %v, want sandbox_start_failed saying the deadline passed", err)
	}
	t.Logf("answered in %s", time.Since(began).Round(time.Millisecond))
	sessionGone(t, e)
}
