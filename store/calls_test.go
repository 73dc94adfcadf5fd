package store_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/callrec"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// TestBeginCallWaitEndsWithTheCall: while another open file holds the
// lock that decides who begins a call (on CephFS a node that died holding
// it keeps it for about a minute), BeginCall waits only as long as its
// context lasts and answers timeout; the Workspace is not left stuck, and
// the same id begins once the lock is free.
func TestBeginCallWaitEndsWithTheCall(t *testing.T) {
	e := newEnv(t)
	ws := e.open(t, mainScope, nil)
	input := []byte(`{"path":"a.txt","content":"x"}`)
	// A first call makes the calls directory and its lock file.
	if _, err := ws.BeginCall(context.Background(), "c-0", "workspace_write", input); err != nil {
		t.Fatal(err)
	}
	lock := filepath.Join(e.root, store.LocksDir, mainScope.Hash(), callrec.Dir, callrec.LockName)
	fd, err := unix.Open(lock, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLK, &unix.Flock_t{Type: unix.F_WRLCK}); err != nil {
		t.Fatal(err)
	}
	// Let the lock go after 3 s whatever happens, so that a wait that
	// can't end early fails the test instead of hanging it.
	freed := time.AfterFunc(3*time.Second, func() {
		unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLK, &unix.Flock_t{Type: unix.F_UNLCK})
	})
	defer freed.Stop()

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = ws.BeginCall(ctx, "c-1", "workspace_write", input)
	waited := time.Since(start)
	if policy.CodeOf(err) != policy.Timeout {
		t.Errorf("BeginCall while the calls lock is held, the call ending at 100 ms: %v, want timeout", err)
	}
	if waited > time.Second {
		t.Errorf("BeginCall waited %v for the calls lock; its call ended at 100 ms", waited)
	}
	if !freed.Stop() {
		t.Fatal("the lock was let go before the check")
	}
	unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLK, &unix.Flock_t{Type: unix.F_UNLCK})
	if rec, err := ws.BeginCall(context.Background(), "c-1", "workspace_write", input); err != nil || rec != nil {
		t.Errorf("c-1 once the lock is free: %+v, %v; want it begun now", rec, err)
	}
}
