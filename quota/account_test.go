package quota_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/quota"
)

// scope is a stand-in for a scope: what its walk counts.
type scope struct{ bytes, files atomic.Int64 }

func (s *scope) walk(context.Context) (policy.Usage, error) {
	return policy.Usage{Bytes: s.bytes.Load(), Files: s.files.Load()}, nil
}

func openDir(t testing.TB, path string) int {
	t.Helper()
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

func open(t *testing.T, dir int, opts quota.Options) *quota.Account {
	t.Helper()
	a, err := quota.Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

func limits(bytes, files int64) policy.Limits {
	return policy.Limits{ScopeBytes: bytes, ScopeFiles: files}
}

// TestHoldersShareOneQuota: holders writing at once admit no more than the
// quota together, and the one refused is told the figures across all.
func TestHoldersShareOneQuota(t *testing.T) {
	dir := openDir(t, t.TempDir())
	sc := &scope{}
	const quotaBytes = 1 << 20
	var accts []*quota.Account
	for range 3 {
		accts = append(accts, open(t, dir, quota.Options{Limits: limits(quotaBytes, 0), Walk: sc.walk}))
	}
	var admitted atomic.Int64
	var refused atomic.Pointer[error]
	var wg sync.WaitGroup
	for _, a := range accts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				err := a.Reserve(context.Background(), 4096, 0)
				if err != nil {
					refused.Store(&err)
					return
				}
				admitted.Add(4096)
			}
		}()
	}
	wg.Wait()
	if got := admitted.Load(); got != quotaBytes {
		t.Errorf("admitted %d bytes under a quota of %d", got, quotaBytes)
	}
	err := *refused.Load()
	want := "quota exceeded: workspace total 1 MiB (used 1 MiB, write of 4 KiB refused)"
	if policy.CodeOf(err) != policy.QuotaExceeded || err.Error() != want {
		t.Errorf("refusal %q (%s), want %q", err, policy.CodeOf(err), want)
	}
	u, err := accts[0].Usage(context.Background())
	if err != nil || u.Bytes != quotaBytes {
		t.Errorf("Usage = %+v, %v; want %d bytes", u, err, quotaBytes)
	}
	// What one gives back, another may take.
	accts[1].Adjust(-8192, 0)
	if err := accts[2].Reserve(context.Background(), 8192, 0); err != nil {
		t.Errorf("after 8 KiB given back: %v", err)
	}
}

// TestFileQuota: files are counted the same way, and shrinking always
// passes.
func TestFileQuota(t *testing.T) {
	dir := openDir(t, t.TempDir())
	sc := &scope{}
	sc.files.Store(3)
	a := open(t, dir, quota.Options{Limits: limits(0, 5), Walk: sc.walk})
	b := open(t, dir, quota.Options{Limits: limits(0, 5), Walk: sc.walk})
	if err := a.Reserve(context.Background(), 0, 1); err != nil {
		t.Fatal(err)
	}
	err := b.Reserve(context.Background(), 0, 2)
	if err == nil || err.Error() != "quota exceeded: workspace file count 5 (used 4, 2 new refused)" {
		t.Errorf("refusal %v", err)
	}
	if err := b.Reserve(context.Background(), 0, -3); err != nil {
		t.Errorf("shrinking: %v", err)
	}
	if err := b.Reserve(context.Background(), 0, 2); err != nil {
		t.Errorf("after shrinking: %v", err)
	}
}

