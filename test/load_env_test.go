package test

// What TestLoad runs on: its size and modes from the environment, the
// nodes (a loomfs serve each, on a local root or on two clients of a
// distributed filesystem), the door the agents' tool calls go through, and
// the CPU time and memory of the loomfs processes it starts.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/agentloom/loomfs/loom"
	"github.com/agentloom/loomfs/nodeid"
	"github.com/agentloom/loomfs/nodeservice"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/sandbox"
	"github.com/agentloom/loomfs/store"
)

// loadConfig is TestLoad's size and modes (bench/load.sh sets them).
type loadConfig struct {
	agents int           // LOOMFS_LOAD_AGENTS, default 20
	dur    time.Duration // LOOMFS_LOAD_DURATION, default 60s
	// heavy (LOOMFS_LOAD_HEAVY=1) makes agent 0 the heavy one: in a loop,
	// a 1 GiB dd and an untar of 20,000 files in its own scope.
	heavy bool
	// door (LOOMFS_LOAD_DOOR) is how the tool calls are made: "process",
	// a loomfs tool process per call (the default), or "api", the Go API
	// (package loom) in this process, a session per agent held open.
	door string
	// nodes (LOOMFS_LOAD_NODES) is 1, or 2: the agents split over two
	// nodes, the two clients of LOOMFS_DFS_ROOTS.
	nodes int
	// policy (LOOMFS_LOAD_POLICY) is a policy file every loomfs process
	// and the API door load; "" for the open layout.
	policy string
}

func loadConfigFromEnv(t *testing.T) loadConfig {
	c := loadConfig{agents: 20, dur: 60 * time.Second, door: "process", nodes: 1}
	if v := os.Getenv("LOOMFS_LOAD_AGENTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("LOOMFS_LOAD_AGENTS=%q: want a positive number", v)
		}
		c.agents = n
	}
	if v := os.Getenv("LOOMFS_LOAD_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("LOOMFS_LOAD_DURATION=%q: want a duration such as 10m", v)
		}
		c.dur = d
	}
	switch v := os.Getenv("LOOMFS_LOAD_HEAVY"); v {
	case "", "0":
	case "1":
		c.heavy = true
		if c.agents < 2 {
			t.Fatalf("LOOMFS_LOAD_HEAVY=1 wants at least 2 agents (agent 0 is the heavy one)")
		}
	default:
		t.Fatalf("LOOMFS_LOAD_HEAVY=%q: want 0 or 1", v)
	}
	switch v := os.Getenv("LOOMFS_LOAD_DOOR"); v {
	case "", "process":
	case "api":
		c.door = v
	default:
		t.Fatalf("LOOMFS_LOAD_DOOR=%q: want process or api", v)
	}
	switch v := os.Getenv("LOOMFS_LOAD_NODES"); v {
	case "", "1":
	case "2":
		if _, _, ok := dfsRoots(t); !ok {
			t.Fatalf("LOOMFS_LOAD_NODES=2 wants %s=A,B (two clients of one distributed filesystem)", dfsRootsEnv)
		}
		if c.door == "api" {
			// One process is one node: its name is process-wide.
			t.Fatalf("LOOMFS_LOAD_NODES=2 runs with the process door only")
		}
		c.nodes = 2
	default:
		t.Fatalf("LOOMFS_LOAD_NODES=%q: want 1 or 2", v)
	}
	if v := os.Getenv("LOOMFS_LOAD_POLICY"); v != "" {
		if _, err := policy.Load(v); err != nil {
			t.Fatalf("LOOMFS_LOAD_POLICY=%q: %v", v, err)
		}
		c.policy = v
	}
	return c
}

func (c loadConfig) String() string {
	s := fmt.Sprintf("%d agents on %d node(s), %s door", c.agents, c.nodes, c.door)
	if c.heavy {
		s += ", agent 0 heavy"
	}
	if c.policy != "" {
		s += ", policy " + filepath.Base(c.policy)
	}
	return s
}

// loadNode is one node of the run: its loomfs serve (serveEnv, whose root
// is the node's path to the volume), its name, and the API door when the
// tool calls go through the Go API.
type loadNode struct {
	*serveEnv
	name string
	api  *apiDoor
}

