package store_test

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// capPolicy caps tmp/ at 10 KiB and 5 entries and tmp/inner at 4 KiB.
func capPolicy(t *testing.T) *policy.Policy {
	t.Helper()
	p := policy.Default()
	if err := p.SetSubtrees([]policy.Subtree{
		{Prefix: "tmp", MaxBytes: 10 << 10, MaxFiles: 5},
		{Prefix: "tmp/inner", MaxBytes: 4 << 10},
	}); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestReserveAt: a change is checked against the scope quota and every
// capped subtree it is in, and counted in each.
func TestReserveAt(t *testing.T) {
	e := newEnv(t)
	ws := e.open(t, mainScope, capPolicy(t))
	mkdir(t, filepath.Join(e.dir(mainScope), "tmp/inner"))
	mkfile(t, filepath.Join(e.dir(mainScope), "tmp/inner/a"), string(make([]byte, 3<<10)))
	steps := []struct {
		name        string
		rel         string
		bytes, file int64
		code        policy.Code
	}{
		{"outside every cap", "src/x", 100 << 10, 1, ""},
		{"nested cap: tmp/inner holds 3 of 4 KiB", "tmp/inner/b", 2 << 10, 1, policy.QuotaExceeded},
		{"nested cap: what fits", "tmp/inner/b", 1 << 10, 1, ""},
		{"outer cap: tmp holds 4 of 10 KiB", "tmp/c", 7 << 10, 1, policy.QuotaExceeded},
		{"outer cap: what fits", "tmp/c", 6 << 10, 1, ""},
		{"outer cap: entries (tmp, inner, a, b, c)", "tmp/d", 0, 1, policy.QuotaExceeded},
		{"shrinking always passes", "tmp/c", -6 << 10, -1, ""},
		{"and makes room", "tmp/d", 5 << 10, 1, ""},
	}
	for _, s := range steps {
		err := ws.ReserveAt(context.Background(), s.rel, s.bytes, s.file)
		if got := policy.CodeOf(err); got != s.code {
			t.Fatalf("%s: ReserveAt(%s, %d, %d) = %v, want %q", s.name, s.rel, s.bytes, s.file, err, s.code)
		}
	}
	u, err := ws.SubtreeUsage(context.Background(), "tmp")
	if err != nil || u != (policy.Usage{Bytes: 9 << 10, Files: 5}) {
		t.Fatalf("tmp/ usage %+v %v", u, err)
	}
	// AdjustAt gives back to the scope and to the caps.
	ws.AdjustAt("tmp/d", -5<<10, -1)
	if u, _ := ws.SubtreeUsage(context.Background(), "tmp"); u != (policy.Usage{Bytes: 4 << 10, Files: 4}) {
		t.Fatalf("tmp/ usage after AdjustAt %+v", u)
	}
	// A move into a capped subtree is checked; out of one frees room.
	if err := ws.ReserveMove(context.Background(), "src/x", "tmp/big", 7<<10, 1); policy.CodeOf(err) != policy.QuotaExceeded {
		t.Fatalf("moving 7 KiB into tmp/: %v", err)
	}
	if err := ws.ReserveMove(context.Background(), "src/x", "tmp/small", 1<<10, 1); err != nil {
		t.Fatal(err)
	}
	if err := ws.ReserveMove(context.Background(), "tmp/small", "src/y", 1<<10, 1); err != nil {
		t.Fatal(err)
	}
	if err := ws.ReserveMove(context.Background(), "tmp/inner/b", "tmp/b", 1<<10, 1); err != nil {
		t.Fatal(err)
	}
	if u, _ := ws.SubtreeUsage(context.Background(), "tmp/inner"); u != (policy.Usage{Bytes: 3 << 10, Files: 2}) {
		t.Fatalf("tmp/inner usage after moving b out %+v", u)
	}
	if u, _ := ws.SubtreeUsage(context.Background(), "tmp"); u != (policy.Usage{Bytes: 4 << 10, Files: 4}) {
		t.Fatalf("a move inside tmp/ changed its usage: %+v", u)
	}
}

// TestWritesCountInCaps: the store's own writes, mkdirs and deletes keep
// the caps, and RefreshUsage recounts them after an outside change.
func TestWritesCountInCaps(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	ws := e.open(t, mainScope, capPolicy(t))
	if _, err := ws.Mkdir(ctx, "tmp", false); err != nil {
		t.Fatal(err)
	}
	if _, err := ws.WriteFile(ctx, "tmp/a", make([]byte, 8<<10), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ws.WriteFile(ctx, "tmp/b", make([]byte, 3<<10), nil); policy.CodeOf(err) != policy.QuotaExceeded {
		t.Fatalf("write over the tmp/ cap: %v", err)
	}
	if err := ws.Remove(ctx, "tmp/a", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ws.WriteFile(ctx, "tmp/b", make([]byte, 3<<10), nil); err != nil {
		t.Fatalf("after the delete: %v", err)
	}
	mkfile(t, filepath.Join(e.dir(mainScope), "tmp/outside"), string(make([]byte, 7<<10)))
	ws.RefreshUsage(context.Background())
	if u, _ := ws.SubtreeUsage(ctx, "tmp"); u != (policy.Usage{Bytes: 10 << 10, Files: 3}) {
		t.Fatalf("tmp/ after refresh %+v", u)
	}
	if _, err := ws.WriteFile(ctx, "tmp/c", []byte("x"), nil); policy.CodeOf(err) != policy.QuotaExceeded {
		t.Fatalf("the outside change is counted after refresh: %v", err)
	}
}

// TestTokenOnce: a confirmation token is redeemed at most once, even by
// concurrent callers.
func TestTokenOnce(t *testing.T) {
	e := newEnv(t)
	ws := e.open(t, mainScope, nil)
	c := store.Confirmation{Tool: "workspace_delete", Path: "output/a", ArgsSHA: "x", Issued: time.Now(), Expires: time.Now().Add(time.Minute)}
	tok, err := ws.IssueToken(c)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	won := 0
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec, err := ws.RedeemToken(tok)
			if err != nil {
				t.Error(err)
			}
			if rec != nil {
				mu.Lock()
				won++
				mu.Unlock()
				if rec.Path != c.Path || rec.Tool != c.Tool {
					t.Errorf("redeemed %+v", rec)
				}
			}
		}()
	}
	wg.Wait()
	if won != 1 {
		t.Fatalf("token redeemed %d times", won)
	}
	for _, bad := range []string{"", "ct_", "../../x", tok + "0", "ct_zz000000000000000000000000000000"} {
		if rec, err := ws.RedeemToken(bad); rec != nil || err != nil {
			t.Errorf("RedeemToken(%q) = %v, %v", bad, rec, err)
		}
	}
}
