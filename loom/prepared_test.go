package loom

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentloom/loomfs/sandbox"
	"github.com/agentloom/loomfs/store"
	"github.com/agentloom/loomfs/tools"
)

// TestPreparedContainerGoes: the container prepared for a session's next
// command does not outlive the session, nor the node's fence; no command
// runs after the fence.
func TestPreparedContainerGoes(t *testing.T) {
	for _, end := range []string{"close", "fence"} {
		t.Run(end, func(t *testing.T) {
			ctx := context.Background()
			cfg := sandbox.ConfigFromEnv()
			cfg.Image, cfg.Node = sandbox.MinimalImage, fmt.Sprintf("loom-prepared-%d-%s", os.Getpid(), end)
			n := New(Config{Store: store.Config{Root: t.TempDir()}, Sandbox: cfg, MountDir: filepath.Join(t.TempDir(), "mnt")})
			r, err := sandbox.NewRunner(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			ours := func() (prepared, all int) {
				list, err := r.Containers(ctx)
				if err != nil {
					t.Fatal(err)
				}
				for _, c := range list {
					if c.Node == cfg.Node {
						all++
						if c.Prepared && c.State == "created" {
							prepared++
						}
					}
				}
				return prepared, all
			}
			t.Cleanup(func() { r.RemoveNode(context.Background()) })
			s, err := n.Open(ctx, "acme/coder/prepared-"+end)
			if err != nil {
				t.Fatal(err)
			}
			closed := false
			defer func() {
				if !closed {
					s.Close()
				}
			}()
			for range 2 { // the second prepares the third's container
				if _, err := s.Tools.Call(ctx, tools.Command, "", json.RawMessage(`{"command":"true"}`)); err != nil {
					t.Fatal(err)
				}
			}
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				if p, _ := ours(); p == 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("no container was prepared for the next command")
				}
			}
			switch end {
			case "close":
				s.Close()
				closed = true
			case "fence":
				if err := n.fenced(ctx, errors.New("fenced by the test")); err == nil {
					t.Fatal("fenced returned no error")
				}
			}
			if _, all := ours(); all != 0 {
				t.Fatalf("%d containers of the node after %s", all, end)
			}
			if end == "fence" {
				if _, err := s.Tools.Call(ctx, tools.Command, "", json.RawMessage(`{"command":"true"}`)); err == nil {
					t.Fatal("a command ran after the fence")
				}
				if _, all := ours(); all != 0 {
					t.Fatalf("%d containers of the node after a command refused after the fence", all)
				}
			}
		})
	}
}
