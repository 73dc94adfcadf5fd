// Command metricscost measures what --metrics and tracing cost: the p50 of
// a workspace_write through the tool door, and the time of a create,
// write 100 B, stat and unlink cycle through a real mount, each with
// everything off and with the metrics on (the audit sink wrapper, and the
// mount's request hook), and with -trace also with the metrics and
// tracing on, unsampled (a tracer provider whose sampler keeps nothing)
// and every call traced (every span kept and exported over OTLP/HTTP to a
// receiver in this process that discards it, the projection's operations
// included: LOOMFS_TRACE_FUSE=1). Every variant's session and mount are
// up side by side for a round, and the round runs them in batches of
// -batch calls (and warm reads of whole files through the mount, as rg
// makes them), each variant first in turn: the machine's drift (writeback,
// a neighbour's load) then weighs on all alike. It prints every round, the
// median of the rounds and the median of each round's ratio to off, and
// first what the metrics add per FUSE request and per audited event and
// what a span costs. Run it as root (it mounts):
// go run ./bench/metricscost [-trace].
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/fusefs"
	"github.com/agentloom/loomfs/loom"
	"github.com/agentloom/loomfs/metrics"
	"github.com/agentloom/loomfs/store"
	"github.com/agentloom/loomfs/tracing"
)

// A variant is what is on while a round's calls run.
type variant string

const (
	off       variant = "off"
	metricsOn variant = "metrics"
	unsampled variant = "unsampled" // metrics, and tracing keeping nothing
	traced    variant = "traced"    // metrics, and every call traced
)

func main() {
	rounds := flag.Int("rounds", 5, "rounds, each running every variant in turn")
	writes := flag.Int("writes", 300, "tool writes a round and variant")
	batch := flag.Int("batch", 50, "calls of each kind a variant makes before the next one's turn")
	cycles := flag.Int("cycles", 1000, "mount cycles a round and variant")
	reads := flag.Int("reads", 3000, "warm reads of a whole file through the mount a round and variant (rg's pattern: open, read, close)")
	withTrace := flag.Bool("trace", false, "measure tracing too: unsampled, and every call traced")
	flag.StringVar(&only, "only", "", "with metrics on, only this part of them: requests (the mount's request hook) or sink (the audit sink wrapper)")
	flag.Parse()
	micro()
	root, err := os.MkdirTemp("", "loomfs-metricscost-")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(root)
	variants := []variant{off, metricsOn}
	if *withTrace {
		variants = append(variants, unsampled, traced)
	}
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
	}))
	defer receiver.Close()

	providers := newProviders(receiver.URL)
	defer providers.shutdown()
	if *withTrace {
		microTrace(providers)
	}

	tool, cycle, cpu, read := map[variant][]float64{}, map[variant][]float64{}, map[variant][]float64{}, map[variant][]float64{}
	for r := range *rounds {
		envs := map[variant]*benchEnv{}
		for _, v := range variants {
			providers.use(v)
			envs[v] = setUp(root, v, r)
		}
		took := map[variant]*times{}
		for _, v := range variants {
			took[v] = &times{}
		}
		for b := 0; b*(*batch) < max(*writes, *cycles, *reads); b++ {
			order := append(slices.Clone(variants[b%len(variants):]), variants[:b%len(variants)]...)
			for _, v := range order {
				providers.use(v)
				e := envs[v]
				part := func(total int) int { return max(0, min(*batch, total-b*(*batch))) }
				e.toolWrites(took[v], part(*writes))
				e.mountCycles(took[v], part(*cycles))
				e.warmReads(took[v], part(*reads))
			}
		}
		for _, v := range variants {
			if v == metricsOn && r == 0 {
				fmt.Printf("FUSE requests of the mount (the tree made, cycles, warm reads) over the cycles: %s\n", requestsPerCycle(envs[v].reg, *cycles))
			}
			envs[v].close()
			t := took[v]
			p50, per, perCPU := median(t.writes), t.cycleWall/float64(t.cycles), t.cycleCPU/float64(t.cycles)
			perRead := t.readWall / float64(max(t.reads, 1))
			tool[v] = append(tool[v], p50)
			cycle[v] = append(cycle[v], per)
			cpu[v] = append(cpu[v], perCPU)
			read[v] = append(read[v], perRead)
			fmt.Printf("round %d %-9s tool_write_p50_us %.1f  cycle_us %.1f  cycle_cpu_us %.1f  warm_read_us %.1f\n", r, v, p50, per, perCPU, perRead)
		}
	}
	for _, v := range variants[1:] {
		for _, m := range []struct {
			name string
			of   map[variant][]float64
		}{{"tool_write_p50_us", tool}, {"cycle_us", cycle}, {"cycle_cpu_us", cpu}, {"warm_read_us", read}} {
			var ratios []float64
			for i := range m.of[off] {
				ratios = append(ratios, m.of[v][i]/m.of[off][i])
			}
			fmt.Printf("median %-9s %-17s off %.1f %s %.1f; median ratio of a round %.3f\n", v, m.name, median(m.of[off]), v, median(m.of[v]), median(ratios))
		}
	}
}

