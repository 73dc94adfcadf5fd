package tools

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
)

// TestPlantedSpecialFiles: a FIFO, a Unix socket and a device node put in
// the backing store by someone else are listed for what they are and
// refused by every tool that would open them; nothing blocks on the FIFO.
func TestPlantedSpecialFiles(t *testing.T) {
	tb, dir := newBox(t, nil)
	if err := unix.Mkfifo(filepath.Join(dir, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Socket paths are limited to ~108 bytes: bind from inside the dir.
	wd, _ := os.Getwd()
	os.Chdir(dir)
	l, err := net.Listen("unix", "sock")
	os.Chdir(wd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	if err := unix.Mknod(filepath.Join(dir, "null"), unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, name := range []string{"fifo", "sock", "null"} {
		for _, op := range []struct {
			tool string
			in   map[string]any
		}{
			{Read, map[string]any{"path": name}},
			{Write, map[string]any{"path": name, "content": "x"}},
			{Edit, map[string]any{"path": name, "old_text": "a", "new_text": "b"}},
			{Delete, map[string]any{"path": name}},
		} {
			b, _ := json.Marshal(op.in)
			_, err := tb.Call(ctx, op.tool, "", b)
			if policy.CodeOf(err) != policy.SpecialFileRefused {
				t.Errorf("%s %s: %v, want special_file_refused", op.tool, name, err)
			}
		}
		s := mustCall(t, tb, Stat, map[string]any{"path": name})
		if s["sha256"] != nil || s["refused"] != "special_file_refused" {
			t.Errorf("stat %s: %v", name, s)
		}
	}
	l2 := mustCall(t, tb, List, map[string]any{})
	kinds := map[string]string{}
	for _, e := range l2["entries"].([]any) {
		m := e.(map[string]any)
		kinds[m["name"].(string)] = m["type"].(string)
	}
	if kinds["fifo"] != "fifo" || kinds["sock"] != "socket" || kinds["null"] != "device" {
		t.Fatalf("listing: %v", kinds)
	}
	g := mustCall(t, tb, Grep, map[string]any{"pattern": "x"})
	if g["skipped_refused"].(float64) != 3 {
		t.Fatalf("grep: %v", g)
	}
	if ctx.Err() != nil {
		t.Fatal("a tool blocked on a special file")
	}
}

// TestSwapRace: while a goroutine swaps a directory and a symlink pointing
// outside (RENAME_EXCHANGE), other goroutines run read, write, edit,
// delete, glob and grep thousands of times. The canary outside the scope
// is never read or changed.
func TestSwapRace(t *testing.T) {
	tb, dir := newBox(t, nil)
	outside := t.TempDir()
	const canary = "CANARY-7f3a"
	canaryFile := filepath.Join(outside, "f.txt")
	os.WriteFile(canaryFile, []byte(canary+"\n"), 0o600)
	if err := os.Mkdir(filepath.Join(dir, "d"), 0o700); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "d", "f.txt"), []byte("inside\n"), 0o600)
	if err := os.Symlink(outside, filepath.Join(dir, "swap")); err != nil {
		t.Fatal(err)
	}

	var stop atomic.Bool
	var swaps atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			unix.Renameat2(unix.AT_FDCWD, filepath.Join(dir, "d"), unix.AT_FDCWD, filepath.Join(dir, "swap"), unix.RENAME_EXCHANGE)
			swaps.Add(1)
		}
	}()
	ops := []struct {
		tool string
		in   string
	}{
		{Read, `{"path":"d/f.txt"}`},
		{Write, `{"path":"d/f.txt","content":"written\n"}`},
		{Edit, `{"path":"d/f.txt","old_text":"` + canary + `","new_text":"pwned"}`},
		{Edit, `{"path":"d/f.txt","old_text":"written","new_text":"inside"}`},
		{Delete, `{"path":"d/f.txt"}`},
		{Write, `{"path":"d/f.txt","content":"again\n"}`},
		{Glob, `{"pattern":"**/*.txt"}`},
		{Grep, `{"pattern":"CANARY"}`},
		{Stat, `{"path":"d/f.txt"}`},
		{List, `{"path":"d"}`},
	}
	var calls atomic.Int64
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 750; i++ {
				op := ops[(i+w)%len(ops)]
				res, _ := tb.Call(context.Background(), op.tool, "", json.RawMessage(op.in))
				calls.Add(1)
				if strings.Contains(string(res), canary) {
					t.Errorf("%s read the canary outside the scope: %s", op.tool, res)
				}
			}
		}()
	}
	for calls.Load() < 3000 {
		time.Sleep(10 * time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	b, err := os.ReadFile(canaryFile)
	if err != nil || string(b) != canary+"\n" {
		t.Fatalf("canary changed: %q %v", b, err)
	}
	ents, _ := os.ReadDir(outside)
	if len(ents) != 1 {
		t.Fatalf("something was created outside the scope: %v", ents)
	}
	t.Logf("%d calls during %d swaps", calls.Load(), swaps.Load())
}
