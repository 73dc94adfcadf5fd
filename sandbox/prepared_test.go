package sandbox

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/fusefs"
	"github.com/agentloom/loomfs/store"
	"github.com/agentloom/loomfs/tools"
)

// pooledCommands returns Commands over a fusefs projection pool for a
// fresh workspace, recording the runner's events in log, and the pool.
func pooledCommands(t *testing.T, log *eventLog, idle time.Duration) (*Commands, *store.Workspace) {
	t.Helper()
	ctx := context.Background()
	base := t.TempDir()
	if err := os.Chmod(base, 0o700); err != nil {
		t.Fatal(err)
	}
	vol, err := store.OpenVolume(ctx, store.Config{Root: filepath.Join(base, "volume")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vol.Close() })
	ws, err := vol.Open(ctx, store.Scope{Space: "s", Agent: "a", Session: "prepared"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	pool := &Pool{Dir: filepath.Join(base, "mnt"), Idle: idle, Mount: func(ctx context.Context, ws *store.Workspace, mp string, call CallInfo) (Projection, error) {
		m, err := fusefs.Mount(ctx, ws, mp, fusefs.Options{AllowOther: true, CallID: call.CallID})
		if err != nil {
			return nil, err
		}
		return servedMount{m}, nil
	}}
	cmds := &Commands{Runner: newTestRunner(t, Config{Observe: log.observe}), Pool: pool, Run: "r1"}
	t.Cleanup(func() { pool.Close() })
	return cmds, ws
}

// waitPrepared waits until the pool keeps want prepared containers.
func waitPrepared(t *testing.T, p *Pool, want int) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); p.Prepared() != want; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d prepared containers, want %d", p.Prepared(), want)
		}
	}
}

// spareOf returns the container prepared in p, for a test's look.
func spareOf(p *Pool) *Prepared {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.live {
		if l.spare != nil {
			return l.spare
		}
	}
	return nil
}

// TestPreparedContainerReused: a scope's first command prepares nothing;
// once its second is answered, a container is prepared over the kept
// projection, and the next command runs in it:
// nothing is created on its way, it carries the command exactly, its
// input is what a fresh container's is, its marker is set before its
// start, and it is removed before the answer, leaving the one prepared
// for the command after.
func TestPreparedContainerReused(t *testing.T) {
	ctx := context.Background()
	log := &eventLog{}
	cmds, ws := pooledCommands(t, log, 0)
	if res, err := cmds.RunCommand(ctx, ws, tools.CommandRequest{CallID: "c0", Command: "true"}); err != nil || res.ExitCode != 0 {
		t.Fatalf("first command: %+v, %v", res, err)
	}
	if n := cmds.Pool.Prepared(); n != 0 || slices.Contains(log.list(), "container_prepare") {
		t.Fatalf("%d containers prepared after the scope's first command", n)
	}
	if res, err := cmds.RunCommand(ctx, ws, tools.CommandRequest{CallID: "c1", Command: "true"}); err != nil || res.ExitCode != 0 {
		t.Fatalf("second command: %+v, %v", res, err)
	}
	waitPrepared(t, cmds.Pool, 1)
	spare := spareOf(cmds.Pool)
	if ok, _ := cmds.Runner.ContainerExists(ctx, spare.ID); !ok {
		t.Fatal("the prepared container is not on the engine")
	}
	before := len(log.list())

	// The command comes whole: several lines, the last without a newline,
	// backslashes, quotes, leading blanks and a trailing one.
	command := "printf '%s|' \"a\\\\b\" '  c d ' \"$0\"\n  echo 'x\ty' \\\n  done; cat; echo end "
	fresh := mustRun(t, cmds.Runner, func() Request { r, _ := newRequest(t, command); return r }())
	res, err := cmds.RunCommand(ctx, ws, tools.CommandRequest{CallID: "c2", Command: command})
	if err != nil {
		t.Fatalf("second command: %v", err)
	}
	if res.Container != spare.Name {
		t.Fatalf("the second command ran in %s, not the prepared %s", res.Container, spare.Name)
	}
	if res.Stdout != fresh.Stdout || res.Stderr != fresh.Stderr || res.ExitCode != fresh.ExitCode {
		t.Fatalf("prepared: %q %q %d; fresh: %q %q %d", res.Stdout, res.Stderr, res.ExitCode, fresh.Stdout, fresh.Stderr, fresh.ExitCode)
	}
	ops := log.list()[before:]
	var ours []string
	log.mu.Lock()
	for i, op := range ops {
		if log.detail[before+i]["container"] == spare.Name {
			ours = append(ours, op)
		}
	}
	log.mu.Unlock()
	if slices.Contains(ours, "container_create") || !slices.Equal(ours[:1], []string{"container_start"}) || ours[len(ours)-1] != "container_removed" {
		t.Fatalf("events of the prepared container's command: %v", ours)
	}
	// The marker named it and is cleared; the scope is clear.
	if m, _ := ws.QuarantineMarker(); m != nil {
		t.Fatalf("quarantined: %+v", m)
	}
	if err := ws.CheckQuarantine(); err != nil {
		t.Fatal(err)
	}
	assertGone(t, cmds.Runner, spare.ID)
	waitPrepared(t, cmds.Pool, 1)
	if next := spareOf(cmds.Pool); next == nil || next.ID == spare.ID {
		t.Fatal("no new container prepared for the third command")
	}
	// Its input is empty, as a fresh container's: /dev/null under runc
	// (gVisor names a fresh one's "host:[1]", the host's null input).
	in := "cat | wc -c"
	if !gvisor(cmds.Runner) {
		in += "; readlink /proc/self/fd/0"
	}
	want := mustRun(t, cmds.Runner, func() Request { r, _ := newRequest(t, in); return r }())
	got, err := cmds.RunCommand(ctx, ws, tools.CommandRequest{CallID: "c3", Command: in})
	if err != nil || got.Stdout != want.Stdout {
		t.Fatalf("stdin of a prepared container's command %q (%v), of a fresh one's %q", got.Stdout, err, want.Stdout)
	}
}

