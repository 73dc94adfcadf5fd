package sandbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"
)

// ExecRequest is one workspace_command run as an exec in a container that
// is already running: a scope's session sandbox ("commands: session").
type ExecRequest struct {
	Container string        // the running container's id
	Name      string        // its name, for the result
	ID        string        // names the command's pid file; letters, digits and '-'
	Command   string        // run by sh -c with umask 077 in /workspace, as Run does
	Timeout   time.Duration // 0 means DefaultTimeout; else MinTimeout..MaxTimeout
	// Record, if set, is told of exec_start, exec_exit and exec_kill, for
	// the audit log.
	Record func(op string, detail map[string]any)
}

// ErrLeftRunning marks an exec whose processes could not be confirmed
// gone after its end or its kill: the container can no longer be trusted
// to hold nothing of it, and its owner stops it (with confirmed removal,
// or quarantine).
var ErrLeftRunning = errors.New("sandbox: the command's processes could not be confirmed gone")

// sweep is the shell code that kills a command's processes. The engine
// starts every exec as the leader of a session of its own (runc and runsc
// alike), and what the command starts stays in that session unless it
// makes a new one. k SID SKIP sends $sig to each live process of session
// SID but SKIP and reports whether it found one. h kills each process but
// this shell that holds the command's stdout or stderr open ($o1, $o2: the
// exec's pipes, pipe:[inode], or host:[fd] under gVisor, naming the
// sentry's host fd), whatever its session: the engine would otherwise end
// the exec's output 2 s after the exec, with that process still running.
// h's pipeline runs with its output on /dev/null, so that none of its own
// processes holds the pipes it looks for. e kills each process but this
// shell whose environment has the command's commandVar ($id): what
// inherited it from the command, even in a session of its own with its
// output closed (a daemon). gone repeats all three until none finds
// anything, for at most about 5 s. Only a process that left the command's
// session, closed its output and dropped that variable escapes them.
const sweep = `sig=KILL
k() { f=1; for d in /proc/[0-9]*; do q=${d#/proc/}; [ "$q" = "$2" ] && continue; read -r s 2>/dev/null <"$d/stat" || continue; set -- "$1" "$2" ${s##*") "}; if [ "$3" != Z ] && [ "$6" = "$1" ]; then kill -$sig "$q" 2>/dev/null; f=0; fi; done; return $f; }
h() { { ls -l /proc/[0-9]*/fd/1 /proc/[0-9]*/fd/2 | { f=1; while read -r l; do case $l in *" -> $o1" | *" -> $o2") q=${l#*/proc/}; q=${q%%/*}; [ "$q" != $$ ] && kill -9 "$q" && f=0 ;; esac; done; exit $f; }; } >/dev/null 2>&1; }
e() { f=1; for l in $(env -u ` + commandVar + ` grep -l -s "` + commandVar + `=$id" /proc/[0-9]*/environ); do q=${l#/proc/}; q=${q%%/*}; [ "$q" != $$ ] && kill -9 "$q" 2>/dev/null && f=0; done; return $f; }
gone() { i=0; while k "$1" "$2" || h || e; do i=$((i+1)); [ $i -ge 500 ] && return 1; sleep 0.01; done; }
pipes() { case $o1 in pipe:* | host:*) ;; *) o1=none: ;; esac; case $o2 in pipe:* | host:*) ;; *) o2=none: ;; esac; }
`

// execWrapper runs the command as a child and, once it exits, kills what
// it left running before the exec itself exits with the command's status:
// nothing of a command outlives its call, as in a fresh container whose
// teardown ends everything. It notes its pid and its output pipes for a
// kill from outside; the next command's wrapper removes what a killed one
// left of those notes (a scope's commands take turns).
func execWrapper(id string) string {
	f := "/tmp/.loomfs/" + id
	return "id=" + id + "\n" + sweep + `mkdir -p /tmp/.loomfs && rm -f /tmp/.loomfs/c-*
o1=$(readlink /proc/$$/fd/1) o2=$(readlink /proc/$$/fd/2); pipes
echo $$ > ` + f + `.pid && echo "$o1 $o2" > ` + f + `.out
umask 077
/bin/sh -c "$1"
c=$?
gone $$ $$ || echo "loomfs: processes the command left running could not be killed" >&2
rm -f ` + f + `.pid ` + f + `.out
exit $c`
}

