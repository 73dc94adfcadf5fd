package test

// A capped subtree (tmp/) holds at most its cap across every process and
// node that writes into it: a `loomfs mount` and `loomfs tool` processes
// on two nodes draw on one account, as they do on the scope's quota.

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
)

const capScope = "acme/coder/caps"

// TestCapAcrossMountAndTools: a mount writes into tmp/, tool processes
// on two nodes fill it until refused, then the mount fills it again;
// together they stay within the cap, and a refused tool call names it.
// loomfs check shows tmp/'s account, and loomfs gc emptying tmp/ frees
// its cap for the mount.
func TestCapAcrossMountAndTools(t *testing.T) {
	src, a, b := sharedVolume(t)
	const limit = 2 << 20
	pol := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(pol, []byte("preset: open\nrules:\n  - path: tmp/\n    max_bytes: 2MiB\n    clear_at_run_end: true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	mnt, _ := a.mountWith(pol, capScope)
	if err := os.WriteFile(filepath.Join(mnt, "tmp", "first"), make([]byte, 512<<10), 0o600); err != nil {
		t.Fatal(err)
	}

	var wg sync.WaitGroup
	refusals := make([]string, 2)
	for i, n := range []*node{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			content := strings.Repeat("t", 64<<10)
			for k := 0; k < 64; k++ {
				r := n.run("--policy", pol, "tool", "workspace_write", "--scope", capScope, "--input", fmt.Sprintf(`{"path":"tmp/tool-%d-%d","content":%q}`, i, k, content))
				if r.code != 0 {
					var m map[string]any
					json.Unmarshal(r.stdout, &m)
					e, _ := m["error"].(map[string]any)
					refusals[i] = fmt.Sprintf("%v: %v", e["code"], e["message"])
					return
				}
			}
		}()
	}
	wg.Wait()
	for i, r := range refusals {
		if !strings.HasPrefix(r, "quota_exceeded: quota exceeded: tmp/ total 2 MiB (used ") {
			t.Errorf("the tool door on node %d stopped with %q", i, r)
		}
	}
	// The mount, which counted tmp/ before the tools wrote, is held to
	// what they left.
	_, err := fill(filepath.Join(mnt, "tmp", "second"), 64<<10)
	if !errors.Is(err, syscall.EDQUOT) {
		t.Errorf("the mount stopped with %v, want EDQUOT", err)
	}
	held := scopeBytes(t, filepath.Join(src, "spaces/acme/agents/coder/sessions/caps/main/tmp"))
	t.Logf("tmp/ holds %d of %d bytes; the tool door: %q", held, limit, refusals)
	if held > limit {
		t.Errorf("tmp/ holds %d bytes under a cap of %d", held, limit)
	}

	// Once the holders are idle, tmp/'s account is what a walk finds.
	var out struct {
		Quota struct {
			Subtrees []struct {
				Path  string
				Match bool
				Walk  struct{ Bytes int64 }
			}
		}
	}
	untilSettled(t, func() bool {
		r := b.run("--json", "--policy", pol, "check", "--scope", capScope)
		out.Quota.Subtrees = nil
		if err := json.Unmarshal(r.stdout, &out); err != nil || len(out.Quota.Subtrees) != 1 {
			t.Fatalf("check --scope: exit %d, %s %s", r.code, r.stdout, r.stderr)
		}
		return out.Quota.Subtrees[0].Match && out.Quota.Subtrees[0].Walk.Bytes == held
	})
	if s := out.Quota.Subtrees[0]; s.Path != "tmp/" || !s.Match || s.Walk.Bytes != held {
		t.Errorf("check --scope reports tmp/ as %+v; tmp/ holds %d bytes", s, held)
	}

	if r := b.run("--policy", pol, "gc", "--clear-tmp", "--scope", capScope); r.code != 0 {
		t.Fatalf("gc --clear-tmp: exit %d, %s %s", r.code, r.stdout, r.stderr)
	}
	if err := os.WriteFile(filepath.Join(mnt, "tmp", "after-gc"), make([]byte, 1<<20), 0o600); err != nil {
		t.Errorf("writing 1 MiB through the mount into the emptied tmp/: %v", err)
	}
}
