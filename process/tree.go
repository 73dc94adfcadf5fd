package process

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/tools"
)

// A process is its whole tree. Each process of a session runs under a
// group id of its own (firstGID and up, never reused in a sandbox's
// life), which everything it starts inherits and, with every capability
// dropped and no-new-privileges, can never change: a child that called
// setsid, closed its output, dropped its environment or was orphaned is
// still found by its gid in /proc. That works alike under runc and
// gVisor, which has no PR_SET_CHILD_SUBREAPER, and needs no privilege.
// The gid also keeps processes from reading each other's /proc fd and
// environ entries (ptrace access wants the same gid).
const firstGID = 200000

// controllerScript is the sandbox's controller: one long-lived exec, under
// the sandbox's own group, that reads requests on stdin and answers one
// line each on stdout. Its loop uses shell builtins only (read, kill,
// echo, test, globbing), so it forks nothing and keeps working when the
// session's pids limit is spent: that is when a KILL matters most. It
// stops each process of a tree it kills as soon as it finds it, so that a
// fork bomb spinning on the CPU slows the rest of its scan less. It
// skips the processes of its own group by the owner of their /proc
// directory before it reads any status file: gVisor renders a /proc file
// again for each read(2), and the shell reads a byte at a time (13 ms a
// file there, against 0.2 ms under runc).
//
//	signal GID SIG  sends SIG to every live process of GID: "ok N"
//	kill GID [freeze]
//	                stops, then kills every process of GID until none is
//	                left (stopped processes can't fork): "ok N", or "left N";
//	                with freeze, every process of another group is stopped
//	                first (a stat and a kill each) and continued after:
//	                then a fork bomb spinning on every CPU it has does not
//	                starve the scan, whose status reads cost 250 syscalls a
//	                process
//	census GID...   live processes per GID, and the processes of the whole
//	                sandbox: "ok TOTAL GID:N..."
//	oom             the memory cgroup's OOM kills so far: "ok N", "ok -"
//	tmp             /tmp's kilobytes used and in all, and when it is full
//	                its three largest entries: "ok USED TOTAL KB:NAME...",
//	                "ok - -"
const controllerScript = `members() {
	local d s g f v r
	m= n=0
	for d in /proc/[0-9]*; do
		[ -G "$d" ] && continue
		s= g=
		{ while read -r f v r; do case $f in State:) s=$v ;; Gid:) g=$v; break ;; esac; done; } 2>/dev/null <"$d/status"
		if [ "$g" = "$1" ] && [ "$s" != Z ]; then
			[ -n "$2" ] && kill -$2 ${d#/proc/} 2>/dev/null
			m="$m ${d#/proc/}" n=$((n+1))
		fi
	done
}
killtree() {
	local seen i new q
	seen=" " k=0 i=0
	while :; do
		members "$1" STOP
		[ $n = 0 ] && return 0
		new=0
		for q in $m; do
			case $seen in *" $q "*) ;; *) seen="$seen$q " k=$((k+1)) new=1 ;; esac
		done
		[ $new = 0 ] && for q in $m; do kill -KILL $q 2>/dev/null; done
		i=$((i+1))
		[ $i -ge 1000 ] && return 1
	done
}
each() {
	local d
	for d in /proc/[0-9]*; do [ -G "$d" ] || kill -$1 ${d#/proc/} 2>/dev/null; done
}
census() {
	local tot g d s f v w
	tot=0
	for g in "$@"; do eval "n_$g=0"; done
	for d in /proc/[0-9]*; do
		tot=$((tot+1))
		[ -G "$d" ] && continue
		s= g=
		{ while read -r f v w; do case $f in State:) s=$v ;; Gid:) g=$v; break ;; esac; done; } 2>/dev/null <"$d/status"
		[ -z "$g" ] || [ "$s" = Z ] && continue
		case " $* " in *" $g "*) eval "n_$g=\$((n_$g+1))" ;; esac
	done
	out="ok $tot"
	for g in "$@"; do eval "out=\"\$out $g:\$n_$g\""; done
	echo "$out"
}
oom() {
	local f k v
	for f in /sys/fs/cgroup/memory/memory.oom_control /sys/fs/cgroup/memory.events; do
		{ while read -r k v; do [ "$k" = oom_kill ] && { echo "ok $v"; return; }; done; } 2>/dev/null <"$f"
	done
	echo "ok -"
}
tmp() {
	local h f t u r s p out
	{ read -r h; read -r f t u r; } 2>/dev/null <<EOF
$(df -Pk /tmp 2>/dev/null)
EOF
	case $u$t in *[!0-9]*|'') echo "ok - -"; return ;; esac
	out="ok $u $t"
	# The largest entries only when it is full (98%, tmpFull).
	[ $((u*100)) -ge $((t*98)) ] || { echo "$out"; return; }
	while read -r s p; do
		[ -n "$p" ] && out="$out $s:$(printf %s "${p#/tmp/}" | tr ' \t:' '???')"
	done <<EOF
$(du -sk /tmp/* /tmp/.[!.]* 2>/dev/null | sort -rn | head -n 3)
EOF
	echo "$out"
}
echo ready
while read -r c a b; do
	case $c in
	signal) members "$a" "$b"; echo "ok $n" ;;
	kill)
		[ "$b" = freeze ] && each STOP
		if killtree "$a"; then r="ok $k"; else r="left $k"; fi
		[ "$b" = freeze ] && each CONT
		echo "$r" ;;
	census) census $a $b ;;
	oom) oom ;;
	tmp) tmp ;;
	*) echo "err $c" ;;
	esac
done`

