package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/client"
)

// testNode labels every container this test binary starts, so the leftover
// check ignores containers of anyone else sharing the engine.
var testNode = fmt.Sprintf("sandbox-test-%d", os.Getpid())

// TestMain needs a real engine: without one the tests fail, they don't skip.
// It builds the minimal image when missing and, at the end, fails the run if
// any container it started is still there.
func TestMain(m *testing.M) {
	os.Exit(func() int {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if _, err := BuildImage(ctx, BuildOptions{Minimal: true, Progress: os.Stderr}); err != nil {
			fmt.Fprintln(os.Stderr, "sandbox tests need a running docker engine and the minimal image:", err)
			return 1
		}
		code := m.Run()
		// The check's own time starts after the tests, however long a
		// -count run of them took.
		ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if left, err := removeLabelled(ctx, LabelNode+"="+testNode); err != nil || left > 0 {
			fmt.Fprintf(os.Stderr, "sandbox tests left %d containers behind (now removed): %v\n", left, err)
			return 1
		}
		return code
	}())
}

// removeLabelled force-removes every container carrying label and returns
// how many there were.
func removeLabelled(ctx context.Context, label string) (int, error) {
	cli, err := client.NewClientWithOpts(client.WithHost(HostFromEnv()), client.WithAPIVersionNegotiation())
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	list, err := cli.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", label))})
	if err != nil {
		return 0, err
	}
	for _, c := range list {
		if err := cli.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true}); err != nil && !isNotFound(err) {
			return len(list), err
		}
	}
	return len(list), nil
}

// newTestRunner returns a runner on the minimal image, with cfg applied.
func newTestRunner(t *testing.T, cfg Config) *Runner {
	t.Helper()
	cfg.Host = HostFromEnv()
	if cfg.Image == "" {
		cfg.Image = MinimalImage
	}
	cfg.Node = testNode
	if cfg.Runtime == "" {
		// make test runs this suite under runc and again under runsc.
		cfg.Runtime = os.Getenv("AGENT_LOOM_SANDBOX_RUNTIME")
	}
	r, err := NewRunner(context.Background(), cfg)
	if err != nil {
		t.Fatalf("NewRunner: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// gvisor reports whether r runs containers under gVisor, whose own kernel
// (the Sentry) shows some things differently from Linux: the tests that
// read them adapt, and say why.
func gvisor(r *Runner) bool { return strings.HasPrefix(r.cfg.Runtime, "runsc") }

// newRequest returns a request for cmd over a fresh workspace the sandbox
// user can write, with a fake marker, and makes sure no container of it
// outlives the test.
func newRequest(t *testing.T, cmd string) (Request, *fakeMarker) {
	t.Helper()
	ws := t.TempDir()
	if err := os.Chmod(ws, 0o777); err != nil {
		t.Fatal(err)
	}
	var b [8]byte
	rand.Read(b[:])
	hash := hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if n, err := removeLabelled(ctx, LabelScopeHash+"="+hash); err != nil || n > 0 {
			t.Logf("removed %d leftover containers (err %v)", n, err)
		}
	})
	m := &fakeMarker{}
	return Request{
		Command: cmd, Workspace: ws, Scope: "space/agent/" + t.Name(), ScopeHash: hash,
		Run: "run-1", Call: "call-1", Marker: m,
	}, m
}

// fakeMarker records marker calls, optionally into a shared event log.
type fakeMarker struct {
	mu      sync.Mutex
	set     []Marker
	clears  int
	log     *eventLog
	setErr  error
	onSet   func(Marker)
	onClear func()
}

func (f *fakeMarker) Set(ctx context.Context, m Marker) error {
	if f.onSet != nil {
		f.onSet(m)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log.add("marker_set")
	if f.setErr != nil {
		return f.setErr
	}
	f.set = append(f.set, m)
	return nil
}

func (f *fakeMarker) Clear(ctx context.Context) error {
	if f.onClear != nil {
		f.onClear()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log.add("marker_clear")
	f.clears++
	return nil
}

func (f *fakeMarker) counts() (sets, clears int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.set), f.clears
}

// eventLog is an ordered record of marker calls and observed events.
type eventLog struct {
	mu     sync.Mutex
	ops    []string
	detail []map[string]any
}

func (l *eventLog) add(op string) { l.addDetail(op, nil) }

func (l *eventLog) addDetail(op string, d map[string]any) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ops = append(l.ops, op)
	l.detail = append(l.detail, d)
}

func (l *eventLog) observe(ctx context.Context, op string, d map[string]any) { l.addDetail(op, d) }

func (l *eventLog) list() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.ops...)
}
