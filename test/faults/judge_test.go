package faults

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestJudgeCatches: the checks run after every cell find what they are
// there to find. Each case is an operation that breaks one promise on
// purpose, where a faulted loomfs might.
func TestJudgeCatches(t *testing.T) {
	ok := outcome{exit: 0, stdout: `{"path":"x.txt"}`}
	for _, tc := range []struct {
		name string
		do   func(c *cell) outcome
		want string
	}{
		{"a torn file", func(c *cell) outcome {
			os.WriteFile(filepath.Join(c.main(), "x.txt"), []byte("alp"), 0o600)
			return outcome{exit: 1, stdout: `{"error":{"code":"internal","message":"m"}}`}
		}, "neither the old"},
		{"an acknowledged write lost", func(c *cell) outcome { c.ack = true; return ok }, "acknowledged, yet"},
		{"a Go crash", func(c *cell) outcome {
			return outcome{exit: 2, stderr: "unexpected fault address 0x7f\nfatal error: fault\n[signal SIGBUS: bus error code=0x2]"}
		}, "Go runtime crash"},
		{"a hang", func(c *cell) outcome { return outcome{exit: -1, signal: "killed", hung: true} }, "hang"},
		{"no JSON", func(c *cell) outcome { return outcome{exit: 1, stdout: "oops"} }, "not JSON"},
		{"an error without a code", func(c *cell) outcome { return outcome{exit: 1, stdout: `{"error":{"message":"m"}}`} }, "without code"},
		{"a temporary file in sight", func(c *cell) outcome {
			os.WriteFile(filepath.Join(c.main(), "x.txt.agentloom-tmp"), []byte("t"), 0o600)
			return outcome{exit: 1, stdout: `{"error":{"code":"internal","message":"m"}}`}
		}, "in an agent's sight"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := toolOp("write", "workspace_write", map[string]string{"x.txt": oldText}, nil,
				func(b tree) tree { return with(b, map[string]string{"x.txt": newText}) })
			c := newCell(t)
			before := o.setup(c)
			bad := judge(c, o, before, tc.do(c))
			if !strings.Contains(strings.Join(bad, "\n"), tc.want) {
				t.Errorf("judge found %q, want a problem naming %q", bad, tc.want)
			}
		})
	}
}
