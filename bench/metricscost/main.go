// Command metricscost measures what --metrics costs: the p50 of a
// workspace_write through the tool door, and the time of a create, write
// 100 B, stat and unlink cycle through a real mount, each with the metrics
// off and on (the audit sink wrapper, and the mount's request hook),
// alternating in each of -rounds rounds. It prints every round and the
// medians, and first what the metrics add per FUSE request and per audited
// event. Run it as root (it mounts): go run ./bench/metricscost.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/fusefs"
	"github.com/agentloom/loomfs/loom"
	"github.com/agentloom/loomfs/metrics"
	"github.com/agentloom/loomfs/store"
)

func main() {
	rounds := flag.Int("rounds", 5, "rounds, each running both variants in turn")
	writes := flag.Int("writes", 300, "tool writes a round and variant")
	cycles := flag.Int("cycles", 1000, "mount cycles a round and variant")
	flag.StringVar(&only, "only", "", "with metrics on, only this part of them: requests (the mount's request hook) or sink (the audit sink wrapper)")
	flag.Parse()
	micro()
	root, err := os.MkdirTemp("", "loomfs-metricscost-")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(root)

	var tool, cycle, cpu = map[bool][]float64{}, map[bool][]float64{}, map[bool][]float64{}
	for r := range *rounds {
		order := []bool{false, true}
		if r%2 == 1 {
			order = []bool{true, false}
		}
		for _, on := range order {
			p50 := toolWrites(root, on, *writes, r)
			per, perCPU := mountCycles(root, on, *cycles, r)
			tool[on] = append(tool[on], p50)
			cycle[on] = append(cycle[on], per)
			cpu[on] = append(cpu[on], perCPU)
			fmt.Printf("round %d metrics=%-5v tool_write_p50_us %.1f  cycle_us %.1f  cycle_cpu_us %.1f\n", r, on, p50, per, perCPU)
		}
	}
	fmt.Printf("median tool_write_p50_us off %.1f on %.1f ratio %.3f\n", median(tool[false]), median(tool[true]), median(tool[true])/median(tool[false]))
	fmt.Printf("median cycle_us          off %.1f on %.1f ratio %.3f\n", median(cycle[false]), median(cycle[true]), median(cycle[true])/median(cycle[false]))
	fmt.Printf("median cycle_cpu_us      off %.1f on %.1f ratio %.3f\n", median(cpu[false]), median(cpu[true]), median(cpu[true])/median(cpu[false]))
}

var only string

func node(root string, reg *metrics.Registry) *loom.Node {
	cfg := loom.Config{Store: store.Config{Root: root}}
	if reg != nil {
		cfg.Observe, cfg.Requests = reg.Sink, reg.ObserveRequest
	}
	return loom.New(cfg)
}

// toolWrites returns the p50 in µs of n workspace_write calls.
func toolWrites(root string, on bool, n, round int) float64 {
	var reg *metrics.Registry
	if on {
		reg = metrics.New(metrics.Options{})
	}
	ctx := context.Background()
	s, err := node(root, reg).Open(ctx, fmt.Sprintf("bench/tool/r%d-%v", round, on))
	if err != nil {
		fail(err)
	}
	defer s.Close()
	took := make([]float64, 0, n)
	for i := range n {
		in, _ := json.Marshal(map[string]any{"path": "f" + strconv.Itoa(i%20), "content": "hello metrics\n"})
		start := time.Now()
		if _, err := s.Tools.Call(ctx, "workspace_write", "", in); err != nil {
			fail(err)
		}
		took = append(took, float64(time.Since(start).Microseconds()))
	}
	return median(took)
}

// mountCycles returns the mean wall and CPU µs (this process's, client
// and daemon both, user and system) of n create+write+stat+unlink cycles
// through a mount served by this process with a queued audit log, as
// loomfs mount serves one.
func mountCycles(root string, on bool, n, round int) (wall, cpu float64) {
	var reg *metrics.Registry
	if on {
		reg = metrics.New(metrics.Options{})
	}
	ctx := context.Background()
	s, err := node(root, reg).Open(ctx, fmt.Sprintf("bench/mount/r%d-%v", round, on))
	if err != nil {
		fail(err)
	}
	defer s.Close()
	plog, err := audit.Open(s.Workspace.Volume().Path(), audit.Options{Queue: audit.DefaultQueue})
	if err != nil {
		fail(err)
	}
	defer plog.Close()
	opts := fusefs.Options{Audit: plog}
	if reg != nil && only != "requests" {
		opts.Audit = reg.Sink(plog)
	}
	if reg != nil && only != "sink" {
		opts.Requests = reg.ObserveRequest
	}
	mnt, err := os.MkdirTemp("", "loomfs-metricscost-mnt-")
	if err != nil {
		fail(err)
	}
	defer os.Remove(mnt)
	m, err := fusefs.Mount(ctx, s.Workspace, mnt, opts)
	if err != nil {
		fail(err)
	}
	defer m.Unmount()
	data := make([]byte, 100)
	if reg != nil && round == 0 {
		defer func() { fmt.Printf("FUSE requests a cycle: %s\n", requestsPerCycle(reg, n)) }()
	}
	cpu0 := cpuTime()
	start := time.Now()
	for i := range n {
		p := filepath.Join(mnt, "c"+strconv.Itoa(i))
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
	wall = float64(time.Since(start).Microseconds()) / float64(n)
	return wall, float64((cpuTime() - cpu0).Microseconds()) / float64(n)
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

func fail(err error) {
	fmt.Fprintln(os.Stderr, "metricscost:", err)
	os.Exit(1)
}