// startNodes starts the run's nodes: one on a fresh local root, or two on
// a fresh directory of $LOOMFS_DFS_ROOTS, each through its own client.
func (c loadConfig) startNodes(t *testing.T) []*loadNode {
	var env []string
	if c.policy != "" {
		env = append(env, "AGENT_LOOM_POLICY="+c.policy)
	}
	if c.nodes == 1 {
		n := &loadNode{serveEnv: newServeEnv(t, env...), name: "node-a"}
		if c.door == "api" {
			n.api = newAPIDoor(t, n, c.policy)
		}
		return []*loadNode{n}
	}
	_, a, b := sharedVolume(t)
	var nodes []*loadNode
	for _, nd := range []*node{a, b} {
		shared := append(slices.Clone(env), "AGENT_LOOM_WORKSPACE_BACKEND=shared_posix", "AGENT_LOOM_WORKSPACE_VOLUME_ID="+nd.volumeID,
			"AGENT_LOOM_DATA="+filepath.Join(nd.dir, "data"))
		nodes = append(nodes, startLoadNode(t, nd.root, nd.name, shared))
	}
	return nodes
}

// startLoadNode is newServeEnv on a given root under a given node name.
func startLoadNode(t *testing.T, root, name string, env []string) *loadNode {
	dir := t.TempDir()
	env = append(env, nodeid.Env+"="+name)
	s := &serveEnv{cli: &cli{t: t, root: root}, socket: filepath.Join(dir, "sock", "serve.sock"), mountDir: filepath.Join(dir, "mnt"), extraEnv: env}
	t.Cleanup(func() { detachUnder(s.mountDir) })
	s.serveAs(name)
	return &loadNode{serveEnv: s, name: name}
}

// apiDoor is the Go API as a platform embeds it: one loom.Node in this
// process whose process tools reach the node's loomfs serve, a Session per
// agent held open for the run. Its projections (of the commands) are served
// by this process.
type apiDoor struct {
	node  *loom.Node
	procs *nodeservice.Client
	log   *syncBuffer // what the Node logged, as JSON lines

	mu       sync.Mutex
	sessions []*loom.Session
}

func newAPIDoor(t *testing.T, n *loadNode, policyFile string) *apiDoor {
	t.Setenv(nodeid.Env, n.name) // the name the audit chain and markers of this process carry
	pol := policy.Default()
	if policyFile != "" {
		var err error
		if pol, err = policy.Load(policyFile); err != nil {
			t.Fatal(err)
		}
	}
	sb := sandbox.ConfigFromEnv()
	sb.Image, sb.Node = "loomfs-sandbox-dev:latest", n.name
	d := &apiDoor{procs: nodeservice.NewClient(n.socket), log: &syncBuffer{}}
	core := zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(d.log), zap.WarnLevel)
	d.node = loom.New(loom.Config{Store: store.Config{Root: n.root}, Policy: pol, Sandbox: sb, Processes: d.procs, Log: zap.New(core)})
	d.node.SweepStaleMounts()
	t.Cleanup(func() { d.close(t) })
	return d
}

// open opens an agent's session.
func (d *apiDoor) open(t *testing.T, scope string) *loom.Session {
	s, err := d.node.Open(context.Background(), scope)
	if err != nil {
		t.Fatalf("open %s: %v", scope, err)
	}
	d.mu.Lock()
	d.sessions = append(d.sessions, s)
	d.mu.Unlock()
	return s
}

// close closes every session, once its late calls are done, and the Node.
func (d *apiDoor) close(t *testing.T) {
	d.mu.Lock()
	sessions := d.sessions
	d.sessions = nil
	d.mu.Unlock()
	for _, s := range sessions {
		s.Tools.Wait()
		s.Close()
	}
	if sessions == nil {
		return
	}
	if err := d.node.Close(); err != nil {
		t.Errorf("close the API door's node: %v", err)
	}
	d.procs.Close()
}

// procUsage adds up the CPU time and the peak memory of the loomfs
// processes a run starts, by kind: a one-call process (loomfs tool) from
// its rusage at exit, which counts what its children did too; a long-lived
// one (loomfs serve, this process as the API door) from /proc at the end of
// the run (utime+stime and its waited-for children's, VmHWM). A sampler
// adds, every interval, the resident memory of every process of the loomfs
// binary alive at that moment.
type procUsage struct {
	mu    sync.Mutex
	kinds map[string]*kindUsage

	most      int   // processes of the binary alive at once, at most
	mostRSSKB int64 // their resident memory together, at most
	stop      chan struct{}
	done      chan struct{}
}

