package store_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/callrec"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// TestAtomicWriteSurvivesSIGKILL: a child process rewrites a 1.5 MiB file
// over and over, alternating two contents, and is killed with SIGKILL at
// random moments. After every kill the file holds one whole content, and
// no temporary file is visible (SPEC §4 workspace_write, §9).
func TestAtomicWriteSurvivesSIGKILL(t *testing.T) {
	kills := 25
	if testing.Short() {
		kills = 5
	}
	e := newEnv(t)
	ws := e.open(t, childScope, nil)
	ctx := context.Background()
	want := map[string]string{sha(bigContent(0)): "content 0", sha(bigContent(1)): "content 1"}
	if _, err := ws.WriteFile(ctx, "big", bigContent(0), nil); err != nil {
		t.Fatal(err)
	}
	s := e.dir(childScope)
	seen := map[string]int{}
	totalWrites := 0
	for round := range kills {
		cmd := helper(t, "write-loop", e.root, childScope)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines := readLines(out)
		expectLine(t, lines, "ready", 30*time.Second)
		// Kill at a random moment: before the first write completes, in
		// the middle of one, or after several.
		time.Sleep(time.Duration(rand.IntN(60_000)) * time.Microsecond)
		cmd.Process.Signal(syscall.SIGKILL)
		err = cmd.Wait()
		for l := range lines {
			if l == "wrote" {
				totalWrites++
			}
		}
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("round %d: the writer was not killed by SIGKILL but ended with %v: %s", round, err, stderr.String())
		}

		b, sum, err := ws.ReadFile(ctx, "big")
		if err != nil {
			t.Fatalf("round %d: ReadFile after the kill: %v", round, err)
		}
		if _, ok := want[sum]; !ok {
			t.Fatalf("round %d: the file is torn: %d bytes, sha256 %s is neither content", round, len(b), sum)
		}
		seen[want[sum]]++

		ents, err := ws.ReadDir(ctx, ".")
		if err != nil {
			t.Fatal(err)
		}
		if len(ents) != 1 || ents[0].Name != "big" {
			t.Fatalf("round %d: ReadDir shows %v; want only big", round, names(ents))
		}
		for _, n := range diskNames(t, s) {
			if n != "big" && !strings.HasPrefix(n, policy.InternalPrefix) {
				t.Fatalf("round %d: a leftover %q on disk is not under the reserved prefix", round, n)
			}
		}
	}
	leftovers := len(diskNames(t, s)) - 1
	t.Logf("%d kills, %d complete writes by the children, final contents seen %v, %d reserved leftovers on disk", kills, totalWrites, seen, leftovers)
	if totalWrites == 0 {
		t.Errorf("no child completed a write; the kills never hit a running writer")
	}
	// The scope stays writable and exact after all that.
	if _, err := ws.WriteFile(ctx, "big", []byte("after"), nil); err != nil {
		t.Fatal(err)
	}
	if b, _, err := ws.ReadFile(ctx, "big"); err != nil || string(b) != "after" {
		t.Fatalf("ReadFile after the kills = %q, %v", b, err)
	}
}

func names(infos []store.Info) []string {
	var out []string
	for _, i := range infos {
		out = append(out, i.Name)
	}
	return out
}