// controller is the Go side of controllerScript.
type controller struct {
	mu    sync.Mutex // one request at a time
	hj    types.HijackedResponse
	lines *bufio.Reader
	dead  bool
}

// errControllerGone says the controller no longer answers; the sandbox
// starts another at the next request.
var errControllerGone = errors.New("the session sandbox's controller stopped answering")

// startController starts the controller in the sandbox's container.
func (b *Sandbox) startController(ctx context.Context) (*controller, error) {
	// Not in a frozen container (exec): until it says it is ready.
	b.hostKillMu.RLock()
	defer b.hostKillMu.RUnlock()
	r := b.svc.cfg.Runner
	cli := r.Engine()
	octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	created, err := cli.ContainerExecCreate(octx, b.id, container.ExecOptions{
		User: r.User(), AttachStdin: true, AttachStdout: true, AttachStderr: true,
		Cmd: []string{"/bin/sh", "-c", controllerScript},
	})
	if err != nil {
		return nil, fmt.Errorf("create the controller: %w", err)
	}
	hj, err := cli.ContainerExecAttach(context.WithoutCancel(ctx), created.ID, container.ExecAttachOptions{})
	if err != nil {
		return nil, fmt.Errorf("start the controller: %w", err)
	}
	pr, pw := io.Pipe()
	go func() {
		_, err := stdcopy.StdCopy(pw, io.Discard, hj.Reader)
		pw.CloseWithError(err)
	}()
	c := &controller{hj: hj, lines: bufio.NewReader(pr)}
	line, err := c.readLine(octx)
	if err != nil || line != "ready" {
		hj.Close()
		return nil, fmt.Errorf("the controller did not start (%q): %v", line, err)
	}
	return c, nil
}

// readLine reads one answer line, giving up when ctx ends.
func (c *controller) readLine(ctx context.Context) (string, error) {
	type answer struct {
		line string
		err  error
	}
	got := make(chan answer, 1)
	go func() {
		l, err := c.lines.ReadString('\n')
		got <- answer{strings.TrimRight(l, "\r\n"), err}
	}()
	select {
	case a := <-got:
		if a.err != nil {
			return a.line, a.err
		}
		return a.line, nil
	case <-ctx.Done():
		c.hj.Close() // unblocks the read
		return "", ctx.Err()
	}
}

// ask sends one request and returns the answer's fields after "ok".
func (c *controller) ask(ctx context.Context, req string) ([]string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.askLocked(ctx, req)
}

// askLocked is ask for a caller that holds c.mu.
func (c *controller) askLocked(ctx context.Context, req string) ([]string, error) {
	if c.dead {
		return nil, errControllerGone
	}
	if _, err := io.WriteString(c.hj.Conn, req+"\n"); err != nil {
		c.dead = true
		return nil, fmt.Errorf("%w: %v", errControllerGone, err)
	}
	line, err := c.readLine(ctx)
	if err != nil {
		c.dead = true
		c.hj.Close()
		return nil, fmt.Errorf("%w: %v", errControllerGone, err)
	}
	f := strings.Fields(line)
	switch {
	case len(f) > 0 && f[0] == "ok":
		return f[1:], nil
	case len(f) == 2 && f[0] == "left":
		return f[1:], errLeft
	}
	return nil, fmt.Errorf("the controller answered %q to %q", line, req)
}

func (c *controller) close() {
	c.mu.Lock()
	c.dead = true
	c.mu.Unlock()
	c.hj.Close()
}

// errLeft: processes of a tree were still alive after the kill's passes.
var errLeft = errors.New("some of its processes could not be killed")

