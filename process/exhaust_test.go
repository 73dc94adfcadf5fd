package process

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/tools"
)

// gvisor says the tests run under gVisor's runsc, where the container's
// pids and memory limits bound the sandbox kernel, so a tree that spends
// them ends the whole sandbox (and the next start replaces it), where
// under runc the session goes on.
func gvisor() bool { return strings.HasPrefix(os.Getenv("AGENT_LOOM_SANDBOX_RUNTIME"), "runsc") }

// startOK starts `echo ok` until it answers ok, for at most limit, and
// returns when that was and how many answers said session_exhausted.
// Each try is kept in e.tries (its answer and how long it took), so that
// a slow heal can say where its time went.
func (e *env) startOK(limit time.Duration) (time.Time, int) {
	e.t.Helper()
	deadline := time.Now().Add(limit)
	exhausted := 0
	e.tries = e.tries[:0]
	for {
		var out tools.ProcessOutput
		began := time.Now()
		err := e.call(tools.ProcessStart, map[string]any{"command": "echo ok", "yield_ms": 5000}, &out)
		answer := string(out.Status)
		if err != nil {
			answer = string(policy.CodeOf(err))
		}
		e.tries = append(e.tries, fmt.Sprintf("%s %.2fs", answer, time.Since(began).Seconds()))
		switch {
		case err == nil && out.Status == tools.StatusExited && out.ExitCode != nil && *out.ExitCode == 0 && out.Stdout == "ok\n":
			return time.Now(), exhausted
		case policy.CodeOf(err) == policy.SessionExhausted:
			exhausted++
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("no process started within %s: last answer %+v, %v", limit, out, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// forkBombs are the three shapes, each under a timeout of
// bombSeconds that ends its first process and leaves the rest running,
// with how many of them at least the sweep at its end finds under runc: a
// shell exits when it can't fork, so that bomb thins itself out, where the
// Python loop retries and xargs's sleeps wait.
var forkBombs = []struct {
	name, command string
	left          int
}{
	{"shell function", "timeout 3 sh -c 'f() { while :; do f & done; }; f'", 0},
	{"python loop that retries forks", "timeout 3 python3 -c '\nimport os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n'", 10},
	{"yes piped to xargs -P0", "timeout 3 sh -c 'yes 600 | xargs -P0 -n1 sleep'", 1},
}

const bombSeconds = 3

// healBound is how long a session may take to heal from a fork bomb before
// TestForkBombHeals calls it wedged: far above the 10 s target
// (measured by bench/forkbomb.sh), so that a loaded machine is not taken
// for a session that needs an operator.
const healBound = 120 * time.Second

// A fork bomb's session heals itself: once the bomb's command ended, what
// it left is killed with it and a new process starts, without an operator
// (issue 43). How soon is a measurement, not this test's to assert: the
// time from the bomb's end (its timeout) to the next successful start is
// logged, and bench/forkbomb.sh collects it against the 10 s (on a
// quiet machine 1-5 s; in CI's race-enabled run beside every other
// package once 38.6 s, which a timing bound here turned into a failed
// run). The test fails when the session does not heal within healBound.
func TestForkBombHeals(t *testing.T) {
	for i, tc := range forkBombs {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, "", testNode, fmt.Sprintf("acme/coder/bomb-%d", i), "")
			e.startOK(30 * time.Second) // the sandbox is up before the bomb
			began := time.Now()
			bomb := e.start(map[string]any{"command": tc.command, "yield_ms": 100})
			time.Sleep(bombSeconds * time.Second)
			end := began.Add(bombSeconds * time.Second)
			ok, exhausted := e.startOK(healBound)
			took := ok.Sub(end)
			t.Logf("fork bomb %q: next process started %.2f s after the bomb's end (%d answers session_exhausted)", tc.name, took.Seconds(), exhausted)
			if took > 5*time.Second {
				t.Logf("the starts tried: %s", strings.Join(e.tries, ", "))
			}
			var r tools.ProcessOutput
			e.must(tools.ProcessRead, map[string]any{"process_id": bomb.ProcessID, "yield_ms": 10000}, &r)
			var info tools.ProcessInfo
			var list tools.ProcessListResult
			e.must(tools.ProcessList, map[string]any{}, &list)
			for _, p := range list.Processes {
				if p.ProcessID == bomb.ProcessID {
					info = p
				}
			}
			switch {
			case info.Status != tools.StatusExited:
				t.Errorf("the bomb's record: %+v, want exited", info)
			case gvisor() && info.LeftRunningKilled == nil && info.Reason == "":
				t.Errorf("the bomb's record says neither what was killed nor why it ended: %+v", info)
			case !gvisor() && (info.LeftRunningKilled == nil || *info.LeftRunningKilled < tc.left):
				t.Errorf("the bomb's record: left_running_killed %v, want at least %d", info.LeftRunningKilled, tc.left)
			}
		})
	}
}

// While a bomb holds the pids limit, a start answers session_exhausted
// naming the limit and the process that holds it; a KILL of that process
// reaches its whole tree without a new process in the sandbox, and the
// next start succeeds. Under gVisor the bomb ends the sandbox instead, and
// the next start replaces it.
func TestPidsExhaustedSaysWhoAndHeals(t *testing.T) {
	e := newEnv(t, "", testNode, "acme/coder/exhausted", "")
	e.startOK(30 * time.Second)
	began := time.Now()
	bomb := e.start(map[string]any{"command": strings.TrimPrefix(forkBombs[1].command, "timeout 3 "), "yield_ms": 100})
	if gvisor() {
		time.Sleep(3 * time.Second)
		ok, _ := e.startOK(15 * time.Second)
		t.Logf("under gVisor: a process started %.2f s after the bomb began", ok.Sub(began).Seconds())
		return
	}
	var err error
	waitFor(t, "a start to answer session_exhausted", 30*time.Second, func() bool {
		err = e.call(tools.ProcessStart, map[string]any{"command": "echo ok", "yield_ms": 5000}, nil)
		return policy.CodeOf(err) == policy.SessionExhausted
	})
	if msg := err.Error(); !strings.Contains(msg, "pids limit") || !strings.Contains(msg, "of 256") || !strings.Contains(msg, bomb.ProcessID) {
		t.Errorf("session_exhausted %q: want the limit and the process that holds it", msg)
	}
	var info tools.ProcessInfo
	e.must(tools.ProcessSignal, map[string]any{"process_id": bomb.ProcessID, "signal": "KILL"}, &info)
	killed := time.Now()
	ok, _ := e.startOK(10 * time.Second)
	t.Logf("a process started %.2f s after the KILL", ok.Sub(killed).Seconds())
}

// A process the memory limit kills says so (oom_killed), and the session
// goes on: the next process starts. Under gVisor the memory limit ends
// the whole sandbox; the record says so all the same, and the next start
// replaces the sandbox. A KILL then reaches a process it started at once
// (the engine says an exec runs before its process is there).
func TestOOMKilledReported(t *testing.T) {
	e := newEnv(t, "", testNode, "acme/coder/oom", "")
	out := e.start(map[string]any{"command": `python3 -c "x = b'a' * (1 << 30); print(len(x))"`, "yield_ms": 30000})
	if out.Status != tools.StatusExited || !out.OOMKilled {
		t.Errorf("a process over the memory limit: %+v (exit %s), want exited with oom_killed", out, exitText(out.ExitCode))
	}
	if !gvisor() && (out.ExitCode == nil || *out.ExitCode != 137) {
		t.Errorf("exit code %s, want 137", exitText(out.ExitCode))
	}
	e.startOK(10 * time.Second)
	// A KILL sent by the model is not the memory limit's.
	k := e.start(map[string]any{"command": "sleep 600", "yield_ms": 100})
	var info tools.ProcessInfo
	e.must(tools.ProcessSignal, map[string]any{"process_id": k.ProcessID, "signal": "KILL"}, &info)
	var r tools.ProcessOutput
	waitFor(t, "the killed process to exit", 30*time.Second, func() bool {
		e.must(tools.ProcessRead, map[string]any{"process_id": k.ProcessID, "yield_ms": 1000}, &r)
		return r.Status == tools.StatusExited
	})
	if r.OOMKilled {
		t.Errorf("after KILL: %+v, want exited without oom_killed", r)
	}
}

// TestTmpFullSaidSo: a process that fills the session's /tmp is answered,
// as it ends, with how full /tmp is and what holds it; a start while it is
// full starts (it may be the one that frees it) and says so too; once the
// agent deletes the file, answers no longer do.
func TestTmpFullSaidSo(t *testing.T) {
	e := newEnv(t, "", testNode, "acme/coder/tmpfull", "")
	full := e.start(map[string]any{"command": "dd if=/dev/zero of=/tmp/fill bs=1M 2>/dev/null; echo filled", "yield_ms": 30000})
	if full.Status != tools.StatusExited || full.SessionTmp == nil {
		t.Fatalf("the process that filled /tmp: %+v, want exited with session_tmp_full", full)
	}
	st := full.SessionTmp
	if st.Code != string(policy.SessionExhausted) || st.LimitBytes == 0 || st.UsedBytes < st.LimitBytes*9/10 {
		t.Errorf("session_tmp_full %+v, want session_exhausted with the limit and use", st)
	}
	if len(st.Largest) == 0 || st.Largest[0].Path != "/tmp/fill" || !strings.Contains(st.Message, "/tmp/fill") || !strings.Contains(st.Message, "rm") {
		t.Errorf("session_tmp_full %+v, want /tmp/fill named first as what holds it, and the step that frees it", st)
	}
	// A start while it is full: it starts, and its first answer says so.
	freed := e.start(map[string]any{"command": "sleep 2; rm /tmp/fill && echo freed", "yield_ms": 200})
	if freed.Status != tools.StatusRunning || freed.SessionTmp == nil {
		t.Fatalf("a start while /tmp is full: %+v, want running with session_tmp_full", freed)
	}
	var r tools.ProcessOutput
	waitFor(t, "the process that frees /tmp to exit", 30*time.Second, func() bool {
		r = tools.ProcessOutput{} // an answer without session_tmp_full leaves the field as it was
		e.must(tools.ProcessRead, map[string]any{"process_id": freed.ProcessID, "yield_ms": 1000}, &r)
		return r.Status == tools.StatusExited
	})
	if r.ExitCode == nil || *r.ExitCode != 0 || r.SessionTmp != nil {
		// Its answer as it ended: /tmp was free by then.
		t.Errorf("the process that freed /tmp, as it ended: %+v %+v", r, r.SessionTmp)
	}
	after := e.start(map[string]any{"command": "echo ok > /tmp/x && cat /tmp/x", "yield_ms": 30000})
	if after.SessionTmp != nil || !strings.Contains(after.Output, "ok") {
		t.Errorf("a process after /tmp was freed: %+v", after)
	}
}