func TestWriteFileCAS(t *testing.T) {
	e := newEnv(t)
	ws := e.open(t, mainScope, nil)
	ctx := context.Background()
	v1, v2 := []byte("version 1\n"), []byte("version 2\n")

	// "" means the file must not exist.
	res, err := ws.WriteFile(ctx, "notes.md", v1, ptr(""))
	if err != nil || !res.Created || res.SHA256 != sha(v1) || res.Bytes != int64(len(v1)) {
		t.Fatalf("create with expected \"\": %+v, %v", res, err)
	}
	conflictWith := func(what string, err error, current string) {
		t.Helper()
		var pe *policy.Error
		if !errors.As(err, &pe) || pe.Code != policy.Conflict {
			t.Fatalf("%s = %v; want conflict", what, err)
		}
		if pe.SHA256 != current {
			t.Errorf("%s: conflict carries sha256 %q; want the current %q", what, pe.SHA256, current)
		}
		if current != "" && !strings.Contains(pe.Message, current) {
			t.Errorf("%s: message %q does not name the current sha256", what, pe.Message)
		}
		if !strings.Contains(pe.Message, "re-read") {
			t.Errorf("%s: message %q does not tell the model to re-read", what, pe.Message)
		}
	}
	_, err = ws.WriteFile(ctx, "notes.md", v2, ptr(""))
	conflictWith(`write with expected "" over an existing file`, err, sha(v1))

	res, err = ws.WriteFile(ctx, "notes.md", v2, ptr(sha(v1)))
	if err != nil || res.Created || res.SHA256 != sha(v2) {
		t.Fatalf("write with the current sha256: %+v, %v", res, err)
	}
	_, err = ws.WriteFile(ctx, "notes.md", []byte("lost update"), ptr(sha(v1)))
	conflictWith("write with a stale sha256", err, sha(v2))
	if b, _, _ := ws.ReadFile(ctx, "notes.md"); string(b) != string(v2) {
		t.Fatalf("a refused write changed the file to %q", b)
	}

	_, err = ws.WriteFile(ctx, "missing.md", v1, ptr(sha(v1)))
	conflictWith("write with a sha256 to a missing file", err, "")
	if _, err := ws.Lstat("missing.md"); policy.CodeOf(err) != policy.NotFound {
		t.Fatalf("a refused write created the file: %v", err)
	}

	err = ws.Remove(ctx, "notes.md", ptr(sha(v1)))
	conflictWith("remove with a stale sha256", err, sha(v2))
	err = ws.Remove(ctx, "notes.md", ptr(""))
	conflictWith(`remove with expected ""`, err, sha(v2))
	if err := ws.Remove(ctx, "notes.md", ptr(sha(v2))); err != nil {
		t.Fatalf("remove with the current sha256: %v", err)
	}
	err = ws.Remove(ctx, "notes.md", ptr(sha(v2)))
	if policy.CodeOf(err) != policy.NotFound {
		t.Fatalf("remove of a removed file = %v; want not_found", err)
	}
}