// ctl returns the sandbox's controller, starting one if there is none or
// the last one stopped answering (a process of the session may kill it: it
// runs as the same user).
func (b *Sandbox) ctl(ctx context.Context) (*controller, error) {
	b.ctlMu.Lock()
	defer b.ctlMu.Unlock()
	if b.control != nil && !b.control.isDead() {
		return b.control, nil
	}
	if b.control != nil {
		b.control.close()
	}
	c, err := b.startController(ctx)
	if err != nil {
		return nil, err
	}
	b.control = c
	return c, nil
}

func (c *controller) isDead() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dead
}

// ask sends req to the controller, once more to a new controller if the
// one it had stopped answering.
func (b *Sandbox) ask(ctx context.Context, req string) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	for attempt := 0; ; attempt++ {
		c, err := b.ctl(ctx)
		if err != nil {
			return nil, err
		}
		f, err := c.ask(ctx, req)
		if errors.Is(err, errControllerGone) && attempt == 0 {
			continue
		}
		return f, err
	}
}

// askIdle sends req to the controller only if one is up and free now, and
// reports whether it answered: for what an answer can go without, which
// must never wait behind a kill of a fork bomb's tree (a start right after
// one is what heals the session).
func (b *Sandbox) askIdle(ctx context.Context, req string) ([]string, bool) {
	if !b.ctlMu.TryLock() {
		return nil, false
	}
	c := b.control
	b.ctlMu.Unlock()
	if c == nil || !c.mu.TryLock() {
		return nil, false
	}
	defer c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	f, err := c.askLocked(ctx, req)
	return f, err == nil
}

// killTree kills every process of gid and returns how many there were:
// from the host where it can (hostKillTree: the container frozen while
// the tree is found, which a fork bomb spinning on every CPU it has can't
// slow), else through the controller. When the pids limit is spent (a fork
// bomb, most likely spinning), the controller stops the session's other
// processes for the scan's while and continues them after it: under runc
// that takes the kill of 250 spinning processes from 6-16 s to well under
// one on a quiet node, but not on a loaded one, where the controller gets
// a 250th of the container's share of the CPU.
func (b *Sandbox) killTree(ctx context.Context, gid int) (int, error) {
	if !b.gvisor {
		b.hostKillMu.Lock()
		n, err := hostKillTree(ctx, b.id, gid)
		b.hostKillMu.Unlock()
		if !errors.Is(err, errNoHostKill) {
			return n, err
		}
	}
	req := fmt.Sprintf("kill %d", gid)
	if used, ok := hostPids(b.id); ok && !b.gvisor && used+pidsReserve > b.pidsLimit {
		req += " freeze"
	}
	f, err := b.ask(ctx, req)
	n := 0
	if len(f) > 0 {
		n, _ = strconv.Atoi(f[0])
	}
	return n, err
}

// signalTree sends sig to every process of gid and returns how many got it.
func (b *Sandbox) signalTree(ctx context.Context, gid int, sig string) (int, error) {
	f, err := b.ask(ctx, fmt.Sprintf("signal %d %s", gid, sig))
	if err != nil {
		return 0, err
	}
	n := 0
	if len(f) > 0 {
		n, _ = strconv.Atoi(f[0])
	}
	return n, nil
}

// census returns the processes of the whole sandbox and of each gid.
func (b *Sandbox) census(ctx context.Context, gids []int) (int, map[int]int, error) {
	req := "census"
	for _, g := range gids {
		req += " " + strconv.Itoa(g)
	}
	f, err := b.ask(ctx, req)
	if err != nil {
		return 0, nil, err
	}
	if len(f) == 0 {
		return 0, nil, fmt.Errorf("census: empty answer")
	}
	total, _ := strconv.Atoi(f[0])
	out := make(map[int]int, len(gids))
	for _, e := range f[1:] {
		g, n, ok := strings.Cut(e, ":")
		if !ok {
			continue
		}
		gid, _ := strconv.Atoi(g)
		out[gid], _ = strconv.Atoi(n)
	}
	return total, out, nil
}

// oomKills returns the OOM kills the container's memory cgroup counted,
// or -1 where the runtime does not show them (gVisor: there the whole
// sandbox ends when its memory runs out).
func (b *Sandbox) oomKills(ctx context.Context) int {
	f, err := b.ask(ctx, "oom")
	if err != nil || len(f) == 0 {
		return -1
	}
	n, err := strconv.Atoi(f[0])
	if err != nil {
		return -1
	}
	return n
}

// tmpFull is how full the session's /tmp must be for an answer to say so:
// a program that writes there then fails for want of room.
const tmpFull = 0.98

