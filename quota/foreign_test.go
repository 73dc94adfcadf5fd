package quota

import (
	"context"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
)

// TestForeignHolder: a holder on another node (another node id) is read
// from its last sync; while it holds a grant the reconcile corrects
// nothing, and once it is gone its whole grant is counted as spent until
// the scope is counted again.
func TestForeignHolder(t *testing.T) {
	dir, err := unix.Open(t.TempDir(), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dir)
	var walked policy.Usage
	walk := func(context.Context) (policy.Usage, error) { return walked, nil }
	a, err := Open(dir, Options{Limits: policy.Limits{ScopeBytes: 1000}, Walk: walk})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := a.Usage(context.Background()); err != nil { // makes the ledger
		t.Fatal(err)
	}

	// The other node's holder: locked, its record synced with a grant of
	// 300 of which it spent 100.
	var other nodeID
	copy(other[:], "another node")
	b := make([]byte, recordSize)
	record{grant: policy.Usage{Bytes: 300}, spent: policy.Usage{Bytes: 100}}.put(b, other)
	fd, err := unix.Openat(dir, "h-other"+liveSuffix, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLK, &unix.Flock_t{Type: unix.F_WRLCK}); err != nil {
		t.Fatal(err)
	}
	unix.Pwrite(fd, b, 0)
	snap := version{base: "h-other"}
	if err := snap.publish(dir, "t-other", b); err != nil {
		t.Fatal(err)
	}
	walked = policy.Usage{Bytes: 250} // it wrote 150 more since its sync

	if err := a.Reserve(context.Background(), 601, 0); err == nil {
		t.Errorf("admitted 601 bytes beside 400 held on another node")
	}
	rep, err := a.Reconcile(context.Background(), nil)
	if err != nil || !rep.Busy || rep.Corrected != (policy.Usage{}) {
		t.Errorf("reconcile beside an active holder on another node: %+v, %v", rep, err)
	}

	// It dies: the next grant folds its whole grant in and, nobody else
	// being active, counts the scope again: 250 bytes.
	unix.Close(fd)
	if err := a.Reserve(context.Background(), 750, 0); err != nil {
		t.Errorf("after the other node's holder died: %v", err)
	}
	if u, _ := a.Usage(context.Background()); u.Bytes != 1000 {
		t.Errorf("usage %+v, want the 250 found and the 750 admitted", u)
	}
}
