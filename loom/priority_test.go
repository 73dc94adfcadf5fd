package loom_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/fusefs"
	"github.com/agentloom/loomfs/loom"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
	"github.com/agentloom/loomfs/tools"
)

// A volume near full degrades by priority (issue 48, seed 001 §5.3):
// three runs, low, normal and high, write through the tool door in turns
// on a small tmpfs. Low is refused first (volume_reserved), normal
// second, and high goes on until the volume itself is full (no_space).
// The projection refuses the same growth with ENOSPC while reads, deletes
// and truncations go on working, and the high run's projection still
// writes; nothing crashes.
func TestVolumeReserveByPriority(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=16m,mode=0700"); err != nil {
		t.Skipf("cannot mount tmpfs (needs root): %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	pol, err := policy.Parse("p.yaml", []byte("volume_reserve_low: 50%\nvolume_reserve_normal: 25%\n"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := store.Config{Root: filepath.Join(dir, "volume")}
	node := loom.New(loom.Config{Store: cfg, Policy: pol, MountDir: filepath.Join(t.TempDir(), "mnt")})
	ctx := context.Background()
	classes := []policy.Priority{policy.PriorityLow, policy.PriorityNormal, policy.PriorityHigh}
	sessions := map[policy.Priority]*loom.Session{}
	for _, c := range classes {
		run := "r-" + string(c)
		if _, err := store.CreateRun(ctx, cfg, store.RunSpec{Space: "sp", Agent: "ag", Session: string(c), Run: run, User: "u", Priority: c}); err != nil {
			t.Fatal(err)
		}
		s, err := node.Open(ctx, "run:"+run)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		sessions[c] = s
	}
	content := strings.Repeat("x", 256<<10)
	stopped := map[policy.Priority]int{} // round of the first refusal
	refusal := map[policy.Priority]*policy.Error{}
	for round := 0; round < 200 && len(stopped) < len(classes); round++ {
		for _, c := range classes {
			if _, done := stopped[c]; done {
				continue
			}
			in, _ := json.Marshal(map[string]any{"path": fmt.Sprintf("f%03d.txt", round), "content": content})
			if _, err := sessions[c].Tools.Call(ctx, tools.Write, "", in); err != nil {
				stopped[c], refusal[c] = round, policy.AsError(err)
			}
		}
	}
	t.Logf("first refusals by round: %v", stopped)
	for c, e := range refusal {
		t.Logf("%s: %s: %s", c, e.Code, e.Message)
	}
	if len(stopped) != 3 || !(stopped[policy.PriorityLow] < stopped[policy.PriorityNormal] && stopped[policy.PriorityNormal] < stopped[policy.PriorityHigh]) {
		t.Fatalf("refused at rounds %v: want low first, then normal, then high", stopped)
	}
	for c, want := range map[policy.Priority]policy.Code{policy.PriorityLow: policy.VolumeReserved, policy.PriorityNormal: policy.VolumeReserved, policy.PriorityHigh: policy.NoSpace} {
		if refusal[c].Code != want {
			t.Errorf("%s refused with %s (%s), want %s", c, refusal[c].Code, refusal[c].Message, want)
		}
	}
	if msg := refusal[policy.PriorityLow].Message; !strings.Contains(msg, "higher-priority work") || !strings.Contains(msg, "delete files") || strings.Contains(msg, dir) {
		t.Errorf("low's refusal: %s", msg)
	}

	// The other door: the low run's projection.
	mp := filepath.Join(t.TempDir(), "low")
	os.Mkdir(mp, 0o700)
	m, err := sessions[policy.PriorityLow].Project(ctx, mp, fusefs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Unmount() })
	if err := os.WriteFile(filepath.Join(mp, "new.txt"), []byte(content), 0o600); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("a new file through the low projection: %v, want ENOSPC", err)
	}
	if b, err := os.ReadFile(filepath.Join(mp, "f000.txt")); err != nil || len(b) != len(content) {
		t.Errorf("read through the low projection: %d bytes, %v", len(b), err)
	}
	if err := os.Truncate(filepath.Join(mp, "f000.txt"), 10); err != nil {
		t.Errorf("truncate through the low projection: %v", err)
	}
	if err := os.Remove(filepath.Join(mp, "f001.txt")); err != nil {
		t.Errorf("delete through the low projection: %v", err)
	}
	// Through the tool door too: reads and deletes work.
	if _, err := sessions[policy.PriorityLow].Tools.Call(ctx, tools.Read, "", json.RawMessage(`{"path":"f000.txt"}`)); err != nil {
		t.Errorf("a read of the low run: %v", err)
	}
	if _, err := sessions[policy.PriorityLow].Tools.Call(ctx, tools.Delete, "", json.RawMessage(`{"path":"f002.txt"}`)); err != nil {
		t.Errorf("a delete of the low run: %v", err)
	}
	// High still has room, through its projection, once high's own files
	// make some: it stops only where the volume does.
	if _, err := sessions[policy.PriorityHigh].Tools.Call(ctx, tools.Delete, "", json.RawMessage(`{"path":"f000.txt"}`)); err != nil {
		t.Fatal(err)
	}
	hp := filepath.Join(t.TempDir(), "high")
	os.Mkdir(hp, 0o700)
	hm, err := sessions[policy.PriorityHigh].Project(ctx, hp, fusefs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hm.Unmount() })
	if err := os.WriteFile(filepath.Join(hp, "more.txt"), []byte("high goes on\n"), 0o600); err != nil {
		t.Errorf("a write through the high projection: %v", err)
	}
	if err := os.WriteFile(filepath.Join(mp, "small.txt"), []byte("x"), 0o600); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("a write through the low projection after high's delete: %v, want ENOSPC", err)
	}
}