// tmpUse asks the controller how full the session's /tmp is; nil when it
// is not full (or can't be told: a tmpfs of another shape, no df). With
// idle it asks only a controller free now (askIdle), and tells nothing
// otherwise.
func (b *Sandbox) tmpUse(ctx context.Context, idle bool) *tools.SessionTmp {
	t := b.readTmp(ctx, idle)
	b.tmpWasFull.Store(t != nil)
	return t
}

func (b *Sandbox) readTmp(ctx context.Context, idle bool) *tools.SessionTmp {
	var f []string
	if idle {
		var ok bool
		if f, ok = b.askIdle(ctx, "tmp"); !ok {
			return nil
		}
	} else {
		var err error
		if f, err = b.ask(ctx, "tmp"); err != nil {
			return nil
		}
	}
	if len(f) < 2 {
		return nil
	}
	used, err1 := strconv.ParseInt(f[0], 10, 64)
	total, err2 := strconv.ParseInt(f[1], 10, 64)
	if err1 != nil || err2 != nil || total <= 0 || float64(used) < tmpFull*float64(total) {
		return nil
	}
	t := &tools.SessionTmp{Code: string(policy.SessionExhausted), UsedBytes: used << 10, LimitBytes: total << 10}
	var largest []string
	for _, e := range f[2:] {
		kb, name, ok := strings.Cut(e, ":")
		n, err := strconv.ParseInt(kb, 10, 64)
		if !ok || err != nil || name == ".loomfs" {
			continue
		}
		t.Largest = append(t.Largest, tools.TmpEntry{Path: "/tmp/" + name, Bytes: n << 10})
		largest = append(largest, fmt.Sprintf("/tmp/%s (%s)", name, mib(n<<10)))
	}
	t.Message = fmt.Sprintf("the session's /tmp is full (%s of %s): a program that writes there fails with \"No space left on device\"", mib(t.UsedBytes), mib(t.LimitBytes))
	if len(largest) > 0 {
		t.Message += "; the largest there: " + strings.Join(largest, ", ")
	}
	t.Message += ". Delete what you no longer need there (rm) with workspace_process_start, which still starts, or write into the workspace instead"
	return t
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// pidsReserve is what a process start needs of the pids limit: the exec
// itself, the shell that runs the command and the command's first child.
const pidsReserve = 4

// checkRoom refuses a process start while the sandbox's pids limit is
// spent, naming the limit and the processes that hold it, so that the
// model ends those (or waits for them) instead of starting more; the
// answer comes without trying, which would only fail with "can't fork".
//
// The count is the container's pids cgroup as the host sees it, read from
// its file (the engine's stats take 0.1 to 1 s), or else the controller's
// count of processes. Under gVisor the container's pids limit bounds the
// sandbox kernel's host threads, not the processes in it, and a tree that
// outgrows it ends the whole sandbox (Service.start then starts a new
// one): nothing is counted there.
func (b *Sandbox) checkRoom(ctx context.Context) error {
	if b.gvisor || b.pidsLimit <= 0 {
		return nil
	}
	used, ok := hostPids(b.id)
	if !ok {
		total, _, err := b.census(ctx, nil)
		if err != nil {
			return nil // nothing known to be spent: the start says what fails
		}
		used = int64(total)
	}
	if used+pidsReserve <= b.pidsLimit {
		return nil
	}
	return policy.Errorf(policy.SessionExhausted, "the session sandbox is at its pids limit (%d of %d processes and threads in use)%s; nothing was started. End the process that holds them with workspace_process_signal KILL (it reaches its whole tree) or wait for it to end, then start again", used, b.pidsLimit, b.holders())
}

// holders names the running processes with the most processes, most
// first: ": p-1 (`cmd`) holds 250, p-2 …", counted from the host; ""
// where the host does not see the container's processes (the message
// then names the limit only).
func (b *Sandbox) holders() string {
	b.mu.Lock()
	procs := make([]*Process, 0, len(b.procs))
	for _, p := range b.procs {
		if !p.exited() {
			procs = append(procs, p)
		}
	}
	b.mu.Unlock()
	held, ok := hostGroups(b.id)
	if !ok || len(procs) == 0 {
		return ""
	}
	sort.Slice(procs, func(i, j int) bool { return held[procs[i].gid] > held[procs[j].gid] })
	var parts []string
	for _, p := range procs {
		if n := held[p.gid]; n > 0 && len(parts) < 3 {
			parts = append(parts, fmt.Sprintf("%s (`%s`) holds %d", p.ID, shorten(p.Command, 60), n))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return ": " + strings.Join(parts, ", ")
}

// shorten cuts s to at most n bytes, marking the cut.
func shorten(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