// times is what one variant's calls took in a round.
type times struct {
	writes              []float64 // µs, each tool write
	cycles              int
	cycleWall, cycleCPU float64 // µs, all cycles
	reads               int
	readWall            float64 // µs, all warm reads
}

// providers are the tracer providers of the traced variants, made once:
// each exports over OTLP/HTTP to a receiver that discards what it gets.
type providers struct {
	unsampled, traced *sdktrace.TracerProvider
}

func newProviders(receiver string) *providers {
	mk := func(s sdktrace.Sampler) *sdktrace.TracerProvider {
		exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(receiver+"/v1/traces"))
		if err != nil {
			fail(err)
		}
		return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithSampler(s))
	}
	return &providers{unsampled: mk(sdktrace.NeverSample()), traced: mk(sdktrace.AlwaysSample())}
}

// use makes v's tracer provider the global one, as tracing.Setup would,
// and sets LOOMFS_TRACE_FUSE for the traced variant alone.
func (p *providers) use(v variant) {
	os.Unsetenv(tracing.FUSEEnv)
	switch v {
	case unsampled:
		otel.SetTracerProvider(p.unsampled)
	case traced:
		otel.SetTracerProvider(p.traced)
		os.Setenv(tracing.FUSEEnv, "1")
	default:
		otel.SetTracerProvider(noop.NewTracerProvider())
	}
}

func (p *providers) shutdown() {
	p.unsampled.Shutdown(context.Background())
	p.traced.Shutdown(context.Background())
	otel.SetTracerProvider(noop.NewTracerProvider())
}

var only string

func node(root string, reg *metrics.Registry) *loom.Node {
	cfg := loom.Config{Store: store.Config{Root: root}}
	if reg != nil {
		cfg.Observe, cfg.Requests = reg.Sink, reg.ObserveRequest
	}
	return loom.New(cfg)
}

// benchEnv is one variant's session for tool writes and its mount for
// cycles, up for a round.
type benchEnv struct {
	reg     *metrics.Registry
	tool    *loom.Session
	mounted *loom.Session
	plog    *audit.Log
	mnt     string
	m       *fusefs.Mounted
	span    trace.Span
	next    int
	// nextRead is the next file of the tree a warm read takes.
	nextRead int
}

func setUp(root string, v variant, round int) *benchEnv {
	e := &benchEnv{}
	if v != off {
		e.reg = metrics.New(metrics.Options{})
	}
	ctx := context.Background()
	var err error
	if e.tool, err = node(root, e.reg).Open(ctx, fmt.Sprintf("bench/tool/r%d-%s", round, v)); err != nil {
		fail(err)
	}
	if e.mounted, err = node(root, e.reg).Open(ctx, fmt.Sprintf("bench/mount/r%d-%s", round, v)); err != nil {
		fail(err)
	}
	// A queued audit log, as loomfs mount serves one.
	if e.plog, err = audit.Open(e.mounted.Workspace.Volume().Path(), audit.Options{Queue: audit.DefaultQueue}); err != nil {
		fail(err)
	}
	opts := fusefs.Options{Audit: e.plog}
	if e.reg != nil && only != "requests" {
		opts.Audit = e.reg.Sink(e.plog)
	}
	if e.reg != nil && only != "sink" {
		opts.Requests = e.reg.ObserveRequest
	}
	if v == unsampled || v == traced {
		// The mount serves one call for all its cycles, under its span.
		_, e.span = tracing.Start(ctx, "bench call")
		opts.Trace = e.span.SpanContext()
	}
	if e.mnt, err = os.MkdirTemp("", "loomfs-metricscost-mnt-"); err != nil {
		fail(err)
	}
	if e.m, err = fusefs.Mount(ctx, e.mounted.Workspace, e.mnt, opts); err != nil {
		fail(err)
	}
	mounted[e.m] = true
	// The tree the warm reads go over, read once so the kernel has it.
	src := make([]byte, 4096)
	for i := range treeFiles {
		p := filepath.Join(e.mnt, "tree", strconv.Itoa(i%10), strconv.Itoa(i)+".go")
		os.MkdirAll(filepath.Dir(p), 0o700)
		if err := os.WriteFile(p, src, 0o600); err != nil {
			fail(err)
		}
		if _, err := os.ReadFile(p); err != nil {
			fail(err)
		}
	}
	return e
}

// treeFiles is how many 4 KiB files the warm reads go over.
const treeFiles = 500

