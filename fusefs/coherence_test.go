package fusefs

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
)

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestCoherence: what one door writes the other sees at once.
func TestCoherence(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()

	// Tools → mount: a new file, then a replacement (a new inode).
	if _, err := e.ws.WriteFile(ctx, "c.txt", []byte("version one"), nil); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(e.path("c.txt")); err != nil || string(b) != "version one" {
		t.Fatalf("mount after tool create: %q %v", b, err)
	}
	for i, v := range []string{"version two, longer", "v3"} {
		if _, err := e.ws.WriteFile(ctx, "c.txt", []byte(v), nil); err != nil {
			t.Fatal(err)
		}
		// No invalidation: the open finds the path holds a new file.
		if b, err := os.ReadFile(e.path("c.txt")); err != nil || string(b) != v {
			t.Fatalf("replacement %d: mount reads %q %v, want %q", i, b, err, v)
		}
	}
	// With the hook, attributes are fresh at once too.
	if _, err := e.ws.WriteFile(ctx, "c.txt", []byte("exactly 21 bytes long"), nil); err != nil {
		t.Fatal(err)
	}
	e.m.Invalidate("c.txt")
	if fi, err := os.Stat(e.path("c.txt")); err != nil || fi.Size() != 21 {
		t.Fatalf("stat after Invalidate: %v %v", fi, err)
	}
	if err := e.ws.Remove(ctx, "c.txt", nil); err != nil {
		t.Fatal(err)
	}
	e.m.Invalidate("c.txt")
	if _, err := os.Stat(e.path("c.txt")); !os.IsNotExist(err) {
		t.Fatalf("stat after a tool delete and Invalidate: %v", err)
	}
	// A directory made by the tools, listed at once.
	if _, err := e.ws.Mkdir(ctx, "made/by/tools", true); err != nil {
		t.Fatal(err)
	}
	if _, err := e.ws.WriteFile(ctx, "made/by/tools/x", []byte("x"), nil); err != nil {
		t.Fatal(err)
	}
	if ents, err := os.ReadDir(e.path("made/by/tools")); err != nil || len(ents) != 1 {
		t.Fatalf("listing a tool-made directory: %v %v", ents, err)
	}

	// Mount → tools.
	if err := os.WriteFile(e.path("m.txt"), []byte("from the mount"), 0o644); err != nil {
		t.Fatal(err)
	}
	b, sum, err := e.ws.ReadFile(ctx, "m.txt")
	if err != nil || string(b) != "from the mount" || sum != sha(b) {
		t.Fatalf("tools after mount write: %q %v", b, err)
	}
	// The tool door's precondition sees the mount's write.
	if _, err := e.ws.WriteFile(ctx, "m.txt", []byte("stale"), ptr(sha([]byte("old")))); policy.CodeOf(err) != policy.Conflict {
		t.Fatalf("stale expected_sha256 after a mount write: %v", err)
	}

	// Usage is one counter for both doors.
	u, err := e.ws.Usage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(e.path("more"), make([]byte, 1000), 0o600); err != nil {
		t.Fatal(err)
	}
	u2, _ := e.ws.Usage(ctx)
	if u2.Bytes-u.Bytes != 1000 || u2.Files-u.Files != 1 {
		t.Errorf("usage moved by %d bytes, %d files after a 1000-byte create", u2.Bytes-u.Bytes, u2.Files-u.Files)
	}
}

func ptr(s string) *string { return &s }

// TestCASRace: a tool write with expected_sha256 racing a write through the
// mount never leaves a torn file: the result is one of the two whole
// contents, and if the tool's write succeeded after the mount's, it holds
// the tool's.
func TestCASRace(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	orig := bytes.Repeat([]byte("o"), 200<<10)
	fromTools := bytes.Repeat([]byte("t"), 300<<10)
	fromMount := bytes.Repeat([]byte("m"), 250<<10)
	outcomes := map[string]int{}
	for i := 0; i < 40; i++ {
		if _, err := e.ws.WriteFile(ctx, "cas", orig, nil); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var toolErr, mountErr error
		wg.Add(2)
		go func() {
			defer wg.Done()
			_, toolErr = e.ws.WriteFile(ctx, "cas", fromTools, ptr(sha(orig)))
		}()
		go func() {
			defer wg.Done()
			mountErr = os.WriteFile(e.path("cas"), fromMount, 0o600)
		}()
		wg.Wait()
		if mountErr != nil && !errors.Is(mountErr, syscall.ESTALE) {
			t.Fatalf("mount write: %v", mountErr)
		}
		if toolErr != nil && policy.CodeOf(toolErr) != policy.Conflict {
			t.Fatalf("tool write: %v", toolErr)
		}
		got, err := os.ReadFile(e.host("cas"))
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case bytes.Equal(got, fromTools):
			outcomes["tools"]++
			if toolErr != nil {
				t.Fatalf("round %d: the tool write failed (%v) yet its content is there", i, toolErr)
			}
		case bytes.Equal(got, fromMount):
			outcomes["mount"]++
		default:
			t.Fatalf("round %d: torn file: %d bytes, starting %q (tool err %v, mount err %v)", i, len(got), got[:min(len(got), 8)], toolErr, mountErr)
		}
	}
	t.Logf("outcomes: %v", outcomes)
}

