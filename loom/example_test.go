package loom_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/agentloom/loomfs/fusefs"
	"github.com/agentloom/loomfs/loom"
	"github.com/agentloom/loomfs/nodeservice"
	"github.com/agentloom/loomfs/sandbox"
	"github.com/agentloom/loomfs/store"
)

// A platform opens a scope and calls the tools a model asked for.
func Example() {
	root, _ := os.MkdirTemp("", "loom-example-")
	defer os.RemoveAll(root)
	node := loom.New(loom.Config{Store: store.Config{Root: root}, Sandbox: sandbox.ConfigFromEnv()})
	defer node.Close()

	ctx := context.Background()
	s, err := node.Open(ctx, "acme/coder/s1")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()
	if _, err := s.Tools.Call(ctx, "workspace_write", "call-1", json.RawMessage(`{"path":"notes.md","content":"hello\n"}`)); err != nil {
		fmt.Println(err)
		return
	}
	res, _ := s.Tools.Call(ctx, "workspace_read", "", json.RawMessage(`{"path":"notes.md"}`))
	var r struct{ Content string }
	json.Unmarshal(res, &r)
	fmt.Print(r.Content)
	// Output: hello
}

// Processes outlive the call that starts them. With Config.Processes
// unset they live in this program's own session sandboxes (Node.Processes);
// with a nodeservice.Client they live in the node's loomfs serve, where
// every other caller on the node reaches them too.
func Example_processes() {
	ctx := context.Background()
	node := loom.New(loom.Config{
		Store:     store.Config{Root: "/srv/agentloom"},
		Sandbox:   sandbox.ConfigFromEnv(),
		Processes: nodeservice.NewClient(nodeservice.DefaultSocket),
	})
	defer node.Close()
	s, err := node.Open(ctx, "acme/coder/s1")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()
	res, err := s.Tools.Call(ctx, "workspace_process_start", "call-2", json.RawMessage(`{"command":"python3 -i -q","yield_ms":300}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	var p struct {
		ProcessID string `json:"process_id"`
		Cursor    int64  `json:"cursor"`
	}
	json.Unmarshal(res, &p)
	in, _ := json.Marshal(map[string]any{"process_id": p.ProcessID, "input": "print(6*7)\n"})
	res, _ = s.Tools.Call(ctx, "workspace_process_write", "call-3", in)
	fmt.Println(string(res))
}

// A projection is the same scope as a filesystem, under the same policy.
func ExampleSession_Project() {
	ctx := context.Background()
	node := loom.New(loom.Config{Store: store.Config{Root: "/srv/agentloom"}})
	s, err := node.Open(ctx, "acme/coder/s1")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()
	m, err := s.Project(ctx, "/run/loomfs/mnt/s1", fusefs.Options{NoFollowLinks: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer m.Unmount()
}