func (e *benchEnv) close() {
	e.m.Unmount()
	delete(mounted, e.m)
	os.Remove(e.mnt)
	if e.span != nil {
		e.span.End()
	}
	e.plog.Close()
	e.mounted.Close()
	e.tool.Close()
}

// toolWrites makes n workspace_write calls and notes each one's time.
func (e *benchEnv) toolWrites(t *times, n int) {
	ctx := context.Background()
	for range n {
		in, _ := json.Marshal(map[string]any{"path": "f" + strconv.Itoa(e.next%20), "content": "hello metrics\n"})
		e.next++
		start := time.Now()
		if _, err := e.tool.Tools.Call(ctx, "workspace_write", "", in); err != nil {
			fail(err)
		}
		t.writes = append(t.writes, float64(time.Since(start).Microseconds()))
	}
}

// mountCycles makes n create+write+stat+unlink cycles through the mount
// and notes their wall and CPU time (this process's, client and daemon
// both, user and system).
func (e *benchEnv) mountCycles(t *times, n int) {
	data := make([]byte, 100)
	cpu0 := cpuTime()
	start := time.Now()
	for i := range n {
		p := filepath.Join(e.mnt, "c"+strconv.Itoa(i))
		if err := os.WriteFile(p, data, 0o600); err != nil {
			fail(err)
		}
		if _, err := os.Stat(p); err != nil {
			fail(err)
		}
		if err := os.Remove(p); err != nil {
			fail(err)
		}
	}
	t.cycles += n
	t.cycleWall += float64(time.Since(start).Microseconds())
	t.cycleCPU += float64((cpuTime() - cpu0).Microseconds())
}

// warmReads reads n files of the tree whole through the mount, as rg
// does: open, read, close; their pages are the kernel's already.
func (e *benchEnv) warmReads(t *times, n int) {
	start := time.Now()
	for range n {
		i := e.nextRead % treeFiles
		e.nextRead++
		if _, err := os.ReadFile(filepath.Join(e.mnt, "tree", strconv.Itoa(i%10), strconv.Itoa(i)+".go")); err != nil {
			fail(err)
		}
	}
	t.reads += n
	t.readWall += float64(time.Since(start).Microseconds())
}

// cpuTime is the CPU time the process used so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// micro prints what the metrics add per FUSE request and per audited
// event, timed over a million calls in this process: a figure a busy
// machine disturbs far less than the end-to-end ratios.
func micro() {
	const n = 1_000_000
	r := metrics.New(metrics.Options{})
	start := time.Now()
	for range n {
		r.ObserveRequest("GETATTR", 0, time.Microsecond)
	}
	req := float64(time.Since(start).Nanoseconds()) / n
	sink := r.Sink(audit.Discard)
	ev := audit.Event{Source: audit.SourceFUSE, Op: "create", Result: "ok", Actor: audit.Actor{Space: "bench", Agent: "a", Session: "s"}}
	ctx := context.Background()
	start = time.Now()
	for range n {
		sink.Record(ctx, ev)
	}
	rec := float64(time.Since(start).Nanoseconds()) / n
	fmt.Printf("per FUSE request %.0f ns, per audited event %.0f ns (wrapper over a sink that keeps nothing)\n", req, rec)
}

// microTrace prints what a span costs, unsampled and kept (with two
// attributes, as the mount's operation spans carry, exported as in the
// traced variant), timed over many spans in this process.
func microTrace(p *providers) {
	const n = 200_000
	ctx := context.Background()
	for _, v := range []variant{unsampled, traced} {
		p.use(v)
		start := time.Now()
		for range n {
			_, span := tracing.Start(ctx, "fuse create", attribute.String("loomfs.path", "src/a.go"), attribute.String("loomfs.result", "ok"))
			span.End()
		}
		per := float64(time.Since(start).Nanoseconds()) / n
		p.use(off)
		fmt.Printf("per span %s %.0f ns\n", v, per)
	}
}

// requestsPerCycle is what the registry counted a cycle, by opcode.
func requestsPerCycle(reg *metrics.Registry, n int) string {
	rec := httptest.NewRecorder()
	reg.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	var out []string
	for _, l := range strings.Split(rec.Body.String(), "\n") {
		if !strings.HasPrefix(l, "loomfs_fuse_requests_total{") {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		v, _ := strconv.ParseFloat(l[i+1:], 64)
		out = append(out, fmt.Sprintf("%s %.1f", l[len("loomfs_fuse_requests_total"):i], v/float64(n)))
	}
	return strings.Join(out, ", ")
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// mounted is every mount up now, for fail to take down: a mount left
// behind breaks the next program that sweeps stale projections.
var mounted = map[*fusefs.Mounted]bool{}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "metricscost:", err)
	for m := range mounted {
		m.Unmount()
	}
	os.Exit(1)
}