// TestTwoMountsLock: two mounts of one scope, each over its own Workspace,
// exclude each other with flock and with fcntl locks, because locks are
// taken on the backing file (fcntl ones as open file description locks of
// each lock owner, which another mount sees as held by no process).
func TestTwoMountsLock(t *testing.T) {
	e := newEnv(t)
	mnt2 := secondMount(t, e) // its Workspace closes after the unmount: the mount reads its journals until then
	mustWrite(t, e.path("lock"), "")

	f1, err := os.OpenFile(e.path("lock"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f1.Close()
	f2, err := os.OpenFile(filepath.Join(mnt2, "lock"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f2.Close()

	t.Run("flock", func(t *testing.T) {
		if err := unix.Flock(int(f1.Fd()), unix.LOCK_EX); err != nil {
			t.Fatal(err)
		}
		wantErrno(t, unix.Flock(int(f2.Fd()), unix.LOCK_EX|unix.LOCK_NB), syscall.EWOULDBLOCK)
		// A process on the host locking the backing file is excluded too.
		host, err := os.Open(e.host("lock"))
		if err != nil {
			t.Fatal(err)
		}
		wantErrno(t, unix.Flock(int(host.Fd()), unix.LOCK_SH|unix.LOCK_NB), syscall.EWOULDBLOCK)
		host.Close()

		got := make(chan error, 1)
		go func() { got <- unix.Flock(int(f2.Fd()), unix.LOCK_EX) }()
		select {
		case err := <-got:
			t.Fatalf("second mount got the lock while the first held it: %v", err)
		case <-time.After(300 * time.Millisecond):
		}
		if err := unix.Flock(int(f1.Fd()), unix.LOCK_UN); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-got:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("second mount never got the lock after the first released it")
		}
		unix.Flock(int(f2.Fd()), unix.LOCK_UN)
	})

	t.Run("fcntl", func(t *testing.T) {
		wr := unix.Flock_t{Type: unix.F_WRLCK}
		if err := unix.FcntlFlock(f1.Fd(), unix.F_SETLK, &wr); err != nil {
			t.Fatal(err)
		}
		try := unix.Flock_t{Type: unix.F_WRLCK}
		wantErrno(t, unix.FcntlFlock(f2.Fd(), unix.F_SETLK, &try), syscall.EAGAIN)
		probe := unix.Flock_t{Type: unix.F_WRLCK}
		if err := unix.FcntlFlock(f2.Fd(), unix.F_GETLK, &probe); err != nil {
			t.Fatal(err)
		}
		if probe.Type != unix.F_WRLCK || probe.Pid != 0 {
			t.Errorf("F_GETLK through the second mount shows type %d pid %d, want the first's write lock and pid 0 (held in another mount)", probe.Type, probe.Pid)
		}
		// The same process still excludes itself across mounts: the two
		// mounts' lock owners are different files for the backing store.
		waited := make(chan error, 1)
		go func() {
			w := unix.Flock_t{Type: unix.F_WRLCK}
			waited <- unix.FcntlFlock(f2.Fd(), unix.F_SETLKW, &w)
		}()
		select {
		case err := <-waited:
			t.Fatalf("F_SETLKW through the second mount returned %v while the first held the lock", err)
		case <-time.After(200 * time.Millisecond):
		}
		un := unix.Flock_t{Type: unix.F_UNLCK}
		if err := unix.FcntlFlock(f1.Fd(), unix.F_SETLK, &un); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-waited:
			if err != nil {
				t.Fatalf("F_SETLKW after release: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("F_SETLKW through the second mount never got the lock after the first released it")
		}
		if err := unix.FcntlFlock(f2.Fd(), unix.F_SETLK, &try); err != nil {
			t.Fatalf("lock after release: %v", err)
		}
	})
}