type kindUsage struct {
	procs   int
	cpu     time.Duration
	peakKB  int64 // the largest peak resident set of one process
	peakSum int64 // the peaks added up, for the mean
}

func newProcUsage() *procUsage {
	return &procUsage{kinds: map[string]*kindUsage{}}
}

func (u *procUsage) add(kind string, cpu time.Duration, peakKB int64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	k := u.kinds[kind]
	if k == nil {
		k = &kindUsage{}
		u.kinds[kind] = k
	}
	k.procs++
	k.cpu += cpu
	k.peakKB = max(k.peakKB, peakKB)
	k.peakSum += peakKB
}

// exited counts a one-call process that has been waited for.
func (u *procUsage) exited(kind string, ps *os.ProcessState) {
	if ps == nil {
		return
	}
	ru, ok := ps.SysUsage().(*syscall.Rusage)
	if !ok {
		return
	}
	u.add(kind, time.Duration(ru.Utime.Nano()+ru.Stime.Nano()), ru.Maxrss)
}

// procCPU is a process's CPU time from /proc/PID/stat, its waited-for
// children's included, and its peak resident set (VmHWM).
func procCPU(pid string) (time.Duration, int64, error) {
	stat, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// The fields after the command's name, which is in parentheses.
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	if len(f) < 15 {
		return 0, 0, fmt.Errorf("/proc/%s/stat: %d fields", pid, len(f))
	}
	var ticks int64
	for _, s := range f[11:15] { // utime stime cutime cstime
		n, _ := strconv.ParseInt(s, 10, 64)
		ticks += n
	}
	const hz = 100 // USER_HZ
	return time.Duration(ticks) * time.Second / hz, statusKB(pid, "VmHWM:"), nil
}

// statusKB is a "kB" field of /proc/PID/status, 0 if it can't be read.
func statusKB(pid, field string) int64 {
	b, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

// running counts a long-lived process as it is now, less what it had used
// at since (its CPU time when the run began).
func (u *procUsage) running(kind string, pid int, since time.Duration) {
	cpu, peak, err := procCPU(strconv.Itoa(pid))
	if err == nil {
		u.add(kind, cpu-since, peak)
	}
}

// sample starts the sampler of the binary's processes; stopSampling ends it.
func (u *procUsage) sample(bin string, every time.Duration) {
	u.stop, u.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(u.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-u.stop:
				return
			case <-tick.C:
			}
			n, rss := 0, int64(0)
			pids, _ := os.ReadDir("/proc")
			for _, p := range pids {
				if p.Name()[0] < '0' || p.Name()[0] > '9' {
					continue
				}
				if exe, err := os.Readlink("/proc/" + p.Name() + "/exe"); err == nil && exe == bin {
					n++
					rss += statusKB(p.Name(), "VmRSS:")
				}
			}
			u.mu.Lock()
			u.most, u.mostRSSKB = max(u.most, n), max(u.mostRSSKB, rss)
			u.mu.Unlock()
		}
	}()
}

func (u *procUsage) stopSampling() {
	if u.stop != nil {
		close(u.stop)
		<-u.done
		u.stop = nil
	}
}

// table is one line per kind of process: how many, their CPU seconds in
// all and per process, and their peak resident memory (the largest, the
// mean), then what the sampler saw at most at once.
func (u *procUsage) table() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	kinds := make([]string, 0, len(u.kinds))
	for k := range u.kinds {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	lines := []string{fmt.Sprintf("%-34s %7s %9s %11s %12s %13s", "loomfs process", "procs", "CPU s", "CPU ms/proc", "peak RSS MiB", "mean peak MiB")}
	for _, kind := range kinds {
		k := u.kinds[kind]
		lines = append(lines, fmt.Sprintf("%-34s %7d %9.1f %11.1f %12.1f %13.1f", kind, k.procs, k.cpu.Seconds(),
			float64(k.cpu.Milliseconds())/float64(k.procs), float64(k.peakKB)/1024, float64(k.peakSum)/float64(k.procs)/1024))
	}
	lines = append(lines, fmt.Sprintf("at most %d loomfs processes at once, %.1f MiB resident together (sampled)", u.most, float64(u.mostRSSKB)/1024))
	return lines
}
