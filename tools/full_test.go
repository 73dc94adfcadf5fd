package tools

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"go.uber.org/zap/zaptest"
	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// A full volume is no_space in the tool door, a code of its own (not
// quota_exceeded, the policy's limit, nor the operator's
// volume_unavailable), with nothing written: the old content stays. Once
// room comes back, the same toolbox writes again.
func TestFullVolumeNoSpace(t *testing.T) {
	root := t.TempDir()
	if err := unix.Mount("tmpfs", root, "tmpfs", 0, "size=80m,mode=0700"); err != nil {
		t.Skipf("cannot mount tmpfs (needs root): %v", err)
	}
	t.Cleanup(func() { unix.Unmount(root, unix.MNT_DETACH) })
	ctx := context.Background()
	vol, err := store.OpenVolume(ctx, store.Config{Root: filepath.Join(root, "volume")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vol.Close() })
	ws, err := vol.Open(ctx, store.Scope{Space: "sp", Agent: "ag", Session: "se"}, policy.Default())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	log, err := audit.Open(vol.Path(), audit.Options{Node: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { log.Close() })
	// The log says what an internal answer hid, should one come.
	tb := &Toolbox{WS: ws, Audit: log, Log: zaptest.NewLogger(t)}
	mustCall(t, tb, Write, map[string]any{"path": "kept.txt", "content": "old\n"})

	filler := filepath.Join(root, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	for err == nil {
		_, err = f.Write(make([]byte, 8<<20))
	}
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("filling the volume: %v", err)
	}
	f.Close()

	for _, tc := range []struct {
		tool string
		in   map[string]any
	}{
		{Write, map[string]any{"path": "new.txt", "content": string(make([]byte, 64<<10))}},
		{Write, map[string]any{"path": "kept.txt", "content": "new content that needs a block\n"}},
		{Edit, map[string]any{"path": "kept.txt", "old_text": "old", "new_text": "edited"}},
	} {
		_, err := call(t, tb, tc.tool, tc.in)
		t.Logf("%s %v", tc.tool, tc.in["path"])
		pe := wantCode(t, err, policy.NoSpace)
		if pe.Message == "" || policy.Public(err).Message != pe.Message {
			t.Errorf("%s: the no_space message is replaced at the boundary: %q", tc.tool, pe.Message)
		}
	}
	// A second holder of the scope (another process, or this one once its
	// quota grant went back idle) must ask the quota ledger for room,
	// which a full volume can't write either: still no_space.
	vol2, err := store.OpenVolume(ctx, store.Config{Root: vol.Path()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vol2.Close() })
	ws2, err := vol2.Open(ctx, ws.Scope(), policy.Default())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws2.Close() })
	tb2 := &Toolbox{WS: ws2, Audit: log, Log: zaptest.NewLogger(t)}
	_, err = call(t, tb2, Write, map[string]any{"path": "other.txt", "content": "x"})
	wantCode(t, err, policy.NoSpace)

	// Reads go on: the audit log takes their records into the room it
	// keeps ahead on a volume large enough to spare it.
	for i := range 50 {
		if res := mustCall(t, tb, Read, map[string]any{"path": "kept.txt"}); res["content"] != "old\n" {
			t.Fatalf("read %d on a full volume: %v", i, res)
		}
	}
	if b, err := os.ReadFile(filepath.Join(vol.Path(), ws.Scope().Dir(), "kept.txt")); err != nil || string(b) != "old\n" {
		t.Fatalf("kept.txt on a full volume = %q, %v; want its old content", b, err)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	mustCall(t, tb, Write, map[string]any{"path": "new.txt", "content": "room again\n"})
	res := mustCall(t, tb, Read, map[string]any{"path": "new.txt"})
	if res["content"] != "room again\n" {
		t.Fatalf("read once room came back: %v", res)
	}
}