// TestIdleHolderReturnsGrant: a holder that goes idle folds its spending
// into the ledger and keeps no grant, so another holder gets everything
// left.
func TestIdleHolderReturnsGrant(t *testing.T) {
	path := t.TempDir()
	dir := openDir(t, path)
	sc := &scope{}
	opts := quota.Options{Limits: limits(1000, 0), Walk: sc.walk, Idle: 50 * time.Millisecond}
	a := open(t, dir, opts)
	if err := a.Reserve(context.Background(), 100, 0); err != nil {
		t.Fatal(err)
	}
	st, _ := quota.Inspect(dir)
	if st.Granted.Bytes == 0 || st.Used.Bytes != 100 {
		t.Errorf("while active: %+v", st)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, _ = quota.Inspect(dir)
		if st.Granted.Bytes == 0 && st.Ledger.Bytes == 100 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("idle holder kept its grant: %+v", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
	b := open(t, dir, opts)
	if err := b.Reserve(context.Background(), 900, 0); err != nil {
		t.Errorf("the rest of the quota: %v", err)
	}
}

// TestIdleFoldTriedAgain: a holder whose fold fails (the ledger's lock
// held past the fold's brief wait) tries again, and again, so an idle
// holder does not keep its grant and its unfolded spending for good.
func TestIdleFoldTriedAgain(t *testing.T) {
	path := t.TempDir()
	dir := openDir(t, path)
	opts := quota.Options{Limits: limits(1000, 0), Walk: (&scope{}).walk, Idle: 20 * time.Millisecond}
	a := open(t, dir, opts)
	if err := a.Reserve(context.Background(), 100, 0); err != nil {
		t.Fatal(err)
	}
	release := holdLedgerLock(t, path)
	// The fold starts after 20 ms and gives up 5 ms later, many times
	// over while the lock is held.
	time.Sleep(600 * time.Millisecond)
	release()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, _ := quota.Inspect(dir)
		if st.Granted.Bytes == 0 && st.Ledger.Bytes == 100 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("an idle holder whose fold failed kept its grant: %+v", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestChangeDoesNotWaitBehindIdleFold: while an idle holder's fold waits
// for the ledger's lock (another process holds it), a change that fits
// the holder's grant, which needs no lock, goes through before the lock is
// let go: the fold waits only briefly, and tries again later.
func TestChangeDoesNotWaitBehindIdleFold(t *testing.T) {
	path := t.TempDir()
	dir := openDir(t, path)
	idle := 200 * time.Millisecond
	a := open(t, dir, quota.Options{Limits: limits(1<<20, 0), Walk: (&scope{}).walk, Idle: idle})
	if err := a.Reserve(context.Background(), 100, 0); err != nil { // takes a grant
		t.Fatal(err)
	}
	release := holdLedgerLock(t, path)
	// The holder goes idle and its fold starts waiting for the lock.
	time.Sleep(idle + idle/2)
	done := make(chan error, 1)
	go func() { done <- a.Reserve(context.Background(), 10, 0) }()
	// The lock stays held: a change stuck behind a fold that waits as
	// long as a close would (ten idle spells) returns only after five.
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * idle):
		t.Errorf("a change within the grant waited for the ledger's lock behind an idle fold")
		release()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// holdLedgerLock takes the ledger's lock of the account in path from an
// open file of its own, as another process would, until release (or the
// test's end).
func holdLedgerLock(t *testing.T, path string) (release func()) {
	t.Helper()
	fd, err := unix.Open(path+"/ledger.lock", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLK, &unix.Flock_t{Type: unix.F_WRLCK}); err != nil {
		t.Fatal(err)
	}
	return func() { unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLK, &unix.Flock_t{Type: unix.F_UNLCK}) }
}

// TestKilledHolderGrantsReturn: a process killed while holding a grant
// leaves what it spent counted and its grant free for the others.
func TestKilledHolderGrantsReturn(t *testing.T) {
	path := t.TempDir()
	dir := openDir(t, path)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperHolder$")
	cmd.Env = append(os.Environ(), "QUOTA_HELPER_DIR="+path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ready\n" {
		t.Fatalf("helper said %q, %v", line, err)
	}
	st, _ := quota.Inspect(dir)
	if st.Holders != 1 || st.Granted.Bytes == 0 || st.Used.Bytes != 300 {
		t.Fatalf("helper's account: %+v", st)
	}
	sc := &scope{}
	a := open(t, dir, quota.Options{Limits: limits(1000, 0), Walk: sc.walk})
	if err := a.Reserve(context.Background(), 701, 0); err == nil {
		t.Errorf("admitted 701 bytes beside a live holder's grant")
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	if err := a.Reserve(context.Background(), 700, 0); err != nil {
		t.Errorf("the killed holder's grant did not come back: %v", err)
	}
	if err := a.Reserve(context.Background(), 1, 0); err == nil {
		t.Errorf("the killed holder's 300 bytes were forgotten")
	}
	st, _ = quota.Inspect(dir)
	if st.Dead != 0 || st.Used.Bytes != 1000 {
		t.Errorf("after the reap: %+v", st)
	}
	// Nothing of the killed holder is left: the ledger, its lock and the
	// live holder's two files.
	if names, _ := os.ReadDir(path); len(names) != 4 {
		var list []string
		for _, n := range names {
			list = append(list, n.Name())
		}
		t.Errorf("account directory after the reap: %v", list)
	}
}

// TestHelperHolder is the killed holder of TestKilledHolderGrantsReturn.
func TestHelperHolder(t *testing.T) {
	path := os.Getenv("QUOTA_HELPER_DIR")
	if path == "" {
		t.Skip("helper process only")
	}
	dir := openDir(t, path)
	sc := &scope{}
	a, err := quota.Open(dir, quota.Options{Limits: limits(1000, 0), Walk: sc.walk, Idle: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for range 30 {
		if err := a.Reserve(context.Background(), 10, 0); err != nil {
			t.Fatal(err)
		}
	}
	fmt.Println("ready")
	time.Sleep(time.Minute)
}

// reconcileIdle reconciles once the holders have gone idle.
func reconcileIdle(t *testing.T, a *quota.Account) quota.Report {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		rep, err := a.Reconcile(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if !rep.Busy || time.Now().After(deadline) {
			return rep
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestReconcile: drift is corrected to the walk once every holder is
// idle, never while one is changing the scope or the walks disagree.
func TestReconcile(t *testing.T) {
	dir := openDir(t, t.TempDir())
	sc := &scope{}
	opts := quota.Options{Limits: limits(1000, 10), Walk: sc.walk, Idle: 20 * time.Millisecond}
	a := open(t, dir, opts)
	if err := a.Reserve(context.Background(), 100, 1); err != nil {
		t.Fatal(err)
	}
	if rep, _ := a.Reconcile(context.Background(), nil); !rep.Busy {
		t.Errorf("reconcile right after a change: %+v", rep)
	}
	sc.bytes.Store(40) // the scope lost 60 bytes the account did not see
	sc.files.Store(1)
	rep := reconcileIdle(t, a)
	want := quota.Report{Account: policy.Usage{Bytes: 100, Files: 1}, Walk: policy.Usage{Bytes: 40, Files: 1}, Corrected: policy.Usage{Bytes: -60}}
	if rep != want {
		t.Errorf("Reconcile = %+v; want %+v", rep, want)
	}
	if u, _ := a.Usage(context.Background()); u != (policy.Usage{Bytes: 40, Files: 1}) {
		t.Errorf("usage after reconcile %+v", u)
	}

	// Another holder changing the scope holds the correction back.
	b := open(t, dir, quota.Options{Limits: limits(1000, 10), Walk: sc.walk, Idle: time.Hour})
	if err := b.Reserve(context.Background(), 10, 0); err != nil {
		t.Fatal(err)
	}
	sc.bytes.Store(0)
	if rep := reconcileIdle(t, a); !rep.Busy || rep.Corrected != (policy.Usage{}) {
		t.Errorf("with another holder active: %+v", rep)
	}

	// Walks that disagree are a change in flight, not drift.
	moving := &movingScope{}
	c := open(t, openDir(t, t.TempDir()), quota.Options{Limits: limits(1000, 10), Walk: moving.walk, Idle: time.Hour})
	if rep, err := c.Reconcile(context.Background(), nil); err != nil || !rep.Busy || rep.Corrected != (policy.Usage{}) {
		t.Errorf("with walks that disagree: %+v, %v", rep, err)
	}
}

// movingScope grows by a byte at every walk.
type movingScope struct{ n atomic.Int64 }

func (m *movingScope) walk(context.Context) (policy.Usage, error) {
	return policy.Usage{Bytes: m.n.Add(1)}, nil
}

// TestTornLedgerIsCounted: a ledger that can't be read back is counted
// again from a walk.
func TestTornLedgerIsCounted(t *testing.T) {
	path := t.TempDir()
	dir := openDir(t, path)
	sc := &scope{}
	sc.bytes.Store(500)
	sc.files.Store(2)
	if err := os.WriteFile(path+"/"+quota.LedgerFile+".1", []byte(`{"bytes":12`), 0o600); err != nil {
		t.Fatal(err)
	}
	a := open(t, dir, quota.Options{Limits: limits(1000, 0), Walk: sc.walk})
	if u, err := a.Usage(context.Background()); err != nil || u != (policy.Usage{Bytes: 500, Files: 2}) {
		t.Errorf("Usage = %+v, %v", u, err)
	}
	if err := a.Reserve(context.Background(), 501, 0); err == nil || err.Error() != "quota exceeded: workspace total 1000 B (used 500 B, write of "+strconv.Itoa(501)+" B refused)" {
		t.Errorf("refusal %v", err)
	}
}

// TestCheckWordsTheRefusal: an account given Options.Check (a capped
// subtree's) refuses with its words and the figures across all holders.
func TestCheckWordsTheRefusal(t *testing.T) {
	dir := openDir(t, t.TempDir())
	sc := &scope{}
	tmp := policy.Subtree{Prefix: "tmp", MaxBytes: 1000, MaxFiles: 10}
	opts := quota.Options{Limits: limits(tmp.MaxBytes, tmp.MaxFiles), Walk: sc.walk, Check: tmp.CheckCap}
	a, b := open(t, dir, opts), open(t, dir, opts)
	if err := a.Reserve(context.Background(), 600, 1); err != nil {
		t.Fatal(err)
	}
	a.Close() // folds its 600 bytes and gives back its grant
	err := b.Reserve(context.Background(), 500, 1)
	want := "quota exceeded: tmp/ total 1000 B (used 600 B, write of 500 B refused); free space there or write elsewhere"
	if policy.CodeOf(err) != policy.QuotaExceeded || err.Error() != want {
		t.Fatalf("Reserve over the cap = %v, want %q", err, want)
	}
}

// TestInspectWhileHoldersFold: a holder folding its spending into the
// ledger is never seen half way, its share counted twice or not at all.
// Holders come and go, each adding 100 bytes and a file or taking them
// away again, while Inspect reads: every read is 0 or 100.
func TestInspectWhileHoldersFold(t *testing.T) {
	dir := openDir(t, t.TempDir())
	sc := &scope{}
	opts := quota.Options{Limits: limits(1<<20, 0), Walk: sc.walk}
	stop := make(chan struct{})
	done := make(chan error)
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			a, err := quota.Open(dir, opts)
			if err != nil {
				done <- err
				return
			}
			if i%2 == 0 {
				err = a.Reserve(context.Background(), 100, 1)
			} else {
				a.Adjust(-100, -1)
			}
			if cerr := a.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				done <- err
				return
			}
		}
	}()
	reads, bad := 0, 0
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); reads++ {
		st, err := quota.Inspect(dir)
		if err != nil {
			t.Fatal(err)
		}
		if u := st.Used; u != (policy.Usage{}) && u != (policy.Usage{Bytes: 100, Files: 1}) {
			if bad++; bad <= 5 {
				t.Errorf("read %d: used %+v, want 0 or 100 bytes in 1 file (unlocked %v)", reads, u, st.Unlocked)
			}
		}
	}
	close(stop)
	for err := range done {
		t.Fatal(err)
	}
	t.Logf("%d reads, %d wrong", reads, bad)
}

// besideAGrant opens two holders B and A of a 1000-byte quota going idle
// after idle, has A spend 100 bytes, so that it holds a grant of what is
// left, and returns B.
func besideAGrant(t *testing.T, idle time.Duration) *quota.Account {
	t.Helper()
	dir := openDir(t, t.TempDir())
	sc := &scope{}
	opts := quota.Options{Limits: limits(1000, 0), Walk: sc.walk, Idle: idle}
	a := open(t, dir, opts)
	b := open(t, dir, opts)
	if err := a.Reserve(context.Background(), 100, 0); err != nil {
		t.Fatal(err)
	}
	if st, _ := quota.Inspect(dir); st.Granted.Bytes == 0 {
		t.Fatalf("A holds no grant: %+v", st)
	}
	return b
}

// TestWriteWaitsForAnIdleGrant: a change that fits in what is left once
// another holder's unspent grant comes back is not refused: it waits for
// that holder to go idle. One that does not fit even then is refused.
func TestWriteWaitsForAnIdleGrant(t *testing.T) {
	b := besideAGrant(t, 200*time.Millisecond)
	// 900 bytes are left, but not all of them free while A holds its grant.
	start := time.Now()
	if err := b.Reserve(context.Background(), 900, 0); err != nil {
		t.Errorf("900 bytes, with 100 of 1000 used: %v", err)
	}
	t.Logf("B waited %v for A's grant", time.Since(start).Round(time.Millisecond))
	if err := b.Reserve(context.Background(), 1, 0); policy.CodeOf(err) != policy.QuotaExceeded {
		t.Errorf("one byte over the quota: %v", err)
	}
}

// TestWaitForAGrantEndsWithTheRequest: a change waiting for another
// holder's grant stops waiting when its context ends (an interrupted
// write, a tool call out of budget) and answers the refusal it waited to
// lift, long before the holder goes idle.
func TestWaitForAGrantEndsWithTheRequest(t *testing.T) {
	b := besideAGrant(t, 5*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := b.Reserve(ctx, 900, 0)
	waited := time.Since(start)
	if policy.CodeOf(err) != policy.QuotaExceeded {
		t.Fatalf("900 bytes while A holds its grant, the request ending: %v, want quota_exceeded", err)
	}
	if waited > time.Second {
		t.Fatalf("waited %v after the request's end at 50 ms (A goes idle after 5 s)", waited)
	}
}

// TestLedgerLockWaitEndsWithTheRequest: a change that needs a grant while
// another open file holds the ledger's lock (on CephFS, a node that died
// holding it keeps it for about a minute) waits for it only as long as
// its context lasts and answers timeout, leaving the account usable: the
// next change, once the lock is free, is admitted.
func TestLedgerLockWaitEndsWithTheRequest(t *testing.T) {
	path := t.TempDir()
	a := open(t, openDir(t, path), quota.Options{Limits: limits(1000, 0), Walk: (&scope{}).walk})
	if _, err := a.Usage(context.Background()); err != nil { // makes the ledger
		t.Fatal(err)
	}
	release := holdLedgerLock(t, path)
	// Let the lock go after 3 s whatever happens, so that a wait that
	// can't end early fails the test instead of hanging it.
	freed := time.AfterFunc(3*time.Second, release)
	defer freed.Stop()

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := a.Reserve(ctx, 10, 0)
	waited := time.Since(start)
	if policy.CodeOf(err) != policy.Timeout {
		t.Errorf("a grant while the ledger's lock is held, the request ending at 100 ms: %v, want timeout", err)
	}
	if waited > time.Second {
		t.Errorf("waited %v for the ledger's lock; the request ended at 100 ms", waited)
	}
	// A request cancelled (a FUSE write the kernel interrupts for a
	// signal to its caller) is answered EINTR, which the caller's I/O
	// retries, not ETIMEDOUT, which fails its write.
	cctx, ccancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, ccancel)
	err = a.Reserve(cctx, 10, 0)
	if policy.CodeOf(err) != policy.Cancelled || policy.Errno(err) != syscall.EINTR {
		t.Errorf("a grant while the ledger's lock is held, the request cancelled at 100 ms: %v (errno %v), want cancelled (EINTR)", err, policy.Errno(err))
	}
	if !freed.Stop() {
		t.Fatal("the lock was let go before the check")
	}
	release()
	if err := a.Reserve(context.Background(), 10, 0); err != nil {
		t.Errorf("once the lock is free: %v", err)
	}
}
