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
func TestCapAcrossMountAndTools(t *testing.T) {
	src, a, b := sharedVolume(t)
	const limit = 2 << 20
	pol := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(pol, []byte("preset: open\nrules:\n  - path: tmp/\n    max_bytes: 2MiB\n"), 0o600); err != nil {
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
}