// TestConcurrentCASProcesses: 50 processes each increment one counter 10
// times (lock, read, increment, write with expected_sha256, unlock); no
// update is lost.
func TestConcurrentCASProcesses(t *testing.T) {
	procs, perProc := 50, 10
	if testing.Short() {
		procs, perProc = 8, 5
	}
	e := newEnv(t)
	ws := e.open(t, mainScope, nil)
	ctx := context.Background()
	if _, err := ws.WriteFile(ctx, "counter", []byte("0"), ptr("")); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, procs)
	for i := range procs {
		cmd := helper(t, "counter", e.root, mainScope, helperN+"="+strconv.Itoa(perProc))
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := cmd.Wait(); err != nil {
				errs <- fmt.Errorf("process %d: %v: %s", i, err, out.String())
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	b, _, err := ws.ReadFile(ctx, "counter")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(b), strconv.Itoa(procs*perProc); got != want {
		t.Fatalf("counter = %s after %d×%d increments; updates were lost", got, procs, perProc)
	}
}

// TestPermissions: new files are 0600 and directories 0700 whatever the
// process umask (SPEC §2.1).
func TestPermissions(t *testing.T) {
	for _, umask := range []int{0, 0o022, 0o077} {
		t.Run(fmt.Sprintf("umask %04o", umask), func(t *testing.T) {
			old := syscall.Umask(umask)
			t.Cleanup(func() { syscall.Umask(old) })

			e := newEnv(t)
			ws := e.open(t, childScope, nil)
			ctx := context.Background()
			s := e.dir(childScope)
			if _, err := ws.WriteFile(ctx, "new.txt", []byte("x"), nil); err != nil {
				t.Fatal(err)
			}
			if _, err := ws.Mkdir(ctx, "a/b/c", true); err != nil {
				t.Fatal(err)
			}
			if _, err := ws.Mkdir(ctx, "single", false); err != nil {
				t.Fatal(err)
			}
			if _, err := ws.WriteFile(ctx, "a/b/c/deep.txt", []byte("x"), nil); err != nil {
				t.Fatal(err)
			}
			// A file someone made 0644 is 0600 once loomfs replaced it.
			mkfile(t, filepath.Join(s, "wide.txt"), "x")
			if err := os.Chmod(filepath.Join(s, "wide.txt"), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := ws.WriteFile(ctx, "wide.txt", []byte("y"), nil); err != nil {
				t.Fatal(err)
			}
			unlock, err := ws.Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := ws.SetMarker(store.Marker{Container: "c1"}); err != nil {
				t.Fatal(err)
			}
			if err := ws.ClearMarker(); err != nil {
				t.Fatal(err)
			}
			unlock()
			if rec, err := ws.BeginCall(context.Background(), "call-1", "workspace_write", []byte("{}")); err != nil || rec != nil {
				t.Fatalf("BeginCall: %v, %v", rec, err)
			}

			state := filepath.Join(e.root, store.LocksDir, childScope.Hash())
			want := map[string]os.FileMode{
				e.root:                                 0o700 | os.ModeDir,
				s:                                      0o700 | os.ModeDir,
				filepath.Dir(s):                        0o700 | os.ModeDir, // children/
				filepath.Join(e.root, store.SpacesDir): 0o700 | os.ModeDir,
				filepath.Join(s, "new.txt"):            0o600,
				filepath.Join(s, "a"):                  0o700 | os.ModeDir,
				filepath.Join(s, "a/b"):                0o700 | os.ModeDir,
				filepath.Join(s, "a/b/c"):              0o700 | os.ModeDir,
				filepath.Join(s, "a/b/c/deep.txt"):     0o600,
				filepath.Join(s, "single"):             0o700 | os.ModeDir,
				filepath.Join(s, "wide.txt"):           0o600,
				state:                                  0o700 | os.ModeDir,
				filepath.Join(state, store.LockFile):   0o600,
				filepath.Join(state, callrec.Dir):      0o700 | os.ModeDir,
				filepath.Join(e.root, store.LocksDir):  0o700 | os.ModeDir,
			}
			for p, mode := range want {
				fi, err := os.Lstat(p)
				if err != nil {
					t.Errorf("%s: %v", p, err)
					continue
				}
				if fi.Mode() != mode {
					t.Errorf("%s has mode %v, want %v", p, fi.Mode(), mode)
				}
			}
			calls := diskNames(t, filepath.Join(state, callrec.Dir))
			for _, n := range calls {
				if fi, err := os.Lstat(filepath.Join(state, callrec.Dir, n)); err != nil || fi.Mode() != 0o600 {
					t.Errorf("call record %s: mode %v, %v; want 0600", n, fi.Mode(), err)
				}
			}
		})
	}
}

// TestWriteFileRefusals covers what the write path refuses besides
// planted objects: the text limit, directories, modes, quarantine.
func TestWriteFileRefusals(t *testing.T) {
	e := newEnv(t)
	pol := policy.Default()
	pol.Limits.TextBytes = 1024
	if err := pol.SetRules([]policy.Rule{{Prefix: "data", Mode: policy.ModeRO}, {Prefix: "output", Mode: policy.ModeWO}, {Prefix: ".meta", Mode: policy.ModeHidden}}); err != nil {
		t.Fatal(err)
	}
	ws := e.open(t, mainScope, pol)
	ctx := context.Background()
	s := e.dir(mainScope)
	mkfile(t, filepath.Join(s, "data", "in.csv"), "a,b\n")
	mkfile(t, filepath.Join(s, ".meta", "x"), "hidden")
	mkdir(t, filepath.Join(s, "dir"))
	mkfile(t, filepath.Join(s, "big.bin"), strings.Repeat("x", 2048))

	tests := []struct {
		name string
		run  func() error
		want policy.Code
	}{
		{"over the text limit", func() error { _, err := ws.WriteFile(ctx, "t.txt", make([]byte, 1025), nil); return err }, policy.TooLarge},
		{"read over the text limit", func() error { _, _, err := ws.ReadFile(ctx, "big.bin"); return err }, policy.TooLarge},
		{"write onto a directory", func() error { _, err := ws.WriteFile(ctx, "dir", []byte("x"), nil); return err }, policy.IsDir},
		{"write onto the workspace root", func() error { _, err := ws.WriteFile(ctx, ".", []byte("x"), nil); return err }, policy.IsDir},
		{"read a directory", func() error { _, _, err := ws.ReadFile(ctx, "dir"); return err }, policy.IsDir},
		{"write under a missing directory", func() error { _, err := ws.WriteFile(ctx, "nodir/x", []byte("x"), nil); return err }, policy.NotFound},
		{"write under a file", func() error { _, err := ws.WriteFile(ctx, "big.bin/x", []byte("x"), nil); return err }, policy.NotDir},
		{"write in a ro subtree", func() error { _, err := ws.WriteFile(ctx, "data/in.csv", []byte("x"), nil); return err }, policy.ReadOnly},
		{"create in a ro subtree", func() error { _, err := ws.WriteFile(ctx, "data/new.csv", []byte("x"), nil); return err }, policy.ReadOnly},
		{"remove in a ro subtree", func() error { return ws.Remove(ctx, "data/in.csv", nil) }, policy.ReadOnly},
		{"mkdir in a ro subtree", func() error { _, err := ws.Mkdir(ctx, "data/sub", false); return err }, policy.ReadOnly},
		{"write in a hidden subtree", func() error { _, err := ws.WriteFile(ctx, ".meta/y", []byte("x"), nil); return err }, policy.NotFound},
		{"remove a directory in a ro subtree", func() error { return ws.Remove(ctx, "data", nil) }, policy.ReadOnly},
		{"remove the workspace root", func() error { return ws.Remove(ctx, ".", nil) }, policy.PermissionDenied},
		{"create subagents at the top of a main scope", func() error { _, err := ws.Mkdir(ctx, "subagents", false); return err }, policy.InvalidPath},
		{"cancelled write", func() error {
			c, cancel := context.WithCancel(ctx)
			cancel()
			_, err := ws.WriteFile(c, "cancelled.txt", []byte("x"), nil)
			return err
		}, policy.Cancelled},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			codeIs(t, tc.name, tc.run(), tc.want)
		})
	}
	// Modes on reads are the door's question (Policy.Path before the store
	// call); the store enforces them on every change. A wo subtree takes
	// writes.
	mkdir(t, filepath.Join(s, "output"))
	if _, err := ws.WriteFile(ctx, "output/report.md", []byte("x"), nil); err != nil {
		t.Errorf("write in a wo subtree: %v", err)
	}
	if _, err := ws.Lstat("cancelled.txt"); policy.CodeOf(err) != policy.NotFound {
		t.Errorf("a cancelled write created its file: %v", err)
	}
	if got := diskNames(t, filepath.Join(s, ".meta")); len(got) != 1 {
		t.Errorf("a refused write reached the hidden subtree: %v", got)
	}
	ents, err := ws.ReadDir(ctx, ".")
	if err != nil {
		t.Fatal(err)
	}
	for _, en := range ents {
		if en.Name == ".meta" {
			t.Errorf("ReadDir lists the hidden subtree")
		}
	}

	mkdir(t, filepath.Join(s, "full"))
	mkfile(t, filepath.Join(s, "full", "x"), "x")
	codeIs(t, "remove a non-empty directory", ws.Remove(ctx, "full", nil), policy.NotEmpty)
	if err := ws.Remove(ctx, "full/x", nil); err != nil {
		t.Fatal(err)
	}
	if err := ws.Remove(ctx, "full", nil); err != nil {
		t.Fatalf("remove an empty directory: %v", err)
	}
}