// execKill kills the command's whole session, the wrapper with it, and
// every process that holds its output open, and exits 0 only once none of
// them is left; 3 when the command left no note of itself (it ended). The
// session is stopped first, so that no shell of it sees a child killed
// and says so on stderr.
func execKill(id string) string {
	f := "/tmp/.loomfs/" + id
	return "id=" + id + "\n" + sweep + `read -r o1 o2 2>/dev/null < ` + f + `.out || exit 3
pipes; p=$(cat ` + f + `.pid 2>/dev/null)
[ -n "$p" ] && sig=STOP && k "$p" -; sig=KILL
gone "${p:-none}" - || exit 1
rm -f ` + f + `.pid ` + f + `.out`
}

// Exec runs req.Command as an exec in the running container req.Container,
// with the same environment, user, working directory, output caps and
// timeout as Run. At timeout, or when ctx ends, the command's processes are
// killed from a second exec, which confirms they are gone. A non-zero exit
// or a timeout is a result; ErrLeftRunning says the container may still
// run some of the command, and a cancelled ctx returns the partial Result
// and an error wrapping ctx's error.
func (r *Runner) Exec(ctx context.Context, req ExecRequest) (Result, error) {
	timeout, err := checkCommand(req.Command, req.Timeout)
	if err != nil {
		return Result{}, err
	}
	if !validName(req.ID, 64) || req.Container == "" {
		return Result{}, fmt.Errorf("%w: exec id %q in container %q", ErrInvalidRequest, req.ID, req.Container)
	}
	if err := ctx.Err(); err != nil {
		return Result{}, fmt.Errorf("sandbox: %w", err)
	}
	record := req.Record
	if record == nil {
		record = func(string, map[string]any) {}
	}
	began := time.Now()
	res := Result{ExitCode: -1, ContainerName: req.Name, ContainerID: req.Container}
	octx := context.WithoutCancel(ctx)
	cctx, cancel := context.WithTimeout(octx, engineTimeout)
	created, err := r.cli.ContainerExecCreate(cctx, req.Container, container.ExecOptions{
		User: r.cfg.User, AttachStdout: true, AttachStderr: true, WorkingDir: "/workspace",
		Env: append([]string{commandVar + "=" + req.ID}, commandEnv...), Cmd: []string{"/bin/sh", "-c", execWrapper(req.ID), "sh", req.Command},
	})
	cancel()
	if err != nil {
		return res, fmt.Errorf("sandbox: create the command in %s: %w", req.Name, err)
	}
	// Attaching starts the exec; it runs to its end even if ctx ends, so
	// the kill below is what ends it early.
	hj, err := r.cli.ContainerExecAttach(octx, created.ID, container.ExecAttachOptions{})
	if err != nil {
		return res, fmt.Errorf("sandbox: start the command in %s: %w", req.Name, err)
	}
	defer hj.Close()
	record("exec_start", map[string]any{"exec_id": created.ID, "timeout_ms": timeout.Milliseconds()})
	stdout, stderr := newCapture(r.cfg.OutputLimit), newCapture(r.cfg.OutputLimit)
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		stdcopy.StdCopy(stdout, stderr, hj.Reader) // ends when every holder of the exec's stdio closed it
	}()

	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var reason string
	select {
	case <-copied:
	case <-r.execEnded(octx, created.ID, copied):
		// The wrapper exited, yet something still holds the output,
		// which its sweep should have killed. Kill it from outside
		// before the engine gives up on the stream (2 s after the exec).
		select {
		case <-copied:
		case <-time.After(500 * time.Millisecond):
			reason = "output_held"
		}
	case <-timer.C:
		res.TimedOut, reason = true, "timeout"
	case <-ctx.Done():
		res.Cancelled, reason = true, "cancelled"
	}
	var left error
	if reason != "" {
		kerr := r.execKill(octx, req, created.ID)
		detail := map[string]any{"exec_id": created.ID, "reason": reason}
		if kerr != nil {
			detail["error"] = kerr.Error()
			left = fmt.Errorf("%w: %v", ErrLeftRunning, kerr)
		}
		record("exec_kill", detail)
		select {
		case <-copied:
		case <-time.After(2 * time.Second):
			if left == nil {
				left = fmt.Errorf("%w: its output is still held open", ErrLeftRunning)
			}
			hj.Close()
			<-copied
		}
	}
	res.Stdout, res.StdoutTruncated = stdout.result()
	res.Stderr, res.StderrTruncated = stderr.result()
	if code, ok := r.execExit(octx, created.ID); ok {
		res.ExitCode = code
	}
	record("exec_exit", map[string]any{"exec_id": created.ID, "exit_code": res.ExitCode})
	res.Duration = time.Since(began)
	switch {
	case left != nil:
		return res, left
	case res.Cancelled:
		return res, fmt.Errorf("sandbox: command cancelled: %w", context.Cause(ctx))
	}
	return res, nil
}

