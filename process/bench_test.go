package process

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/agentloom/loomfs/fusefs"
	"github.com/agentloom/loomfs/sandbox"
	"github.com/agentloom/loomfs/store"
	"github.com/agentloom/loomfs/tools"
)

// The figures of BENCHMARKS.md "Process sessions" (bench/processes.sh).

// latencies reports the p50 and p90 of what each iteration took.
type latencies []time.Duration

func (l latencies) report(b *testing.B) {
	sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
	if len(l) == 0 {
		return
	}
	b.ReportMetric(float64(l[len(l)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(l[len(l)*9/10].Microseconds())/1000, "p90-ms")
}

// BenchmarkProcessStartWarm: workspace_process_start of true, the session
// sandbox already running, through the tool door.
func BenchmarkProcessStartWarm(b *testing.B) {
	e := newEnv(b, "", testNode, "acme/coder/bench-warm", "")
	e.startRaw(`{"command":"true","yield_ms":10000}`) // warms the sandbox
	var l latencies
	for b.Loop() {
		t0 := time.Now()
		out := e.startRaw(`{"command":"true","yield_ms":10000}`)
		l = append(l, time.Since(t0))
		if out.Status != tools.StatusExited {
			b.Fatalf("true did not exit within yield: %+v", out)
		}
	}
	l.report(b)
}

// BenchmarkCommandOneShot: today's workspace_command true through the
// tool door: a container per call, over a projection the session's pool
// keeps mounted from one command to the next (as loom wires it).
func BenchmarkCommandOneShot(b *testing.B) {
	e := newEnv(b, "", testNode, "acme/coder/bench-oneshot", "")
	pool := &sandbox.Pool{Dir: e.svc.cfg.MountDir,
		Mount: func(ctx context.Context, ws *store.Workspace, mp string, call sandbox.CallInfo) (sandbox.Projection, error) {
			m, err := fusefs.Mount(ctx, ws, mp, fusefs.Options{AllowOther: true, CallID: call.CallID})
			if err != nil {
				return nil, err
			}
			return pooled{m}, nil
		}}
	b.Cleanup(func() { pool.Close() })
	e.tb.Commands = &sandbox.Commands{Runner: e.svc.cfg.Runner, Pool: pool}
	var l latencies
	for b.Loop() {
		t0 := time.Now()
		res, err := e.tb.Call(context.Background(), tools.Command, "", []byte(`{"command":"true"}`))
		l = append(l, time.Since(t0))
		if err != nil || !strings.Contains(string(res), `"exit_code":0`) {
			b.Fatalf("workspace_command true: %s %v", res, err)
		}
	}
	l.report(b)
}

// pooled is a mount the pool keeps for one command after another.
type pooled struct{ *fusefs.Mounted }

func (p pooled) Serve(call sandbox.CallInfo) {
	p.Mounted.Serve(fusefs.Call{CallID: call.CallID, Container: call.Container})
}

// BenchmarkREPLRoundTrip: one workspace_process_write to a Python REPL
// and its answer, through the tool door.
func BenchmarkREPLRoundTrip(b *testing.B) {
	e := newEnv(b, "", testNode, "acme/coder/bench-repl", "")
	out := e.startRaw(`{"command":"python3 -i -q","yield_ms":500}`)
	in, _ := json.Marshal(map[string]any{"process_id": out.ProcessID, "input": "print(6*7)\n", "yield_ms": 5000})
	var l latencies
	for b.Loop() {
		t0 := time.Now()
		res, err := e.tb.Call(context.Background(), tools.ProcessWrite, "", in)
		l = append(l, time.Since(t0))
		if err != nil || !strings.Contains(string(res), `42`) {
			b.Fatalf("round trip: %s %v", res, err)
		}
	}
	l.report(b)
}

// BenchmarkSessionColdStart: a session sandbox's first start (projection,
// probe, marker, container) with true, then its confirmed stop, against
// docker run --rm of the same image.
func BenchmarkSessionColdStart(b *testing.B) {
	e := newEnv(b, "", testNode, "acme/coder/bench-cold", "")
	var start, stop latencies
	for b.Loop() {
		t0 := time.Now()
		out := e.startRaw(`{"command":"true","yield_ms":10000}`)
		start = append(start, time.Since(t0))
		if out.Status != tools.StatusExited {
			b.Fatalf("%+v", out)
		}
		t1 := time.Now()
		if _, err := e.svc.Stop(context.Background(), e.ws, ""); err != nil {
			b.Fatal(err)
		}
		stop = append(stop, time.Since(t1))
	}
	start.report(b)
	sort.Slice(stop, func(i, j int) bool { return stop[i] < stop[j] })
	b.ReportMetric(float64(stop[len(stop)/2].Microseconds())/1000, "stop-p50-ms")
}

func BenchmarkDockerRunRm(b *testing.B) {
	var l latencies
	args := []string{"run", "--rm", "--network", "none", "--label", sandbox.LabelNode + "=" + testNode, testImage, "true"}
	if rt := os.Getenv("AGENT_LOOM_SANDBOX_RUNTIME"); rt != "" {
		args = append([]string{"run", "--runtime", rt}, args[1:]...)
	}
	for b.Loop() {
		t0 := time.Now()
		if out, err := exec.Command("docker", args...).CombinedOutput(); err != nil {
			b.Fatalf("docker run: %v %s", err, out)
		}
		l = append(l, time.Since(t0))
	}
	l.report(b)
}

// BenchmarkWorkspaceCommandModes: workspace_command true through the tool
// door with "commands: fresh" (a container per call over the pool's live
// projection, as loom wires it: its container prepared after the last
// command's answer; fresh-next is a second one right after it, which
// waits for that) and "commands: session" (an exec in the
// running session sandbox), against docker run --rm and docker exec into
// a running container of the same image, one of each per round so that
// the machine's load hits all five alike. bench/warm.sh SECTIONS=cmd runs
// it; AGENT_LOOM_SANDBOX_IMAGE picks the image.
func BenchmarkWorkspaceCommandModes(b *testing.B) {
	img := testImage
	if v := os.Getenv("AGENT_LOOM_SANDBOX_IMAGE"); v != "" {
		img = v
	}
	rt := os.Getenv("AGENT_LOOM_SANDBOX_RUNTIME")
	fresh, session := commandEnvs(b, "acme/coder/bench-modes")
	r, err := sandbox.NewRunner(context.Background(), sandbox.Config{Host: sandbox.HostFromEnv(), Image: img, Node: testNode, Runtime: rt})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { r.Close() })
	session.svc.cfg.Runner = r
	pool := &sandbox.Pool{Dir: fresh.svc.cfg.MountDir,
		Mount: func(ctx context.Context, ws *store.Workspace, mp string, call sandbox.CallInfo) (sandbox.Projection, error) {
			m, err := fusefs.Mount(ctx, ws, mp, fusefs.Options{AllowOther: true, CallID: call.CallID})
			if err != nil {
				return nil, err
			}
			return pooled{m}, nil
		}}
	b.Cleanup(func() { pool.Close() })
	fresh.tb.Commands = &sandbox.Commands{Runner: r, Pool: pool}

	docker := func(args ...string) []string {
		if rt != "" {
			args = append([]string{args[0], "--runtime", rt}, args[1:]...)
		}
		return args
	}
	label := sandbox.LabelNode + "=" + testNode
	out, err := exec.Command("docker", docker("run", "-d", "--rm", "--network", "none", "--label", label, img, "sleep", "infinity")...).Output()
	if err != nil {
		b.Fatalf("docker run -d: %v", err)
	}
	running := strings.TrimSpace(string(out))
	b.Cleanup(func() { exec.Command("docker", "rm", "-f", running).Run() })

	modes := []struct {
		name string
		run  func() error
	}{
		{"fresh", func() error { return commandTrue(fresh) }},
		// Right after the last: it waits for the holder scan and the
		// container prepared after that answer.
		{"fresh-next", func() error { return commandTrue(fresh) }},
		{"session", func() error { return commandTrue(session) }},
		{"docker-run-rm", func() error {
			return exec.Command("docker", docker("run", "--rm", "--network", "none", "--label", label, img, "true")...).Run()
		}},
		{"docker-exec", func() error { return exec.Command("docker", "exec", running, "true").Run() }},
	}
	for _, m := range modes { // warm: the pool's projection, the session sandbox
		if err := m.run(); err != nil {
			b.Fatalf("%s: %v", m.name, err)
		}
	}
	took := make([]latencies, len(modes))
	for b.Loop() {
		for i, m := range modes {
			t0 := time.Now()
			if err := m.run(); err != nil {
				b.Fatalf("%s: %v", m.name, err)
			}
			took[i] = append(took[i], time.Since(t0))
		}
	}
	med := make([]float64, len(modes))
	for i, m := range modes {
		l := took[i]
		sort.Slice(l, func(a, c int) bool { return l[a] < l[c] })
		med[i] = float64(l[len(l)/2].Microseconds()) / 1000
		b.ReportMetric(med[i], m.name+"-ms")
	}
	b.ReportMetric(med[2]/med[3], "session/run")
	b.ReportMetric(med[0]/med[3], "fresh/run")
	b.ReportMetric(med[1]/med[3], "fresh-next/run")
}

func commandTrue(e *env) error {
	res, err := e.tb.Call(context.Background(), tools.Command, "", []byte(`{"command":"true"}`))
	if err == nil && !strings.Contains(string(res), `"exit_code":0`) {
		err = errors.New("workspace_command true: " + string(res))
	}
	return err
}
