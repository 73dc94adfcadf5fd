package process

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/tools"
)

// quiet is how long output must pause before a write or read that saw new
// output answers: long enough for a REPL's answer and prompt to come
// together, short enough for a round trip to feel immediate.
const quiet = 5 * time.Millisecond

// Process is one exec in a session sandbox.
type Process struct {
	ID      string
	Command string
	TTY     bool
	CallID  string
	Started time.Time

	box    *Sandbox
	execID string
	gid    int // the group id its whole tree runs under (tree.go)
	out    *Output
	hj     types.HijackedResponse
	done   chan struct{} // closed once the exit is known

	inMu sync.Mutex // one writer to stdin at a time

	mu       sync.Mutex
	cols     int
	rows     int
	isExited bool
	code     *int
	endedAt  time.Time
	sig      string
	reason   string // why it ended, when its sandbox stopped under it
	left     *int   // processes of its tree killed when it ended
	oom      bool   // the memory limit killed it
	// tmp: the session's /tmp was full as it started, or as it ended.
	tmp     *tools.SessionTmp
	hostPid int // the exec's pid as this host sees it, for the FUSE records
}

// Record is a process's record under the scope's state directory: enough
// for any node to say who owns it, and for late readers to see its end.
type Record struct {
	ID        string     `json:"process_id"`
	Scope     string     `json:"scope"`
	Command   string     `json:"command"`
	TTY       bool       `json:"tty"`
	Cols      int        `json:"cols,omitempty"`
	Rows      int        `json:"rows,omitempty"`
	Node      string     `json:"node"`
	Container string     `json:"container"`
	ExecID    string     `json:"exec_id"`
	CallID    string     `json:"call_id"`
	Started   time.Time  `json:"started_at"`
	Status    string     `json:"status"`
	ExitCode  *int       `json:"exit_code"`
	Signal    string     `json:"signal,omitempty"`
	Ended     *time.Time `json:"ended_at,omitempty"`
	Cursor    int64      `json:"cursor"`
	Reason    string     `json:"reason,omitempty"`
	GID       int        `json:"gid,omitempty"`
	Left      *int       `json:"left_running_killed,omitempty"`
	OOMKilled bool       `json:"oom_killed,omitempty"`
}

// Info is the record as a process tool shows it.
func (r Record) Info() tools.ProcessInfo {
	return tools.ProcessInfo{ProcessID: r.ID, Command: r.Command, TTY: r.TTY, Cols: r.Cols, Rows: r.Rows, Status: r.Status,
		ExitCode: r.ExitCode, Signal: r.Signal, Node: r.Node, Container: r.Container, ExecID: r.ExecID, CallID: r.CallID,
		Started: r.Started, Ended: r.Ended, Cursor: r.Cursor, LeftRunningKilled: r.Left, OOMKilled: r.OOMKilled, Reason: r.Reason}
}

// endedOutput answers a read of a process whose output is no longer kept:
// none of it is returned, so it starts (and ends) at the record's cursor.
func (r Record) endedOutput(since int64) tools.ProcessOutput {
	out := tools.ProcessOutput{ProcessID: r.ID, Status: r.Status, ExitCode: r.ExitCode, TTY: r.TTY, Since: r.Cursor, Cursor: r.Cursor,
		Container: r.Container, LeftRunningKilled: r.Left, OOMKilled: r.OOMKilled}
	if since < r.Cursor {
		out.DroppedBytes = r.Cursor - since
	}
	return out
}

