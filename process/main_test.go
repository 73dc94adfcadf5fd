package process

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/client"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/fusefs"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/sandbox"
	"github.com/agentloom/loomfs/store"
	"github.com/agentloom/loomfs/tools"
)

// testImage has python3, for the REPL tests.
const testImage = "loomfs-sandbox-dev:latest"

// testNode labels every container this test binary starts, so the leftover
// check ignores containers of anyone else sharing the engine.
var testNode = fmt.Sprintf("process-test-%d", os.Getpid())

// TestMain needs a real engine: without one the tests fail. At the end it
// fails the run if any container it started, or any mount, is left.
func TestMain(m *testing.M) {
	os.Exit(func() int {
		// The tests' temporary directories go in one of this binary's
		// own, so the mount check below sees no other package's mounts
		// (go test runs packages side by side).
		tmp, err := os.MkdirTemp("", "process-test-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		os.Setenv("TMPDIR", tmp)
		code := m.Run()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, node := range []string{testNode, testNode + "-b"} {
			if left, err := removeLabelled(ctx, sandbox.LabelNode+"="+node); err != nil || left > 0 {
				fmt.Fprintf(os.Stderr, "process tests left %d containers behind (now removed): %v\n", left, err)
				code = 1
			}
		}
		// Every session projection of this binary is mounted under its
		// temporary directories, at .../mnt/session-*.
		mi, _ := os.ReadFile("/proc/self/mountinfo")
		for _, l := range strings.Split(string(mi), "\n") {
			if f := strings.Fields(l); len(f) > 4 && strings.HasPrefix(f[4], os.TempDir()+"/Test") && strings.Contains(f[4], "/mnt/session-") {
				fmt.Fprintln(os.Stderr, "process tests left a mount:", f[4])
				code = 1
			}
		}
		if code == 0 {
			os.RemoveAll(tmp)
		}
		return code
	}())
}

func removeLabelled(ctx context.Context, label string) (int, error) {
	cli, err := client.NewClientWithOpts(client.WithHost(sandbox.HostFromEnv()), client.WithAPIVersionNegotiation())
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	list, err := cli.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", label))})
	if err != nil {
		return 0, err
	}
	for _, c := range list {
		cli.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true})
	}
	return len(list), nil
}

// env is a volume root and a service over it.
type env struct {
	t    testing.TB
	root string
	svc  *Service
	ws   *store.Workspace // the caller's own open of the scope
	tb   *tools.Toolbox
	pol  *policy.Policy
	log  *audit.Log

	tries []string // startOK's last tries (exhaust_test.go)
}

// newEnv opens scope sc on root (a fresh directory when ""), with a
// Service of node node and the policy text polText ("" for the open layout).
func newEnv(t testing.TB, root, node, scope, polText string) *env {
	return newEnvKeeping(t, root, node, scope, polText, time.Minute)
}

// newEnvKeeping is newEnv with ended processes kept for keep.
func newEnvKeeping(t testing.TB, root, node, scope, polText string, keep time.Duration) *env {
	t.Helper()
	return newEnvRunner(t, root, node, scope, polText, keep, nil)
}

