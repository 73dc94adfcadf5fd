package faults

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
		{"a storage fault answered as a missing file", func(c *cell) outcome {
			c.f = &fault{syscall: "openat", errno: "EIO", when: 1}
			return outcome{exit: 1, stdout: `{"error":{"code":"not_found","message":"d: no such file or directory"}}`}
		}, "not a missing file"},
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
		// strace cuts a call in two when another thread's line comes
		// between its start and its end (CI, tool_delete/write_ENOSPC_1).
		{"answer lost, its call cut by another thread's", `7 write(1<pipe:[4411]>, "{\"error\"..., 80 <unfinished ...>
8 write(11</v/root/.agentloom-audit/vm.ledger.jsonl>, "{\"time\""..., 297) = -1 ENOSPC (No space left on device) (INJECTED)
7 <... write resumed>) = -1 ENOSPC (No space left on device) (INJECTED)`, false, ""},
		{"the volume hit, a call to stdout cut but not failed", `7 write(1<pipe:[4411]>, "{\"error\"..., 80 <unfinished ...>
8 write(11</v/root/.agentloom-audit/vm.ledger.jsonl>, "{\"time\""..., 297) = -1 ENOSPC (No space left on device) (INJECTED)
7 <... write resumed>) = 80`, false, "not JSON"},
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

// TestJudgeReconcileSlowMount: the account check waits for the reconciling
// mount to start and to correct the account, however slow the node, and
// still finds an account no reconcile corrects. The account is put off as
// a restore killed between its swap and its recount leaves it (a tree the
// account did not see: TestKillAtEveryStep/snapshot_restore/openat_KILL_24
// in the whole matrix, on a node whose load made the mount start in more
// than the 10 s the judge gave it; it was stopped before it reconciled
// anything, and the account was blamed).
func TestJudgeReconcileSlowMount(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mount  string        // how the wrapper changes a mount: a delay, or its reconcile turned off
		wait   time.Duration // reconcileWait
		want   string        // "" for no problem
		fitted bool          // the account matches a walk afterwards
	}{
		{"a mount slower to start than 10 s", `sleep 11`, reconcileWait, "", true},
		{"a mount that never reconciles", `set -- $(echo "$@" | sed 's/--reconcile 200ms/--reconcile 0/')`, 3 * time.Second, "corrected nothing", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCell(t)
			seed(c, map[string]string{"x.txt": oldText})
			if err := os.WriteFile(filepath.Join(c.main(), "restored.txt"), []byte(newText), 0o600); err != nil {
				t.Fatal(err)
			}
			if c.quotaDiff() == "" {
				t.Fatal("the account matches a walk before the test put it off")
			}
			wrapper := filepath.Join(c.dir, "loomfs")
			script := "#!/bin/sh\ncase \" $* \" in *\" mount \"*) " + tc.mount + " ;; esac\nexec " + loomfsBin + " \"$@\"\n"
			if err := os.WriteFile(wrapper, []byte(script), 0o700); err != nil {
				t.Fatal(err)
			}
			defer func(bin string, wait time.Duration) { loomfsBin, reconcileWait = bin, wait }(loomfsBin, reconcileWait)
			loomfsBin, reconcileWait = wrapper, tc.wait
			bad := strings.Join(c.quotaHeld(), "\n")
			switch {
			case tc.want == "" && bad != "":
				t.Errorf("judge found %q, want nothing", bad)
			case tc.want != "" && !strings.Contains(bad, tc.want):
				t.Errorf("judge found %q, want a problem naming %q", bad, tc.want)
			}
			if got := c.quotaDiff() == ""; got != tc.fitted {
				t.Errorf("after the judge's reconcile the account matches a walk: %v, want %v", got, tc.fitted)
			}
		})
	}
}
