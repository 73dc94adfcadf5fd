package fusefs

import (
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/agentloom/loomfs/policy"
)

// TestRefusedHook: Options.Refused is told of each refusal a program meets,
// with the scope-relative path, the errno it got, and the policy's code and
// message.
func TestRefusedHook(t *testing.T) {
	var mu sync.Mutex
	var got []Refusal
	e := newEnv(t, withRules(testRules...), withLimits(testLimits), withOptions(func(o *Options) {
		o.Refused = func(r Refusal) {
			mu.Lock()
			got = append(got, r)
			mu.Unlock()
		}
	}))
	plantRuleDirs(t, e)
	runIn(t, e.mnt, "head -c 2000000 /dev/zero > big; for f in a b c d; do head -c 900000 /dev/zero > $f; done; echo x > data/new; echo y > f; ln f hard")
	mu.Lock()
	defer mu.Unlock()
	want := []struct {
		op, path string
		errno    syscall.Errno
		code     policy.Code
		message  string
	}{
		{"write", "big", syscall.EFBIG, policy.TooLarge, ""},
		{"write", "d", syscall.EDQUOT, policy.QuotaExceeded, "quota exceeded: workspace total 3 MiB (used "},
		{"create", "data/new", syscall.EROFS, policy.ReadOnly, "data"},
		{"link", "hard", syscall.EXDEV, policy.LinkUnsupported, "copy the file instead"},
	}
	for _, w := range want {
		found := false
		for _, r := range got {
			if r.Op == w.op && r.Path == w.path {
				found = true
				if r.Errno != w.errno || w.code != "" && r.Code != w.code || !strings.Contains(r.Message, w.message) || r.Message == "" {
					t.Errorf("%s %s: told %+v, want errno %v code %q and a message with %q", w.op, w.path, r, w.errno, w.code, w.message)
				}
			}
		}
		if !found {
			t.Errorf("%s %s: not told; told %+v", w.op, w.path, got)
		}
	}
	for _, r := range got {
		if strings.Contains(r.Path, e.backing) || strings.Contains(r.Message, e.backing) || strings.HasPrefix(r.Path, "/") {
			t.Errorf("refusal carries a host path: %+v", r)
		}
	}
}