// TestMkdir covers workspace_mkdir's store half.
func TestMkdir(t *testing.T) {
	e := newEnv(t)
	ws := e.open(t, childScope, nil)
	ctx := context.Background()
	s := e.dir(childScope)
	if created, err := ws.Mkdir(ctx, "a", false); err != nil || !created {
		t.Fatalf("Mkdir(a) = %v, %v", created, err)
	}
	codeIs(t, "Mkdir existing", func() error { _, err := ws.Mkdir(ctx, "a", false); return err }(), policy.Exists)
	if created, err := ws.Mkdir(ctx, "a", true); err != nil || created {
		t.Fatalf("Mkdir(a, parents) again = %v, %v; want not created, no error", created, err)
	}
	codeIs(t, "Mkdir without parents", func() error { _, err := ws.Mkdir(ctx, "x/y", false); return err }(), policy.NotFound)
	if created, err := ws.Mkdir(ctx, "x/y/z", true); err != nil || !created {
		t.Fatalf("Mkdir(x/y/z, parents) = %v, %v", created, err)
	}
	symlink(t, filepath.Join(e.root, "elsewhere"), filepath.Join(s, "ln"))
	codeIs(t, "Mkdir onto a symlink", func() error { _, err := ws.Mkdir(ctx, "ln", true); return err }(), policy.SymlinkRefused)
	codeIs(t, "Mkdir under a symlink", func() error { _, err := ws.Mkdir(ctx, "ln/sub", true); return err }(), policy.SymlinkRefused)
	if _, err := os.Lstat(filepath.Join(e.root, "elsewhere")); err == nil {
		t.Errorf("Mkdir created the symlink's target")
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(s, "x/y/z"), &st); err != nil || st.Mode&0o7777 != 0o700 {
		t.Errorf("x/y/z mode %#o, %v", st.Mode&0o7777, err)
	}
}