// TestPreparedHardening: a prepared container has the posture of a fresh
// one, on the engine, apart from the command's way in.
func TestPreparedHardening(t *testing.T) {
	ctx := context.Background()
	r := newTestRunner(t, Config{Memory: 256 << 20, PidsLimit: 100, TmpSize: 16 << 20})
	req, _ := newRequest(t, "true")
	req.Skills = map[string]string{"pdf-tools": t.TempDir()}
	p, err := r.Prepare(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Remove(ctx)
	cc, hc := r.containerConfig(req, false)
	fresh, err := r.cli.ContainerCreate(ctx, cc, hc, nil, nil, NewContainerName(req.ScopeHash))
	if err != nil {
		t.Fatal(err)
	}
	defer r.removeConfirmed(ctx, fresh.ID)
	a, err := r.cli.ContainerInspect(ctx, p.ID)
	if err != nil {
		t.Fatal(err)
	}
	b, err := r.cli.ContainerInspect(ctx, fresh.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a.HostConfig, b.HostConfig) {
		t.Errorf("host config\nprepared %+v\nfresh    %+v", a.HostConfig, b.HostConfig)
	}
	if a.HostConfig.Runtime != r.cfg.Runtime && r.cfg.Runtime != "" || a.HostConfig.NetworkMode != "none" || !a.HostConfig.ReadonlyRootfs ||
		a.HostConfig.PidsLimit == nil || *a.HostConfig.PidsLimit != 100 || a.HostConfig.Memory != 256<<20 || len(a.HostConfig.Mounts) != 2 {
		t.Errorf("prepared host config %+v", a.HostConfig)
	}
	if a.State.Status != "created" || a.State.Pid != 0 {
		t.Errorf("prepared container state %+v", a.State)
	}
	pc, fc := *a.Config, *b.Config
	if !pc.OpenStdin || !pc.StdinOnce || !pc.AttachStdin || pc.Labels[LabelPrepared] != "1" || pc.Labels[LabelCall] != "" || fc.Labels[LabelCall] != req.Call {
		t.Errorf("prepared config %+v", pc)
	}
	pc.OpenStdin, pc.StdinOnce, pc.AttachStdin = fc.OpenStdin, fc.StdinOnce, fc.AttachStdin
	pc.Entrypoint, pc.Hostname = fc.Entrypoint, fc.Hostname
	pc.Labels, fc.Labels = nil, nil
	if !reflect.DeepEqual(pc, fc) {
		t.Errorf("config\nprepared %+v\nfresh    %+v", pc, fc)
	}
}

// TestPreparedLeftByCrash: a container prepared by a process that died
// before it started it never ran: nothing of it holds the projection, no
// process of it runs, the next loomfs's sweep removes it, and it leaves
// another live process's prepared container alone.
func TestPreparedLeftByCrash(t *testing.T) {
	ctx := context.Background()
	r := newTestRunner(t, Config{})
	gone := exec.Command("sleep", "0.1")
	if err := gone.Start(); err != nil {
		t.Fatal(err)
	}
	start, ok := procStart(gone.Process.Pid)
	gone.Wait()
	if !ok {
		t.Fatal("no start time of a running process")
	}
	dead := *r
	dead.owner = Owner{PID: gone.Process.Pid, Start: start}
	req, _ := newRequest(t, "true")
	// A mount of its own on a shared bind, as a projection is: a copy a
	// runtime starting another container takes of it is then no holder.
	if err := shareMountpoint(req.Workspace); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeMountpoint(req.Workspace) })
	tmpfsAt(t, req.Workspace)
	left, err := dead.Prepare(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { left.Remove(ctx) })
	live, err := r.Prepare(ctx, func() Request { q, _ := newRequest(t, "true"); return q }())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { live.Remove(ctx) })

	info, err := r.cli.ContainerInspect(ctx, left.ID)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Running || info.State.Pid != 0 || info.State.Status != "created" {
		t.Fatalf("a prepared container left by a crash runs: %+v", info.State)
	}
	var st unix.Stat_t
	if err := unix.Stat(req.Workspace, &st); err != nil {
		t.Fatal(err)
	}
	// As release does, a process seen holding it gets holderGrace to go.
	for deadline := time.Now().Add(holderGrace); ; time.Sleep(100 * time.Millisecond) {
		held, err := Holders(req.Workspace, st.Dev, left.ID)
		if err == nil && len(held) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("holders of the workspace of a prepared container: %v, %v", held, err)
		}
	}
	swept, err := r.SweepPrepared(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, c := range swept {
		ids = append(ids, c.ID)
	}
	if !slices.Contains(ids, left.ID) || slices.Contains(ids, live.ID) {
		t.Fatalf("swept %v: want %s and not %s", ids, left.ID, live.ID)
	}
	assertGone(t, r, left.ID)
	if ok, _ := r.ContainerExists(ctx, live.ID); !ok {
		t.Fatal("the sweep removed a live process's prepared container")
	}
	// One that started (a command took it, then its owner died) is not
	// the sweep's: its scope's marker quarantines it.
	started, err := dead.Prepare(ctx, func() Request { q, _ := newRequest(t, "true"); return q }())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { started.Remove(ctx) })
	if err := r.cli.ContainerStart(ctx, started.ID, container.StartOptions{}); err != nil {
		t.Fatal(err)
	}
	swept, err = r.SweepPrepared(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range swept {
		if c.ID == started.ID {
			t.Fatal("the sweep removed a prepared container that started")
		}
	}
}

