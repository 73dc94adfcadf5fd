package process

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/agentloom/loomfs/audit"
)

// attributing passes a session projection's FUSE records on to the
// scope's log with the process id of the exec whose process (or
// descendant) made the request: the kernel gives the FUSE door the
// caller's pid, and the engine the host pid of each exec. Under a runtime
// whose processes the host does not see as its own (gVisor), no record is
// attributed.
type attributing struct {
	audit.Sink
	box *Sandbox
}

func (a attributing) Record(ctx context.Context, e audit.Event) error {
	if pid, ok := e.Detail["pid"].(uint32); ok {
		if id := a.box.processOf(int(pid)); id != "" {
			d := make(map[string]any, len(e.Detail)+1)
			for k, v := range e.Detail {
				d[k] = v
			}
			d["process_id"] = id
			e.Detail = d
		}
	}
	return a.Sink.Record(ctx, e)
}

// processOf returns the id of the running process whose exec is pid or an
// ancestor of pid.
func (b *Sandbox) processOf(pid int) string {
	b.mu.Lock()
	procs := make([]*Process, 0, len(b.procs))
	for _, p := range b.procs {
		procs = append(procs, p)
	}
	b.mu.Unlock()
	byPid := make(map[int]string, len(procs))
	for _, p := range procs {
		if pid := p.hostPID(); pid > 0 && !p.exited() {
			byPid[pid] = p.ID
		}
	}
	if len(byPid) == 0 {
		return ""
	}
	for i := 0; i < 64 && pid > 1; i++ {
		if id, ok := byPid[pid]; ok {
			return id
		}
		pid = parentOf(pid)
	}
	return ""
}

// parentOf reads a process's parent pid from /proc; 0 when it is gone.
func parentOf(pid int) int {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name may hold spaces and parentheses: fields start after the last ')'.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// hostPID returns the exec's host pid, asking the engine until it knows
// it: the engine reports an exec running a few milliseconds before it
// reports its pid. A process's first FUSE request may wait that long.
func (p *Process) hostPID() int {
	p.mu.Lock()
	pid := p.hostPid
	p.mu.Unlock()
	if pid != 0 {
		return pid
	}
	cli := p.box.svc.cfg.Runner.Engine()
	for i := 0; i < 25; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		st, err := cli.ContainerExecInspect(ctx, p.execID)
		cancel()
		if err != nil || !st.Running {
			return 0
		}
		if st.Pid != 0 {
			p.mu.Lock()
			p.hostPid = st.Pid
			p.mu.Unlock()
			return st.Pid
		}
		time.Sleep(10 * time.Millisecond)
	}
	return 0
}
