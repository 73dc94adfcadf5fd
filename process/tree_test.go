package process

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/agentloom/loomfs/tools"
)

// left counts the processes of the session whose command line holds
// marker, from a process of its own.
func (e *env) left(marker string) string {
	e.t.Helper()
	out := e.start(map[string]any{"command": "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f 2>/dev/null; echo; done | grep -c '^[s]leep " + marker + "'", "yield_ms": 10000})
	if out.Status != tools.StatusExited || out.Stderr != "" {
		e.t.Fatalf("counting the processes left: %+v", out)
	}
	return strings.TrimSpace(out.Stdout)
}

// A process is its whole tree (issue 43): what its command leaves running
// is killed when it exits, and counted in its record; a signal reaches
// every descendant at any time, also one in a session of its own with its
// output closed.
//
// Each case has a session of its own: under gVisor the sandbox kernel's
// host threads count against the container's pids limit and are not
// given back when its processes end, so one session for all would end.
func TestProcessIsItsTree(t *testing.T) {
	for i, tc := range []struct {
		name, command, signal, marker string
		left                          int // left_running_killed at least
	}{
		{"background sleeps end with their process", "sleep 2011 & sleep 2012 & sleep 1", "", "201", 2},
		{"a setsid daemon with its output closed ends with its process", "setsid sleep 2021 </dev/null >/dev/null 2>&1 & sleep 2022 >/dev/null & sleep 1", "", "202", 2},
		{"KILL reaches a setsid daemon while its process runs", "setsid sleep 2031 </dev/null >/dev/null 2>&1 & sleep 2032 & exec sleep 2033", "KILL", "203", 0},
		{"TERM reaches a setsid daemon while its process runs", "setsid sleep 2041 </dev/null >/dev/null 2>&1 & exec sleep 2042", "TERM", "204", 0},
		{"an orphan whose parent exited at once ends with its process", "sh -c 'sleep 2051 & exit 0'; sleep 1", "", "205", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, "", testNode, fmt.Sprintf("acme/coder/tree-%d", i), "")
			out := e.start(map[string]any{"command": tc.command, "yield_ms": 500})
			if tc.signal != "" {
				if out.Status != tools.StatusRunning {
					t.Fatalf("before the signal: %+v", out)
				}
				if n := e.left(tc.marker); n == "0" {
					t.Fatalf("no process of the tree seen running before the signal")
				}
				var info tools.ProcessInfo
				e.must(tools.ProcessSignal, map[string]any{"process_id": out.ProcessID, "signal": tc.signal}, &info)
			}
			var r tools.ProcessOutput
			waitFor(t, "the process to exit", 15*time.Second, func() bool {
				e.must(tools.ProcessRead, map[string]any{"process_id": out.ProcessID, "since": 0, "yield_ms": 1000}, &r)
				return r.Status == tools.StatusExited
			})
			if r.LeftRunningKilled == nil || *r.LeftRunningKilled < tc.left {
				t.Errorf("left_running_killed %v, want at least %d", r.LeftRunningKilled, tc.left)
			}
			if n := e.left(tc.marker); n != "0" {
				t.Errorf("%s processes of the tree still run after it exited", n)
			}
			var list tools.ProcessListResult
			e.must(tools.ProcessList, map[string]any{}, &list)
			for _, p := range list.Processes {
				if p.ProcessID == out.ProcessID && (p.LeftRunningKilled == nil || *p.LeftRunningKilled != *r.LeftRunningKilled) {
					t.Errorf("the record says left_running_killed %v, the read %v", p.LeftRunningKilled, *r.LeftRunningKilled)
				}
			}
		})
	}
}