// TestPreparedGoesWithPool: the prepared container is removed when its
// projection idles out, and at Close; none is made after Close.
func TestPreparedGoesWithPool(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		idle time.Duration
	}{{"idle", 500 * time.Millisecond}, {"close", time.Hour}} {
		t.Run(tc.name, func(t *testing.T) {
			cmds, ws := pooledCommands(t, &eventLog{}, tc.idle)
			for _, id := range []string{"c0", "c1"} {
				if _, err := cmds.RunCommand(ctx, ws, tools.CommandRequest{CallID: id, Command: "true"}); err != nil {
					t.Fatal(err)
				}
			}
			if tc.name == "close" {
				// Close right after the answer waits for the preparation.
				if err := cmds.Pool.Close(); err != nil {
					t.Fatal(err)
				}
			} else {
				waitPrepared(t, cmds.Pool, 1)
				for deadline := time.Now().Add(20 * time.Second); cmds.Pool.Live() != 0; time.Sleep(10 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatal("the projection did not idle out")
					}
				}
			}
			for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				n := 0
				list, err := cmds.Runner.Containers(ctx)
				if err != nil {
					t.Fatal(err)
				}
				for _, c := range list {
					if c.ScopeHash == ws.Scope().Hash() && c.Node == testNode {
						n++
					}
				}
				if n == 0 {
					break
				}
				if tc.name == "close" || time.Now().After(deadline) {
					t.Fatalf("%d containers of the scope left after %s", n, tc.name)
				}
			}
		})
	}
}

// TestHeldAfterAnswerQuarantines: in a recently used scope the holder scan
// runs after the answer. A process that holds the projection when the
// command ends does not change the answer, but quarantines the scope
// right after, naming it, as before: the next command is refused, and no
// container is prepared over the projection, which is let go.
func TestHeldAfterAnswerQuarantines(t *testing.T) {
	ctx := context.Background()
	log := &eventLog{}
	cmds, ws := pooledCommands(t, log, 0)
	if _, err := cmds.RunCommand(ctx, ws, tools.CommandRequest{CallID: "c0", Command: "true"}); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(cmds.Pool.Dir)
	if err != nil || len(ents) != 1 {
		t.Fatalf("mountpoints %v, %v", ents, err)
	}
	holder := exec.Command("sleep", "600")
	holder.Dir = filepath.Join(cmds.Pool.Dir, ents[0].Name())
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Process.Kill(); holder.Wait() })
	res, err := cmds.RunCommand(ctx, ws, tools.CommandRequest{CallID: "c1", Command: "echo answered"})
	if err != nil || res.Stdout != "answered\n" {
		t.Fatalf("the command's answer: %+v, %v", res, err)
	}
	_, err = cmds.RunCommand(ctx, ws, tools.CommandRequest{CallID: "c2", Command: "true"})
	if err == nil || !strings.Contains(err.Error(), "quarantined") {
		t.Fatalf("the next command: %v", err)
	}
	m, err := ws.QuarantineMarker()
	if err != nil || m == nil || m.Container != res.Container || len(m.Holders) != 1 || m.Holders[0].PID != holder.Process.Pid {
		t.Fatalf("quarantine record %+v, %v", m, err)
	}
	if cmds.Pool.Prepared() != 0 || slices.Contains(log.list(), "container_prepare") {
		t.Fatalf("prepared %d, events %v", cmds.Pool.Prepared(), log.list())
	}
	if info, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(info), " "+holder.Dir+" ") {
		t.Fatal("the held projection is still mounted")
	}
	if !slices.Contains(log.list(), "projection_held") {
		t.Fatalf("no projection_held event: %v", log.list())
	}
}
