package store_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// The test binary doubles as the other processes some tests need: a
// writer killed mid-write, concurrent counter incrementers, a lock holder.
// helperEnv names the role; the others say where to work.
const (
	helperEnv  = "LOOMFS_STORE_TEST_HELPER"
	helperRoot = "LOOMFS_STORE_TEST_ROOT"
	helperScp  = "LOOMFS_STORE_TEST_SCOPE"
	helperN    = "LOOMFS_STORE_TEST_N"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(helperEnv); role != "" {
		if err := runHelper(role); err != nil {
			fmt.Fprintf(os.Stderr, "helper %s: %v\n", role, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func runHelper(role string) error {
	ctx := context.Background()
	sc, err := store.ParseScope(os.Getenv(helperScp))
	if err != nil {
		return err
	}
	vol, err := store.OpenVolume(ctx, store.Config{Root: os.Getenv(helperRoot)})
	if err != nil {
		return err
	}
	ws, err := vol.Open(ctx, sc, nil)
	if err != nil {
		return err
	}
	n, _ := strconv.Atoi(os.Getenv(helperN))
	switch role {
	case "write-loop":
		// Rewrite the big file forever, alternating two contents, and say
		// so after each complete write; the parent kills us at random.
		contents := [2][]byte{bigContent(0), bigContent(1)}
		fmt.Println("ready")
		for i := 1; ; i++ {
			if _, err := ws.WriteFile(ctx, "big", contents[i%2], nil); err != nil {
				return err
			}
			fmt.Println("wrote")
		}
	case "counter":
		// Lock → read → increment → write(expected) → unlock, n times.
		for range n {
			if err := incrementCounter(ctx, ws); err != nil {
				return err
			}
		}
		return nil
	case "walk-few-fds":
		// Walk the scope with only n descriptors left above those open
		// now: a deep enough tree runs out of them (EMFILE) on the way.
		walkFewFDs(ctx, ws, n)
		return nil
	case "hold-lock":
		lctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		unlock, err := ws.Lock(lctx)
		if err != nil {
			return err
		}
		fmt.Println("locked")
		io.Copy(io.Discard, os.Stdin) // until the parent closes our stdin
		unlock()
		fmt.Println("released")
		return nil
	}
	return fmt.Errorf("unknown helper role %q", role)
}

// incrementCounter is the read-modify-write cycle a tool runs under the
// scope lock.
func incrementCounter(ctx context.Context, ws *store.Workspace) error {
	lctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	unlock, err := ws.Lock(lctx)
	if err != nil {
		return err
	}
	defer unlock()
	b, sum, err := ws.ReadFile(ctx, "counter")
	if err != nil {
		return err
	}
	v, err := strconv.Atoi(string(b))
	if err != nil {
		return fmt.Errorf("counter holds %q: %w", b, err)
	}
	_, err = ws.WriteFile(ctx, "counter", []byte(strconv.Itoa(v+1)), &sum)
	return err
}

// helper starts the test binary in role against scope sc on root.
func helper(t *testing.T, role, root string, sc store.Scope, extraEnv ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+role, helperRoot+"="+root, helperScp+"="+sc.String())
	cmd.Env = append(cmd.Env, extraEnv...)
	return cmd
}

// bigContent is one of the two 1.5 MiB contents of the atomic-write test:
// different bytes all the way through, so any mix of the two is caught.
func bigContent(which int) []byte {
	r := rand.New(rand.NewPCG(uint64(which)+1, 42))
	b := make([]byte, 3<<19) // 1.5 MiB, under the 2 MiB text limit
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// testEnv is one volume on a fresh root, opened the way the tools open it.
type testEnv struct {
	root string
	vol  *store.Volume
}

func newEnv(t *testing.T) *testEnv {
	t.Helper()
	root := filepath.Join(t.TempDir(), "root")
	vol, err := store.OpenVolume(context.Background(), store.Config{Root: root})
	if err != nil {
		t.Fatalf("OpenVolume: %v", err)
	}
	t.Cleanup(func() { vol.Close() })
	return &testEnv{root: root, vol: vol}
}

// open opens scope sc (with pol, or the default policy when nil).
func (e *testEnv) open(t *testing.T, sc store.Scope, pol *policy.Policy) *store.Workspace {
	t.Helper()
	ws, err := e.vol.Open(context.Background(), sc, pol)
	if err != nil {
		t.Fatalf("Open(%s): %v", sc, err)
	}
	t.Cleanup(func() { ws.Close() })
	return ws
}

// openAnew opens scope sc through a volume of its own, as another process
// would: nothing is shared with e's handles but the files.
func (e *testEnv) openAnew(t *testing.T, sc store.Scope) *store.Workspace {
	t.Helper()
	return e.openAnewWith(t, sc, nil)
}

// openAnewWith is openAnew under the policy pol (nil: the default).
func (e *testEnv) openAnewWith(t *testing.T, sc store.Scope, pol *policy.Policy) *store.Workspace {
	t.Helper()
	vol, err := store.OpenVolume(context.Background(), store.Config{Root: e.root})
	if err != nil {
		t.Fatalf("OpenVolume: %v", err)
	}
	t.Cleanup(func() { vol.Close() })
	ws, err := vol.Open(context.Background(), sc, pol)
	if err != nil {
		t.Fatalf("Open(%s): %v", sc, err)
	}
	t.Cleanup(func() { ws.Close() })
	return ws
}

// dir is where scope sc lives on disk.
func (e *testEnv) dir(sc store.Scope) string { return filepath.Join(e.root, sc.Dir()) }

var (
	mainScope  = store.Scope{Space: "sp", Agent: "ag", Session: "se"}
	childScope = store.Scope{Space: "sp", Agent: "ag", Session: "se", Run: "run-1", Instance: "sub-1"}
)

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func ptr(s string) *string { return &s }

// Planting helpers: objects that someone other than loomfs put into the
// backing store.

func mkfile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func mkdir(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(path, 0o700); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, path string) {
	t.Helper()
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
}

func hardlink(t *testing.T, target, path string) {
	t.Helper()
	if err := os.Link(target, path); err != nil {
		t.Fatal(err)
	}
}

func mkfifo(t *testing.T, path string) {
	t.Helper()
	if err := unix.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
}

// mksocket binds a listening Unix socket at path; it stays bound until
// the test ends.
func mksocket(t *testing.T, path string) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatalf("listen on %s: %v", path, err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	t.Cleanup(func() { l.Close() })
}

// mkdev makes the character device 1:3 (what /dev/null is).
func mkdev(t *testing.T, path string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("creating a device node needs root")
	}
	if err := unix.Mknod(path, unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
}

// within runs f and fails the test if it takes longer than d: a FIFO or a
// device must never block an operation.
func within(t *testing.T, d time.Duration, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s blocked for more than %v", what, d)
	}
}

// fileHash hashes a file on disk, or says why it can't.
func fileHash(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return sha(b)
}

// diskNames lists a directory on disk, loomfs's own names included.
func diskNames(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// treeOf lists every path under dir on disk (for "nothing was created").
func treeOf(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			fmt.Fprintf(&b, "%s: %v\n", p, err)
			return nil
		}
		fmt.Fprintf(&b, "%s %v %d\n", p, info.Mode(), info.Size())
		return nil
	})
	return b.String()
}

// readLines forwards the lines a helper prints.
func readLines(r io.Reader) <-chan string {
	ch := make(chan string, 1024)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			ch <- sc.Text()
		}
	}()
	return ch
}

// expectLine waits for the helper to print want.
func expectLine(t *testing.T, lines <-chan string, want string, d time.Duration) {
	t.Helper()
	deadline := time.After(d)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("helper exited before printing %q", want)
			}
			if l == want {
				return
			}
		case <-deadline:
			t.Fatalf("helper did not print %q within %v", want, d)
		}
	}
}

// forEachResolver runs f once with openat2 and once with the O_NOFOLLOW
// component walk that kernels without openat2 get.
func forEachResolver(t *testing.T, f func(t *testing.T)) {
	t.Run("openat2", f)
	t.Run("nofollow-walk", func(t *testing.T) {
		store.UseNoFollowWalk(t)
		f(t)
	})
}

// codeIs checks that err is a refusal with code want.
func codeIs(t *testing.T, what string, err error, want policy.Code) {
	t.Helper()
	if err == nil {
		t.Errorf("%s succeeded; want %s", what, want)
		return
	}
	if got := policy.CodeOf(err); got != want {
		t.Errorf("%s = %v (code %q); want %s", what, err, got, want)
	}
}
