package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// The lock rule of session sandboxes (SPEC §5.1, README "Locks"): the
// lease, not the scope lock, is held for the session's life; whoever takes
// the scope lock tells a live session from a dead worker's by the lease.
func TestSessionLeaseRule(t *testing.T) {
	sc := store.Scope{Space: "acme", Agent: "coder", Session: "lease"}
	ctx := context.Background()
	marker := store.Marker{Container: "loomfs-test-session", Node: "node-a", PID: 1, Time: time.Now()}
	for _, tc := range []struct {
		name      string
		leaseHeld bool
		wantCode  policy.Code // of a write's lock on the scope
	}{
		{"a live session leaves tool writes free", true, ""},
		{"a dead worker's session quarantines the scope", false, policy.Quarantined},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			owner := e.open(t, sc, nil)
			release, ok, err := owner.TakeSessionLease()
			if err != nil || !ok {
				t.Fatalf("take lease: %v %v", ok, err)
			}
			if err := owner.SetSessionMarker(marker); err != nil {
				t.Fatal(err)
			}
			other := e.openAnew(t, sc)
			if _, ok, _ := other.TakeSessionLease(); ok {
				t.Fatal("a second holder took the lease")
			}
			if !tc.leaseHeld {
				release() // the worker died: its lease went with it
			} else {
				defer release()
			}
			unlock, err := other.Lock(ctx)
			if err == nil {
				unlock()
			}
			if tc.wantCode == "" && err != nil {
				t.Fatalf("lock with a live session: %v", err)
			}
			qerr := other.CheckQuarantine()
			if policy.CodeOf(qerr) != tc.wantCode && !(tc.wantCode == "" && qerr == nil) {
				t.Fatalf("quarantine after the lock: %v, want %q", qerr, tc.wantCode)
			}
			if tc.wantCode == policy.Quarantined {
				if m, _ := other.QuarantineMarker(); m == nil || m.Container != marker.Container {
					t.Fatalf("quarantine record %+v does not name the session container", m)
				}
				if m, _ := other.SessionMarkerOf(); m != nil {
					t.Fatal("the session marker stayed beside the quarantine")
				}
			}
		})
	}
}

// While a session sandbox runs, gc and restore see the scope as busy, and
// another node may not start a one-shot command's container over it.
func TestSessionMarkerBusy(t *testing.T) {
	e := newEnv(t)
	sc := store.Scope{Space: "acme", Agent: "coder", Session: "busy"}
	ws := e.open(t, sc, nil)
	release, _, _ := ws.TakeSessionLease()
	defer release()
	if err := ws.SetSessionMarker(store.Marker{Container: "loomfs-test-busy", Node: "node-a", Time: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := e.vol.CheckIdle(sc); policy.CodeOf(err) != policy.Conflict {
		t.Errorf("CheckIdle with a session: %v, want conflict", err)
	}
	if err := ws.SetMarker(store.Marker{Container: "one-shot", Node: "node-b"}); policy.CodeOf(err) != policy.Conflict {
		t.Errorf("a command's marker from node-b: %v, want conflict", err)
	}
	if err := ws.SetMarker(store.Marker{Container: "one-shot", Node: "node-a"}); err != nil {
		t.Errorf("a command's marker from the session's node: %v", err)
	}
	ws.ClearMarker()
	ws.ClearSessionMarker()
	if err := e.vol.CheckIdle(sc); err != nil {
		t.Errorf("CheckIdle once the session ended: %v", err)
	}
}
