package loom_test

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentloom/loomfs/loom"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/sandbox"
	"github.com/agentloom/loomfs/slots"
	"github.com/agentloom/loomfs/store"
	"github.com/agentloom/loomfs/tools"
)

// An embedder's sessions share the Node's own process service: a process
// started through one session is read through another, and closing the
// Node removes its session sandbox.
func TestNodeProcesses(t *testing.T) {
	cfg := sandbox.ConfigFromEnv()
	cfg.Image, cfg.Node = "loomfs-sandbox-dev:latest", "loom-test"
	node := loom.New(loom.Config{Store: store.Config{Root: t.TempDir()}, Sandbox: cfg, MountDir: filepath.Join(t.TempDir(), "mnt")})
	ctx := context.Background()
	open := func() *loom.Session {
		s, err := node.Open(ctx, "acme/coder/embed")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		return s
	}
	a, b := open(), open()
	res, err := a.Tools.Call(ctx, tools.ProcessStart, "", json.RawMessage(`{"command":"read x; echo got:$x","yield_ms":100}`))
	if err != nil {
		t.Fatal(err)
	}
	var out tools.ProcessOutput
	json.Unmarshal(res, &out)
	in, _ := json.Marshal(map[string]any{"process_id": out.ProcessID, "input": "embedded\n", "yield_ms": 5000})
	res, err = b.Tools.Call(ctx, tools.ProcessWrite, "", in)
	if err != nil || !strings.Contains(string(res), "got:embedded") {
		t.Fatalf("write through the second session: %s %v", res, err)
	}
	svc, _ := node.Processes(ctx)
	if n := len(svc.Sandboxes()); n != 1 {
		t.Fatalf("%d session sandboxes, want 1", n)
	}
	if err := node.Close(); err != nil {
		t.Fatal(err)
	}
	r, _ := sandbox.NewRunner(ctx, cfg)
	defer r.Close()
	if ok, err := r.ContainerExists(ctx, out.Container); err != nil || ok {
		t.Fatalf("container %s after Node.Close: exists %v, %v", out.Container, ok, err)
	}
}

// Under "commands: session" an embedder's workspace_command runs in the
// Node's own session sandbox, the one its processes use, with the
// commands' policy events still told; under the default it runs in a
// container of its own.
func TestNodeSessionCommands(t *testing.T) {
	cfg := sandbox.ConfigFromEnv()
	cfg.Image, cfg.Node = "loomfs-sandbox-dev:latest", "loom-test"
	for _, tc := range []struct {
		policy  string
		session bool
	}{{"commands: fresh\n", false}, {"commands: session\n", true}} {
		pol, err := policy.Parse("p.yaml", []byte(tc.policy))
		if err != nil {
			t.Fatal(err)
		}
		node := loom.New(loom.Config{Store: store.Config{Root: t.TempDir()}, Policy: pol, Sandbox: cfg, MountDir: filepath.Join(t.TempDir(), "mnt")})
		ctx := context.Background()
		s, err := node.Open(ctx, "acme/coder/embed-cmds")
		if err != nil {
			t.Fatal(err)
		}
		res, err := s.Tools.Call(ctx, tools.Command, "", json.RawMessage(`{"command":"echo hi; touch .agentloom-x"}`))
		if err != nil {
			t.Fatal(err)
		}
		var out tools.CommandResult
		json.Unmarshal(res, &out)
		if out.Stdout != "hi\n" || out.ExitCode != 1 || out.PolicyEvents.Total != 1 || out.PolicyEvents.Events[0].Errno != "EPERM" {
			t.Fatalf("%s: %s", tc.policy, res)
		}
		svc, _ := node.Processes(ctx)
		boxes := svc.Sandboxes()
		if got := len(boxes) == 1 && boxes[0].Container == out.Container; got != tc.session {
			t.Fatalf("%s: command ran in %s, session sandboxes %+v", tc.policy, out.Container, boxes)
		}
		s.Close()
		if err := node.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// With every container start slot of the node held, a command waits its
// time and is refused sandbox_unavailable, which tells a model to retry
// later; the operator's error says the engine was busy. Once a slot is
// free the same command runs.
func TestCommandWhileEngineBusy(t *testing.T) {
	dir := t.TempDir()
	cfg := sandbox.ConfigFromEnv()
	cfg.Image, cfg.Node, cfg.Starts, cfg.StartDir = "loomfs-sandbox-dev:latest", "loom-test", 1, dir
	node := loom.New(loom.Config{Store: store.Config{Root: t.TempDir()}, Sandbox: cfg, MountDir: filepath.Join(t.TempDir(), "mnt")})
	t.Cleanup(func() { node.Close() })
	ctx := context.Background()
	s, err := node.Open(ctx, "acme/coder/busy")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	release, err := slots.New(dir, 1).Take(ctx)
	if err != nil {
		t.Fatal(err)
	}
	in := json.RawMessage(`{"command":"echo ran","timeout_s":1}`)
	_, err = s.Tools.Call(ctx, tools.Command, "", in)
	if policy.CodeOf(err) != policy.SandboxUnavailable || !errors.Is(err, sandbox.ErrEngineBusy) || !strings.Contains(err.Error(), "retry later") {
		t.Fatalf("command with the node's start slot held: %v, want sandbox_unavailable telling the model to retry later, from ErrEngineBusy", err)
	}
	release()
	// The default time: a loaded engine may take more than a second to start it.
	res, err := s.Tools.Call(ctx, tools.Command, "", json.RawMessage(`{"command":"echo ran"}`))
	if err != nil || !strings.Contains(string(res), `"stdout":"ran\n"`) {
		t.Fatalf("command after the slot was freed: %s, %v", res, err)
	}
}
