package process

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/sandbox"
	"github.com/agentloom/loomfs/store"
	"github.com/agentloom/loomfs/tools"
)

// left counts the processes of the session whose command line holds
// marker, from a process of its own.
func (e *env) left(marker string) string {
	e.t.Helper()
	out := e.start(map[string]any{"command": "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' 2>/dev/null <$f; echo; done | grep -c '^[s]leep " + marker + "'", "yield_ms": 10000})
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

// A tree is killed both ways a sandbox can: from the host, with the
// container frozen (where the worker sees its cgroups: runc, root), and by
// the controller in the sandbox (gVisor, or a worker that can't). Either
// way every process of the tree ends, another process of the session goes
// on, and the container is not left frozen.
func TestKillTreeBothWays(t *testing.T) {
	for i, way := range []string{"host", "controller"} {
		t.Run(way, func(t *testing.T) {
			if way == "host" && gvisor() {
				t.Skip("under gVisor the host does not see the sandbox's processes")
			}
			e := newEnv(t, "", testNode, fmt.Sprintf("acme/coder/kill-%d", i), "")
			other := e.start(map[string]any{"command": "sleep 2070", "yield_ms": 100})
			tree := e.start(map[string]any{"command": "setsid sleep 2061 </dev/null >/dev/null 2>&1 & sleep 2062 & exec sleep 2063", "yield_ms": 500})
			if n := e.left("206"); n != "3" {
				t.Fatalf("%s processes of the tree running before the kill, want 3", n)
			}
			e.svc.mu.Lock()
			p := e.svc.procs[tree.ProcessID]
			e.svc.mu.Unlock()
			var n int
			var err error
			if way == "host" {
				p.box.hostKillMu.Lock()
				n, err = hostKillTree(context.Background(), p.box.id, p.gid)
				p.box.hostKillMu.Unlock()
			} else {
				var f []string
				f, err = p.box.ask(context.Background(), fmt.Sprintf("kill %d", p.gid))
				if len(f) > 0 {
					n, _ = strconv.Atoi(f[0])
				}
			}
			if err != nil || n != 3 {
				t.Fatalf("kill from the %s: %d killed, %v; want 3", way, n, err)
			}
			if fz, ok := hostFreezer(p.box.id); ok {
				// Each process's end kills what it left, from the host:
				// frozen for a moment, never for long.
				waitFor(t, "the container to be thawed", 5*time.Second, func() bool { return !fz.frozen() })
			}
			if n := e.left("206"); n != "0" {
				t.Errorf("%s processes of the tree still run after the kill", n)
			}
			var r tools.ProcessOutput
			e.must(tools.ProcessRead, map[string]any{"process_id": other.ProcessID, "yield_ms": 0}, &r)
			if r.Status != tools.StatusRunning {
				t.Errorf("another process of the session after the kill: %+v, want running", r)
			}
		})
	}
}

// failingProbe is a projection whose health probe fails.
type failingProbe struct{ sandbox.Projection }

func (failingProbe) Probe(context.Context) error { return errors.New("the probe failed (test)") }

// TestStartUndoneWhenProbeFails: a session sandbox whose projection fails
// its health probe answers sandbox_unavailable, and what was made for it
// is undone (the projection unmounted, its mountpoint removed): the undo
// steps act on the sandbox being made, not on the nil result an error
// return leaves (they once did, and the panic cost the service's caller
// its answer).
func TestStartUndoneWhenProbeFails(t *testing.T) {
	e := newEnv(t, "", testNode, "acme/coder/probe-fails", "")
	mount := e.svc.cfg.Mount
	e.svc.cfg.Mount = func(ctx context.Context, ws *store.Workspace, log audit.Sink, mp string, call sandbox.CallInfo) (sandbox.Projection, error) {
		p, err := mount(ctx, ws, log, mp, call)
		if err != nil {
			return nil, err
		}
		return failingProbe{p}, nil
	}
	err := e.call(tools.ProcessStart, map[string]any{"command": "true"}, nil)
	var pe *policy.Error
	if !errors.As(err, &pe) || pe.Code != policy.SandboxUnavailable {
		t.Fatalf("start with a failing probe: %v, want sandbox_unavailable", err)
	}
	ents, _ := os.ReadDir(e.svc.cfg.MountDir)
	if len(ents) != 0 {
		t.Errorf("left in the mount directory: %v", ents)
	}
	mounts, _ := os.ReadFile("/proc/self/mounts")
	if strings.Contains(string(mounts), e.svc.cfg.MountDir) {
		t.Errorf("a projection is still mounted under %s", e.svc.cfg.MountDir)
	}
}
