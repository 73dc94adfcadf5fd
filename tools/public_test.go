package tools

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// TestNoHostPathInAnswers: on a volume so full the audit log has no room
// left (its room kept ahead did not fit on this tiny volume), the model
// reads no_space and what to do, never the write error's host path, which
// goes to the operator's log.
func TestNoHostPathInAnswers(t *testing.T) {
	root := t.TempDir()
	if err := unix.Mount("tmpfs", root, "tmpfs", 0, "size=1m,mode=0700"); err != nil {
		t.Skipf("cannot mount tmpfs (needs root): %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(root, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", root, err)
		}
	})
	ctx := context.Background()
	vol, err := store.OpenVolume(ctx, store.Config{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vol.Close() })
	ws, err := vol.Open(ctx, store.Scope{Space: "sp", Agent: "ag", Session: "se"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	log, err := audit.Open(vol.Path(), audit.Options{Node: "vm-1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { log.Close() })
	core, logged := observer.New(zap.WarnLevel)
	tb := &Toolbox{WS: ws, Audit: log, Log: zap.New(core)}
	if _, err := tb.Call(ctx, List, "", json.RawMessage(`{}`)); err != nil {
		t.Fatalf("list before the volume is full: %v", err)
	}

	// Fill the volume.
	filler, err := os.Create(filepath.Join(root, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := filler.Write(make([]byte, 64<<10)); err != nil {
			break
		}
	}
	filler.Close()

	// The log's last page may still hold a few records.
	for range 1000 {
		if _, err = tb.Call(ctx, List, "", json.RawMessage(`{}`)); err != nil {
			break
		}
	}
	pe := wantCode(t, err, policy.NoSpace)
	b, _ := json.Marshal(pe)
	for _, leak := range []string{root, "/", audit.DirName, "vm-1", "no space left"} {
		if strings.Contains(pe.Message, leak) || strings.Contains(string(b), leak) {
			t.Fatalf("the answer carries %q: %s", leak, b)
		}
	}
	// The operator's log has the detail.
	entries := logged.All()
	if len(entries) != 1 || !strings.Contains(fmt.Sprint(entries[0].ContextMap()["cause"]), root) {
		t.Fatalf("the operator's log lacks the cause: %v", entries)
	}
}
