package store_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// TestGeneratedReadme: a policy with readme keeps README.md at the top of
// the workspace, generated from the policy, rewritten only when it differs.
func TestGeneratedReadme(t *testing.T) {
	e := newEnv(t)
	sc := store.Scope{Space: "s", Agent: "a", Session: "r"}
	pol := policy.Default()
	pol.Readme = true
	ws := e.open(t, sc, pol)
	path := filepath.Join(e.dir(sc), policy.ReadmeFile)
	b, err := os.ReadFile(path)
	if err != nil || string(b) != policy.WorkspaceReadme(ws.Policy()) {
		t.Fatalf("README: %v\n%s", err, b)
	}
	st1, _ := os.Stat(path)
	e.open(t, sc, pol)
	st2, _ := os.Stat(path)
	if !os.SameFile(st1, st2) {
		t.Fatal("an unchanged README was rewritten")
	}
	if _, err := ws.WriteFile(context.Background(), policy.ReadmeFile, []byte("x"), nil); policy.CodeOf(err) != policy.ReadOnly {
		t.Fatalf("write to the generated README: %v", err)
	}
	// A changed policy rewrites it.
	pol.Limits.TextBytes = 1 << 20
	ws3 := e.open(t, sc, pol)
	if b, _ := os.ReadFile(path); string(b) != policy.WorkspaceReadme(ws3.Policy()) {
		t.Fatal("README not regenerated after the policy changed")
	}
}