// commandVar, in an exec'd command's environment, names the command, so
// that what it leaves running is found by what it inherited.
const commandVar = "LOOMFS_COMMAND_ID"

// commandEnv is the environment of every command, fresh or exec'd.
var commandEnv = []string{"HOME=/tmp", "TMPDIR=/tmp", "PYTHONDONTWRITEBYTECODE=1"}

// execEnded is closed once the engine reports the exec ended, in case its
// output stream does not end with it; it stops asking once done is closed.
func (r *Runner) execEnded(ctx context.Context, execID string, done <-chan struct{}) <-chan struct{} {
	ended := make(chan struct{})
	go func() {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
			st, err := r.cli.ContainerExecInspect(ictx, execID)
			cancel()
			if err == nil && !st.Running {
				close(ended)
				return
			}
		}
	}()
	return ended
}

// execExit returns the exec's exit code once the engine reports it ended,
// waiting briefly for that.
func (r *Runner) execExit(ctx context.Context, execID string) (int, bool) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
		st, err := r.cli.ContainerExecInspect(ictx, execID)
		cancel()
		if err != nil {
			return 0, false
		}
		if !st.Running {
			return st.ExitCode, true
		}
		if time.Now().After(deadline) {
			return 0, false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// execKill kills the command's session from a second exec and waits for
// its answer: nil only when none of the session is left.
func (r *Runner) execKill(ctx context.Context, req ExecRequest, execID string) error {
	ctx, cancel := context.WithTimeout(ctx, engineTimeout)
	defer cancel()
	var last error
	for attempt := 0; attempt < 3; attempt++ {
		created, err := r.cli.ContainerExecCreate(ctx, req.Container, container.ExecOptions{
			User: r.cfg.User, AttachStdout: true, AttachStderr: true, Cmd: []string{"/bin/sh", "-c", execKill(req.ID)},
		})
		if err != nil {
			return fmt.Errorf("create the kill: %w", err)
		}
		hj, err := r.cli.ContainerExecAttach(ctx, created.ID, container.ExecAttachOptions{})
		if err != nil {
			return fmt.Errorf("start the kill: %w", err)
		}
		var msg strings.Builder
		stdcopy.StdCopy(&msg, &msg, hj.Reader)
		hj.Close()
		code, ok := r.execExit(ctx, created.ID)
		switch {
		case !ok:
			return errors.New("the kill's end was not reported")
		case code == 0:
			return nil
		case code == 3:
			// No pid file: the wrapper ended (and swept) meanwhile, or
			// has not got that far yet.
			if st, err := r.cli.ContainerExecInspect(ctx, execID); err == nil && !st.Running {
				return nil
			}
			last = errors.New("the command's pid was never noted")
			time.Sleep(50 * time.Millisecond)
			continue
		}
		return fmt.Errorf("the kill exited %d: %s", code, strings.TrimSpace(msg.String()))
	}
	return last
}

// checkCommand validates a command and returns its effective timeout.
func checkCommand(command string, timeout time.Duration) (time.Duration, error) {
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	if timeout < MinTimeout || timeout > MaxTimeout {
		return 0, fmt.Errorf("%w: timeout %v is outside the allowed %v to %v", ErrInvalidRequest, timeout, MinTimeout, MaxTimeout)
	}
	if strings.TrimSpace(command) == "" {
		return 0, fmt.Errorf("%w: empty command", ErrInvalidRequest)
	}
	if strings.ContainsRune(command, 0) {
		return 0, fmt.Errorf("%w: command contains a NUL byte", ErrInvalidRequest)
	}
	return timeout, nil
}
