package quota

import (
	"context"
	"testing"
	"time"

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

// foreignHolder makes the record of a holder on another node, synced with
// r, and locks it as its live holder would; closing the fd is its death.
func foreignHolder(t *testing.T, dir int, id string, r record) (fd int) {
	t.Helper()
	fd, err := unix.Openat(dir, id+liveSuffix, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLK, &unix.Flock_t{Type: unix.F_WRLCK}); err != nil {
		t.Fatal(err)
	}
	foreignSync(t, dir, fd, id, r)
	return fd
}

// foreignSync writes the record of the holder on another node whose live
// file is fd, as its sync would.
func foreignSync(t *testing.T, dir, fd int, id string, r record) {
	t.Helper()
	var other nodeID
	copy(other[:], "another node")
	b := make([]byte, recordSize)
	r.put(b, other)
	unix.Pwrite(fd, b, 0)
	names, err := listDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	snap := versionOf(names, id)
	if err := snap.publish(dir, "t-"+id, b); err != nil {
		t.Fatal(err)
	}
}

// TestForeignDeathWhileAnotherNodeWrites: a holder on another node dies
// with a grant while a third node's holder is active, so its whole grant
// is counted as spent and the scope can't be counted yet; the ledger says
// it is unsure, and the first holder to fold once the other node is quiet
// counts the scope again, so the account does not stay short of room.
func TestForeignDeathWhileAnotherNodeWrites(t *testing.T) {
	dir, err := unix.Open(t.TempDir(), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dir)
	walked := policy.Usage{Bytes: 100}
	walk := func(context.Context) (policy.Usage, error) { return walked, nil }
	a, err := Open(dir, Options{Limits: policy.Limits{ScopeBytes: 1000}, Walk: walk, Idle: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx := context.Background()
	if _, err := a.Usage(ctx); err != nil { // makes the ledger: 100
		t.Fatal(err)
	}
	// X on node 2 holds 300 and spent none of it; Y on node 3 holds 200.
	x := foreignHolder(t, dir, "h-x", record{grant: policy.Usage{Bytes: 300}})
	y := foreignHolder(t, dir, "h-y", record{grant: policy.Usage{Bytes: 200}})
	unix.Close(x)

	// This holder's next grant folds X in, whole: 400 counted, unsure.
	if err := a.Reserve(ctx, 10, 0); err != nil {
		t.Fatal(err)
	}
	walked.Bytes += 10
	st, err := Inspect(dir)
	if err != nil || !st.Unsure || st.Used.Bytes != 410 {
		t.Fatalf("after X died beside Y: %+v, %v; want 410 bytes counted, unsure", st, err)
	}

	// Y folds (nothing spent) and stays open: quiet. This holder goes
	// idle, folds, and counts the scope again.
	foreignSync(t, dir, y, "h-y", record{})
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err = Inspect(dir)
		if err == nil && !st.Unsure || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil || st.Unsure || st.Used.Bytes != 110 || st.Granted.Bytes != 0 {
		t.Errorf("once the other node was quiet: %+v, %v; want the 110 bytes a walk finds, sure", st, err)
	}
}