// wrapper starts the command the way workspace_command does (sh -c, umask
// 077). Its tree is found by its group id (tree.go), not by a pid, so it
// notes nothing in /tmp and starts even when /tmp is full. It makes its
// tree the memory limit's first choice (oom_score_adj may be raised
// without privilege), so the OOM killer takes a process of the agent's,
// not the session's controller, and runs it at nice 10, which no process
// of it can undo without privilege: the controller, at 0, gets the CPU it
// needs to kill a fork bomb that spins on every core it has.
func wrapper(tty bool) string {
	w := "echo 500 2>/dev/null >/proc/self/oom_score_adj; umask 077; "
	if tty {
		// An engine older than API 1.42 ignores the exec's ConsoleSize
		// and starts it on a terminal of size 0 0, set only by the
		// resize that follows the attach: the command waits for it (2 s
		// at most), so a program that reads its size at once gets it.
		w += `i=0; while [ $i -lt 100 ]; do case "$(stty size 2>/dev/null)" in [1-9]*" "[1-9]*) break;; esac; sleep 0.02; i=$((i+1)); done; `
	}
	return w + `command -v nice >/dev/null && exec nice -n 10 /bin/sh -c "$1"; exec /bin/sh -c "$1"`
}

// exec starts a process in the sandbox. The caller holds the scope lock.
func (b *Sandbox) exec(ctx context.Context, id string, req tools.ProcessStartRequest) (*Process, error) {
	if !b.alive() {
		return nil, policy.Errorf(policy.SandboxUnavailable, "%v; start the process again", errStopped)
	}
	r := b.svc.cfg.Runner
	cli := r.Engine()
	b.mu.Lock()
	gid := b.nextGID
	b.nextGID++
	b.mu.Unlock()
	p := &Process{ID: id, Command: req.Command, TTY: req.TTY, CallID: req.CallID, box: b, gid: gid,
		out: newOutput(b.output), done: make(chan struct{})}
	uid, _, _ := strings.Cut(r.User(), ":")
	opts := container.ExecOptions{
		User: fmt.Sprintf("%s:%d", uid, gid), Tty: req.TTY, AttachStdin: true, AttachStdout: true, AttachStderr: true,
		WorkingDir: "/workspace",
		Env:        []string{"HOME=/tmp", "TMPDIR=/tmp", "PYTHONDONTWRITEBYTECODE=1"},
		Cmd:        []string{"/bin/sh", "-c", wrapper(req.TTY), "sh", req.Command},
	}
	if req.TTY {
		opts.Env = append(opts.Env, "TERM=xterm-256color")
		opts.ConsoleSize = &[2]uint{uint(req.Rows), uint(req.Cols)}
		p.cols, p.rows = req.Cols, req.Rows
	}
	octx := context.WithoutCancel(ctx)
	// No host kill freezes the container until the exec has started
	// (hostPID knows its pid, or that it ended).
	b.hostKillMu.RLock()
	started := false
	defer func() {
		if !started {
			b.hostKillMu.RUnlock()
		}
	}()
	created, err := cli.ContainerExecCreate(octx, b.id, opts)
	if err != nil {
		return nil, policy.Errorf(policy.SandboxUnavailable, "create the process in the session sandbox: %s", policy.MaskHostPaths(err.Error()))
	}
	p.execID = created.ID
	p.Started = time.Now().UTC()
	// Known to the sandbox before it starts, so its first FUSE request is
	// attributed to it.
	b.mu.Lock()
	b.procs[id] = p
	b.lastUse = time.Now()
	b.mu.Unlock()
	p.hj, err = cli.ContainerExecAttach(octx, created.ID, container.ExecAttachOptions{Tty: req.TTY, ConsoleSize: opts.ConsoleSize})
	if err != nil {
		b.mu.Lock()
		delete(b.procs, id)
		b.mu.Unlock()
		return nil, policy.Errorf(policy.SandboxUnavailable, "start the process in the session sandbox: %s", policy.MaskHostPaths(err.Error()))
	}
	if req.TTY {
		// The engine may start the exec before it applies ConsoleSize:
		// set the size again now that the terminal exists.
		cli.ContainerExecResize(octx, created.ID, container.ResizeOptions{Height: uint(req.Rows), Width: uint(req.Cols)})
	}
	if err := p.save(); err != nil {
		p.hj.Close()
		return nil, err
	}
	b.record("process_start", req.CallID, 0, map[string]any{"process_id": id, "exec_id": p.execID, "command": req.Command, "tty": req.TTY})
	b.svc.wg.Add(1)
	go p.pump()
	started = true
	go func() {
		p.awaitStart() // its pid is usually known before its first FUSE request
		b.hostKillMu.RUnlock()
	}()
	return p, nil
}

