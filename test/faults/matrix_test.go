package faults

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/agentloom/loomfs/policy"
)

// TestSyscallFaults injects each errno into each call site of each system
// call that changes the volume, for every operation of every door. The CI
// slice injects one errno per call (sliceErrno) at its first and last site.
func TestSyscallFaults(t *testing.T) { matrix(t, "syscall", false) }

// TestKillAtEveryStep kills each operation at each call site of those
// calls, then checks that nothing acknowledged is lost and the next
// process on the scope works. The CI slice kills at one site per call.
func TestKillAtEveryStep(t *testing.T) { matrix(t, "kill", true) }

func requireStrace(t *testing.T) {
	if _, err := exec.LookPath("strace"); err != nil {
		t.Fatal("strace is needed (scripts/setup installs it): ", err)
	}
}

func matrix(t *testing.T, name string, kill bool) {
	requireStrace(t)
	for _, o := range ops() {
		t.Run(o.door+"_"+o.name, func(t *testing.T) {
			most := countCalls(t, o)
			for _, sc := range syscalls {
				for _, when := range points(most[sc], kill, o.sample) {
					for _, e := range errnosFor(sc, kill) {
						f := fault{syscall: sc, errno: e, when: when}
						t.Run(f.name(), func(t *testing.T) { runCell(t, name, o, f) })
					}
				}
			}
		})
	}
}

// countCalls runs the operation without a fault, traced, and checks that it
// holds: the control cell. It returns the most calls of each system call
// one thread made.
func countCalls(t *testing.T, o op) map[string]int {
	c := newCell(t)
	before := o.setup(c)
	out := o.do(c)
	if s := crashed(out, false); s != "" || !c.ack {
		t.Fatalf("%s without a fault: %s (%s)", o.name, s, out)
	}
	bad := judge(c, o, before, out)
	if len(bad) > 0 {
		t.Fatalf("%s without a fault:\n  %s", o.name, strings.Join(bad, "\n  "))
	}
	most, err := counts(c.log)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("calls per thread at most: %v", most)
	return most
}

// points are the call sites a fault goes into: every one in the full
// matrix (or sample of them, spread from the first to the last); in the
// CI slice the first and last (an errno) or the middle one (a kill).
func points(n int, kill bool, sample int) []int {
	if n == 0 {
		return nil
	}
	if full {
		if sample == 0 || n <= sample {
			sample = n
		}
		var p []int
		for k := range sample {
			w := 1
			if sample > 1 {
				w = 1 + k*(n-1)/(sample-1)
			}
			p = append(p, w)
		}
		return p
	}
	if kill {
		return []int{(n + 1) / 2}
	}
	if n == 1 {
		return []int{1}
	}
	return []int{1, n}
}

func errnosFor(sc string, kill bool) []string {
	switch {
	case kill:
		return []string{""}
	case full:
		return errnos
	}
	return []string{sliceErrno[sc]}
}

// runCell runs one operation under one fault and checks every invariant.
func runCell(t *testing.T, matrix string, o op, f fault) {
	c := newCell(t)
	before := o.setup(c)
	c.f = &f
	out := o.do(c)
	if !c.fired() {
		t.Logf("%s: the fault did not fire (no thread made that call %d times)", f.inject(), f.when)
		return
	}
	if strings.Contains(out.stderr, "netpollBreak write failed") {
		// The Go runtime throws when the write to its own eventfd fails,
		// which no kernel does: the fault, not loomfs, ended the process.
		t.Logf("%s: the fault hit the Go runtime's eventfd (netpollBreak): not judged", f.inject())
		tally.add(matrix+" (off the volume, not judged)", o.door, true)
		detachUnder(c.dir) // the judge's next mount would have; the dead one must not stay
		return
	}
	if c.offVolume() {
		t.Logf("%s: the fault hit no file of the volume (a pipe, eventfd or socket): not judged", f.inject())
		tally.add(matrix+" (off the volume, not judged)", o.door, true)
		detachUnder(c.dir)
		return
	}
	t.Logf("injected: %s", strings.Join(c.injected(), "\n    "))
	bad := judge(c, o, before, out)
	tally.add(matrix, o.door, len(bad) == 0)
	if len(bad) > 0 {
		t.Errorf("%s %s, strace -f -e inject=%s: %s\n  %s\n  reproduce: go test ./test/faults/ -run '^%s$'%s",
			o.door, o.name, f.inject(), out, strings.Join(bad, "\n  "), t.Name(), fullNote(f))
	}
}

func fullNote(f fault) string {
	if full {
		return " with LOOMFS_FAULTS=full"
	}
	return ""
}

// judge checks a cell: how the process ended, its answer, the trees it may
// leave, what the operation promises, and the scope after it.
func judge(c *cell, o op, before tree, out outcome) []string {
	var bad []string
	killed := c.f != nil && c.f.kill()
	if s := crashed(out, killed); s != "" {
		bad = append(bad, s)
	}
	refused := ""
	if o.tool && !killed && c.outputLost() {
		// The fault ate the answer on its way to the caller: there is
		// nothing to judge but the scope.
		tally.code(o.door, c.f.errno, "(answer lost to the fault)")
	} else if o.tool && !killed {
		code, p := answer(out)
		if p != "" {
			bad = append(bad, p)
		}
		refused = code
		if c.f != nil {
			if code == "" {
				code = "ok"
			}
			tally.code(o.door, c.f.errno, code)
		}
		if c.f != nil && code == string(policy.NotFound) {
			// Every injected errno is the storage failing; "no such
			// file" would send an agent looking for a path that is there.
			bad = append(bad, fmt.Sprintf("answered not_found to an injected %s: a fault of the storage is not a missing file", c.f.errno))
		}
	}
	if o.after != nil {
		states := o.after(c, before)
		if o.tool {
			// An agent sees the scope through a door: a change set that a
			// fault cut after its commit is finished by the next lock
			// take, which a read makes while one is pending (store's
			// intent record). Look as an agent would, then at the tree.
			c.tool("workspace_list", map[string]any{})
		}
		got := c.tree()
		ok := false
		for _, s := range states {
			ok = ok || got.equal(s)
		}
		switch {
		case !ok:
			bad = append(bad, fmt.Sprintf("the scope holds %s: neither the old %s nor the new", got, before))
		case c.ack && !got.equal(states[len(states)-1]):
			bad = append(bad, fmt.Sprintf("acknowledged, yet the scope holds %s, not %s", got, states[len(states)-1]))
		case refused != "" && refused != "unknown_outcome" && refused != "internal" && !got.equal(before) && got.equal(states[len(states)-1]):
			// A refusal tells the model nothing changed; unknown_outcome
			// and internal tell it to re-read, the answers for a change that
			// may have happened.
			bad = append(bad, fmt.Sprintf("refused (%s), yet the change is in place: %s", refused, got))
		}
	}
	if o.held != nil {
		bad = append(bad, o.held(c, out)...)
	}
	return append(bad, c.scopeHeld()...)
}