// newEnvRunner is newEnvKeeping with the runner's configuration changed
// by runner, when not nil.
func newEnvRunner(t testing.TB, root, node, scope, polText string, keep time.Duration, runner func(*sandbox.Config)) *env {
	t.Helper()
	if root == "" {
		root = t.TempDir()
	}
	pol := policy.Default()
	if polText != "" {
		var err error
		if pol, err = policy.Parse("test.yaml", []byte(polText)); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	open := func(ctx context.Context, sc store.Scope) (*store.Workspace, audit.Sink, func(), error) {
		vol, err := store.OpenVolume(ctx, store.Config{Root: root})
		if err != nil {
			return nil, nil, nil, err
		}
		ws, err := vol.Open(ctx, sc, pol)
		if err != nil {
			vol.Close()
			return nil, nil, nil, err
		}
		log, err := audit.Open(vol.Path(), audit.Options{})
		if err != nil {
			ws.Close()
			vol.Close()
			return nil, nil, nil, err
		}
		return ws, log, func() { log.Close(); ws.Close(); vol.Close() }, nil
	}
	rcfg := sandbox.Config{Host: sandbox.HostFromEnv(), Image: testImage, Node: node, Runtime: os.Getenv("AGENT_LOOM_SANDBOX_RUNTIME")}
	if runner != nil {
		runner(&rcfg)
	}
	r, err := sandbox.NewRunner(ctx, rcfg)
	if err != nil {
		t.Fatalf("NewRunner: %v", err)
	}
	mountDir := filepath.Join(t.TempDir(), "mnt")
	svc := NewService(Config{
		Runner: r, MountDir: mountDir, Open: open, KeepEnded: keep,
		Mount: func(ctx context.Context, ws *store.Workspace, log audit.Sink, mp string, call sandbox.CallInfo) (sandbox.Projection, error) {
			return fusefs.Mount(ctx, ws, mp, fusefs.Options{AllowOther: true, CallID: call.CallID, Audit: log})
		},
	})
	sc, err := store.ParseScope(scope)
	if err != nil {
		t.Fatal(err)
	}
	ws, log, closeWS, err := open(ctx, sc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := svc.Close(); err != nil {
			t.Errorf("service close: %v", err)
		}
		closeWS()
		r.Close()
	})
	e := &env{t: t, root: root, svc: svc, ws: ws, pol: pol, log: log.(*audit.Log)}
	e.tb = &tools.Toolbox{WS: ws, Processes: svc, Audit: log}
	return e
}

// call runs a tool through the Toolbox and decodes its result into out.
func (e *env) call(name string, in map[string]any, out any) error {
	e.t.Helper()
	b, _ := json.Marshal(in)
	res, err := e.tb.Call(context.Background(), name, "", b)
	if err != nil {
		return err
	}
	if out != nil {
		if err := json.Unmarshal(res, out); err != nil {
			e.t.Fatalf("%s result %s: %v", name, res, err)
		}
	}
	return nil
}

func (e *env) must(name string, in map[string]any, out any) {
	e.t.Helper()
	if err := e.call(name, in, out); err != nil {
		e.t.Fatalf("%s %v: %v", name, in, err)
	}
}

// start starts command and returns its first answer.
func (e *env) start(in map[string]any) tools.ProcessOutput {
	e.t.Helper()
	var out tools.ProcessOutput
	e.must(tools.ProcessStart, in, &out)
	return out
}

// readUntil reads p's output from since until it contains want.
func (e *env) readUntil(id string, since int64, want string) tools.ProcessOutput {
	e.t.Helper()
	var all strings.Builder
	deadline := time.Now().Add(30 * time.Second)
	for {
		var out tools.ProcessOutput
		e.must(tools.ProcessRead, map[string]any{"process_id": id, "since": since, "yield_ms": 500}, &out)
		all.WriteString(out.Output)
		since = out.Cursor
		if strings.Contains(all.String(), want) {
			out.Output = all.String()
			return out
		}
		if out.Status == tools.StatusExited || time.Now().After(deadline) {
			e.t.Fatalf("output of %s never held %q; got %q (status %s)", id, want, all.String(), out.Status)
		}
	}
}

// startRaw starts a process from raw JSON input.
func (e *env) startRaw(in string) tools.ProcessOutput {
	e.t.Helper()
	res, err := e.tb.Call(context.Background(), tools.ProcessStart, "", []byte(in))
	if err != nil {
		e.t.Fatalf("start %s: %v", in, err)
	}
	var out tools.ProcessOutput
	if err := json.Unmarshal(res, &out); err != nil {
		e.t.Fatal(err)
	}
	return out
}