// awaitStart returns once the engine says the exec has started (it has a
// pid; then hostPID knows it) or failed to, or after a few seconds. The
// engine answers the attach before it starts the exec, and reports it
// running before it has a pid.
func (p *Process) awaitStart() {
	cli := p.box.svc.cfg.Runner.Engine()
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		st, err := cli.ContainerExecInspect(ctx, p.execID)
		cancel()
		switch {
		case err != nil:
			return
		case st.Pid != 0:
			if st.Running {
				p.mu.Lock()
				p.hostPid = st.Pid
				p.mu.Unlock()
			}
			return
		case !st.Running && st.ExitCode != 0: // it could not start
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// pump copies the process's output into its buffer until the stream ends
// or the engine reports the exec ended (what the command left may hold
// the stream open), learns the exit code, then kills what the command
// left running: a process is its whole tree, and its end is reported once
// nothing of it is left.
func (p *Process) pump() {
	defer p.box.svc.wg.Done()
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		if p.TTY {
			io.Copy(p.out.writer(streamOut), p.hj.Reader)
		} else {
			stdcopy.StdCopy(p.out.writer(streamOut), p.out.writer(streamErr), p.hj.Reader)
		}
	}()
	ctx := context.Background()
	ended := false
	for wait := 250 * time.Millisecond; !ended; wait = min(2*wait, time.Second) {
		select {
		case <-copied:
			ended = true
		case <-time.After(wait):
			ended = p.execEnded(ctx)
		}
	}
	code := p.inspectExit()
	detail := map[string]any{"process_id": p.ID, "exec_id": p.execID, "exit_code": exitText(code)}
	var left *int
	var tmp *tools.SessionTmp
	oom, reason := false, ""
	if code == nil || p.box.gvisor && *code == runtimeLost {
		// The exec's end is unknown, or gVisor's exec lost its sandbox:
		// the container may have ended under it (gVisor ends the whole
		// sandbox at its pids or memory limit). Then the sandbox is
		// stopped and the next call starts a new one. The engine may be
		// told of the container's end a moment after the exec's.
		if ended, oomKilled := p.box.endedWithin(ctx, 5*time.Second); ended {
			reason, oom = p.box.died(oomKilled), oomKilled
			detail["reason"] = reason
		}
	}
	if reason == "" && p.box.alive() {
		n, err := p.box.killTree(ctx, p.gid)
		// Nothing of the tree holds the stream now; what it wrote last
		// is copied before the end is told.
		select {
		case <-copied:
		case <-time.After(2 * time.Second):
		}
		left = &n
		detail["left_running_killed"] = n
		if err != nil {
			detail["sweep_error"] = err.Error()
		}
		oom = code != nil && *code == 128+9 && p.signalled() != "KILL" && p.box.newOOMKill(ctx)
		if oom {
			detail["oom_killed"] = true
		}
		tmp = p.box.tmpUse(ctx, false)
		if tmp != nil {
			detail["session_tmp_full"] = true
		}
	}
	p.hj.Close()
	<-copied
	p.mu.Lock()
	already := p.isExited
	if !already {
		p.isExited, p.code, p.endedAt, p.left, p.oom, p.reason = true, code, time.Now().UTC(), left, oom, reason
		p.tmp = tmp
	}
	p.mu.Unlock()
	p.out.close()
	if !already {
		close(p.done)
		p.save()
		p.box.record("process_exit", p.CallID, 0, detail)
		p.box.touch()
	}
}

func (p *Process) signalled() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sig
}

