package faults

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// dockerUp reports whether a Docker engine answers: the sandbox door's
// operations run only then.
func dockerUp() bool {
	return exec.Command("docker", "info").Run() == nil
}

// projections are the mount points under the node's mount directory now.
func projections() map[string]bool {
	m := map[string]bool{}
	b, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(unescapeMount(f[4]), "/run/loomfs/mnt/") {
			m[unescapeMount(f[4])] = true
		}
	}
	return m
}

// dead reports whether the mount at dir no longer has a daemon: its
// statfs (which the kernel never answers from its cache, as it may a
// stat) answers ENOTCONN, or nothing within two seconds (a daemon stuck in
// its own mount; the call is then left waiting).
func dead(dir string) bool {
	err, hung := within(2*time.Second, func() error {
		var st syscall.Statfs_t
		return syscall.Statfs(dir, &st)
	})
	return hung || errors.Is(err, syscall.ENOTCONN) || errors.Is(err, syscall.ECONNABORTED)
}

// containers are the names of the containers the engine has for the scope.
func containers() []string {
	out, _ := exec.Command("docker", "ps", "-a", "--filter", "label=io.loomfs.scope="+scope, "--format", "{{.Names}}").Output()
	return strings.Fields(string(out))
}

// sandboxOp runs one command in a sandbox container over the scope's
// projection (loomfs run): the start of a sandbox, its mount and its
// marker. A process killed on the way may leave the scope quarantined (by
// design: its container's removal was never confirmed); the check then
// follows the documented recovery and needs it to work.
func sandboxOp() op {
	var before map[string]bool
	return op{
		door: "sandbox", name: "run",
		sample: 12, // a start makes hundreds of openat calls, at a second or two a cell
		setup: func(c *cell) tree {
			before = projections()
			for _, n := range containers() {
				exec.Command("docker", "rm", "-f", n).Run() // left by an earlier cell
			}
			return seed(c, map[string]string{"x.txt": oldText})
		},
		do: func(c *cell) outcome {
			o := run(c.traced("run", "--scope", scope, "--timeout", "30", "--", "sh", "-c", "cat x.txt > out.txt"), "", 2*time.Minute)
			c.ack = o.exit == 0
			return o
		},
		after: func(c *cell, b tree) []tree {
			return []tree{b, with(b, map[string]string{"out.txt": ""}), with(b, map[string]string{"out.txt": oldText})}
		},
		held: func(c *cell, o outcome) []string {
			var bad []string
			if !c.ack && o.signal == "" && !o.hung && strings.TrimSpace(o.stderr+o.stdout) == "" && !c.outputLost() {
				bad = append(bad, "the command failed without a message: "+o.String())
			}
			// A quarantine is recovered as the operator's procedure says:
			// one already recorded, and one the next command records when
			// it finds the marker of a worker that was killed (SPEC §5: a
			// dead worker quarantines the scope).
			recoverQuarantine := func() {
				q := run(c.plain("--json", "quarantine", "show", "--scope", scope), "", time.Minute)
				var m struct {
					Container string `json:"container_name"`
				}
				if json.Unmarshal([]byte(q.stdout), &m) == nil && m.Container != "" {
					exec.Command("docker", "rm", "-f", m.Container).Run()
					if r := run(c.plain("quarantine", "clear", "--scope", scope, "--container", m.Container), "", time.Minute); r.exit != 0 {
						bad = append(bad, "quarantine clear after the documented steps: "+r.String())
					}
				}
			}
			recoverQuarantine()
			if n := containers(); len(n) > 0 {
				bad = append(bad, fmt.Sprintf("containers left: %v", n))
				for _, name := range n {
					exec.Command("docker", "rm", "-f", name).Run()
				}
			}
			// The next start on the scope works, and leaves nothing.
			next := func() outcome {
				return run(c.plain("run", "--scope", scope, "--timeout", "30", "--", "true"), "", 2*time.Minute)
			}
			r := next()
			if r.exit != 0 && o.signal != "" && strings.Contains(r.stdout+r.stderr, "quarantined") {
				recoverQuarantine()
				r = next()
			}
			if r.exit != 0 {
				bad = append(bad, "the next command on the scope: "+r.String())
			}
			for p := range projections() {
				if !before[p] && dead(p) {
					bad = append(bad, "a dead projection is left under the mount directory: "+filepath.Base(p))
					conn := connection(p) // new since the cell began: this cell's
					detach(p)
					abort(conn)
				}
			}
			c.tool("workspace_delete", map[string]any{"path": "out.txt"})
			return bad
		},
	}
}