// TestSyncDir: a directory held as an O_PATH fd, as the store holds
// them, is fsynced (fsync(2) on the fd itself answers EBADF), so an
// atomic write's rename is made durable.
func TestSyncDir(t *testing.T) {
	dir := t.TempDir()
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Fsync(fd); err != unix.EBADF {
		t.Fatalf("fsync of an O_PATH fd: %v; the case this covers is gone", err)
	}
	if err := store.SyncDir(fd); err != nil {
		t.Fatalf("syncDir of an O_PATH fd: %v", err)
	}
}

// TestModeUnderNarrowUmask: a umask that takes the owner's bits doesn't
// take them from what the tool door writes: new files are 0600, and a
// replaced executable stays 0700 (the temp file's mode is set again).
func TestModeUnderNarrowUmask(t *testing.T) {
	old := syscall.Umask(0o377)
	t.Cleanup(func() { syscall.Umask(old) })
	e := newEnv(t)
	ws := e.open(t, childScope, nil)
	ctx := context.Background()
	s := e.dir(childScope)
	mkfile(t, filepath.Join(s, "run.sh"), "#!/bin/sh\n")
	if err := os.Chmod(filepath.Join(s, "run.sh"), 0o700); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]os.FileMode{"new.txt": 0o600, "run.sh": 0o700} {
		if _, err := ws.WriteFile(ctx, name, []byte("x"), nil); err != nil {
			t.Fatal(err)
		}
		if st, err := os.Stat(filepath.Join(s, name)); err != nil || st.Mode().Perm() != want {
			t.Errorf("%s: mode %v %v, want %v", name, st.Mode().Perm(), err, want)
		}
	}
}