// execEnded reports whether the engine says the exec ended (or can't say
// it still runs).
func (p *Process) execEnded(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := p.box.svc.cfg.Runner.Engine().ContainerExecInspect(ctx, p.execID)
	return err == nil && !st.Running || cerrdefs.IsNotFound(err)
}

// inspectExit asks the engine for the exit code, waiting briefly for the
// exec to be reported ended; nil when unknown (the container went first).
func (p *Process) inspectExit() *int {
	cli := p.box.svc.cfg.Runner.Engine()
	deadline := time.Now().Add(5 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := cli.ContainerExecInspect(ctx, p.execID)
		cancel()
		if err != nil {
			return nil
		}
		if !st.Running {
			c := st.ExitCode
			return &c
		}
		if time.Now().After(deadline) {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ended marks the process ended with its sandbox, by the memory limit
// when oom.
func (p *Process) ended(reason string, oom bool) {
	p.hj.Close()
	select {
	case <-p.done:
		return
	case <-time.After(2 * time.Second):
	}
	p.mu.Lock()
	already := p.isExited
	if !already {
		p.isExited, p.endedAt, p.reason, p.oom = true, time.Now().UTC(), reason, oom
	}
	p.mu.Unlock()
	if !already {
		p.out.close()
		close(p.done)
		p.save()
		p.box.record("process_exit", p.CallID, 0, map[string]any{"process_id": p.ID, "exec_id": p.execID, "reason": reason})
	}
}

func (p *Process) exited() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.isExited
}

// write sends input to the process's stdin.
func (p *Process) write(ctx context.Context, input, callID string) error {
	if p.exited() {
		return policy.Errorf(policy.Conflict, "process %s has exited (exit code %s); nothing reads its input", p.ID, exitText(p.exitCode()))
	}
	p.box.touch()
	p.inMu.Lock()
	defer p.inMu.Unlock()
	if _, err := io.WriteString(p.hj.Conn, input); err != nil {
		return policy.Errorf(policy.Conflict, "process %s no longer reads its input: %v", p.ID, err)
	}
	p.box.record("process_input", callID, int64(len(input)), map[string]any{"process_id": p.ID})
	return nil
}

// resize sets the terminal size of a tty process.
func (p *Process) resize(ctx context.Context, cols, rows int, callID string) error {
	if !p.TTY {
		return policy.Errorf(policy.InvalidInput, "process %s was started without tty; it has no terminal to resize", p.ID)
	}
	if p.exited() {
		return policy.Errorf(policy.Conflict, "process %s has exited", p.ID)
	}
	p.box.touch()
	err := p.box.svc.cfg.Runner.Engine().ContainerExecResize(ctx, p.execID, container.ResizeOptions{Height: uint(rows), Width: uint(cols)})
	if err != nil {
		return policy.Errorf(policy.SandboxUnavailable, "resize the terminal of process %s: %s", p.ID, policy.MaskHostPaths(err.Error()))
	}
	p.mu.Lock()
	p.cols, p.rows = cols, rows
	p.mu.Unlock()
	p.save()
	p.box.record("process_resize", callID, 0, map[string]any{"process_id": p.ID, "cols": cols, "rows": rows})
	return nil
}

// signal sends sig to every process of the process's tree, found by its
// group id however it left the command's group or session, through the
// sandbox's controller, which needs no new process (the pids limit may be
// spent). KILL stops the tree first, so none of it forks meanwhile, and
// answers once none of it is left.
func (p *Process) signal(ctx context.Context, sig, callID string) error {
	if p.exited() {
		return nil // nothing to signal; the answer says it exited
	}
	p.box.touch()
	p.mu.Lock()
	p.sig = sig
	p.mu.Unlock()
	send := func() (int, error) {
		if sig == "KILL" {
			return p.box.killTree(ctx, p.gid)
		}
		return p.box.signalTree(ctx, p.gid, sig)
	}
	n, err := send()
	// The engine reports an exec started before its first process is in
	// the sandbox (under gVisor on a loaded node, hundreds of ms later): a
	// signal that found none of a tree whose exec still runs is sent again
	// until it finds some or the exec ends, or the process would outlive
	// the KILL that answered.
	for deadline := time.Now().Add(signalSettle); err == nil && n == 0 && time.Now().Before(deadline) && !p.exited() && !p.execEnded(ctx); {
		time.Sleep(50 * time.Millisecond)
		n, err = send()
	}
	if err != nil {
		return policy.Errorf(policy.SandboxUnavailable, "signal process %s: %s; retry, or stop the session with loomfs processes stop", p.ID, policy.MaskHostPaths(err.Error()))
	}
	p.box.record("process_signal", callID, 0, map[string]any{"process_id": p.ID, "signal": sig, "processes": n})
	return nil
}

// runtimeLost is the exit code of gVisor's exec when it lost the sandbox
// it waited in ("urpc method containerManager.WaitPID failed: EOF").
const runtimeLost = 128

// signalSettle bounds how long a signal waits for the first process of a
// tree its engine says runs.
const signalSettle = 10 * time.Second

// waitExit waits up to d for the process to exit.
func (p *Process) waitExit(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
	case <-ctx.Done():
	}
}

// waitOutput waits up to d for output after since to come and pause for
// quiet, or for the process to exit.
func (p *Process) waitOutput(ctx context.Context, since int64, d time.Duration) {
	if d <= 0 {
		return
	}
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		end, changed, closed := p.out.state()
		if closed {
			<-p.done
			return
		}
		var pause <-chan time.Time
		if end > since {
			t := time.NewTimer(quiet)
			defer t.Stop()
			pause = t.C
		}
		select {
		case <-changed:
		case <-pause:
			return
		case <-p.done:
			return
		case <-deadline.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

func (p *Process) exitCode() *int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.code
}

// output is the process's state and its output after since.
func (p *Process) output(since int64, max int) tools.ProcessOutput {
	c := p.out.read(since, max)
	p.mu.Lock()
	defer p.mu.Unlock()
	o := tools.ProcessOutput{ProcessID: p.ID, Status: tools.StatusRunning, TTY: p.TTY, Output: string(c.all),
		Since: c.since, Cursor: c.cursor, DroppedBytes: c.dropped, Truncated: c.more, Container: p.box.name}
	if !p.TTY {
		o.Stdout, o.Stderr = string(c.stdout), string(c.stderr)
	}
	if p.isExited {
		o.Status, o.ExitCode, o.LeftRunningKilled, o.OOMKilled = tools.StatusExited, p.code, p.left, p.oom
	}
	o.SessionTmp = p.tmp
	return o
}

// Info describes the process as it is now.
func (p *Process) Info() tools.ProcessInfo { return p.rec().Info() }

func (p *Process) rec() Record {
	end, _, _ := p.out.state()
	p.mu.Lock()
	defer p.mu.Unlock()
	r := Record{ID: p.ID, Scope: p.box.scope.String(), Command: p.Command, TTY: p.TTY, Cols: p.cols, Rows: p.rows,
		Node: p.box.svc.Node(), Container: p.box.name, ExecID: p.execID, CallID: p.CallID, Started: p.Started,
		Status: tools.StatusRunning, Signal: p.sig, Cursor: end, Reason: p.reason, GID: p.gid, Left: p.left, OOMKilled: p.oom}
	if p.isExited {
		ended := p.endedAt
		r.Status, r.ExitCode, r.Ended = tools.StatusExited, p.code, &ended
	}
	return r
}

// save writes the process's record through the sandbox's workspace.
func (p *Process) save() error {
	if p.box.svc.writesNothing() {
		return nil
	}
	return p.box.ws.WriteProcessRecord(p.ID, p.rec())
}
