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

// TestJudgeOutputLost: a fault that hit the process's own stdout excuses
// a missing answer, and nothing else; a fault that hit only the volume
// excuses nothing.
func TestJudgeOutputLost(t *testing.T) {
	const (
		onStdout = `7 write(1<pipe:[4411]>, "{\"error\"..., 80) = -1 ENOSPC (No space left on device) (INJECTED)`
		onLedger = `7 write(11</v/root/.agentloom-audit/vm.ledger.jsonl>, "{\"time\""..., 297) = -1 ENOSPC (No space left on device) (INJECTED)`
	)
	for _, tc := range []struct {
		name, log string
		torn      bool
		want      string // "" for no problem
	}{
		{"answer lost", onLedger + "\n" + onStdout, false, ""},
		{"answer lost, file torn", onLedger + "\n" + onStdout, true, "neither the old"},
		{"only the volume hit", onLedger, false, "not JSON"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := toolOp("write", "workspace_write", map[string]string{"x.txt": oldText}, nil,
				func(b tree) tree { return with(b, map[string]string{"x.txt": newText}) })
			c := newCell(t)
			before := o.setup(c)
			c.f = &fault{syscall: "write", errno: "ENOSPC", when: 1}
			if err := os.WriteFile(c.log, []byte(tc.log+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if tc.torn {
				os.WriteFile(filepath.Join(c.main(), "x.txt"), []byte("alp"), 0o600)
			}
			bad := strings.Join(judge(c, o, before, outcome{exit: 1}), "\n")
			switch {
			case tc.want == "" && bad != "":
				t.Errorf("judge found %q, want nothing", bad)
			case tc.want != "" && !strings.Contains(bad, tc.want):
				t.Errorf("judge found %q, want a problem naming %q", bad, tc.want)
			}
		})
	}
}
