package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/fusefs"
	"github.com/agentloom/loomfs/health"
	"github.com/agentloom/loomfs/mcpserver"
	"github.com/agentloom/loomfs/metrics"
	"github.com/agentloom/loomfs/nodeid"
	"github.com/agentloom/loomfs/process"
	"github.com/agentloom/loomfs/sandbox"
	"github.com/agentloom/loomfs/store"
)

// metricsFlags are --metrics and its companions, on serve, mount and mcp.
type metricsFlags struct {
	addr, tokenFile string
	scopes          int
	window          time.Duration
	every           time.Duration // the volume's self-check period
}

const metricsHelp = `--metrics ADDR serves Prometheus metrics at /metrics, and /healthz (the
process answers) and /readyz (the volume marker holds, the engine answers
where it is used, every self-check passes) on ADDR (host:port, :port or
port). Without a host it binds 127.0.0.1; any address beyond loopback
needs --metrics-token-file, as "loomfs mcp --http" does. With it the volume
(a small file written, read back and deleted under loomfs's own directory)
and every projection the command mounts for a sandbox are probed every
--volume-check. See DEPLOY.md for what to scrape and alert on.`

func addMetricsFlags(f *pflag.FlagSet, m *metricsFlags) {
	f.StringVar(&m.addr, "metrics", "", "serve Prometheus metrics, /healthz and /readyz on ADDR (loopback unless a token is given); off by default")
	f.StringVar(&m.tokenFile, "metrics-token-file", "", "file holding the bearer token requests to --metrics must carry (required beyond loopback)")
	f.IntVar(&m.scopes, "metrics-scopes", metrics.DefaultMaxScopes, "the most scopes with per-scope series at once (the least recently active make room)")
	f.DurationVar(&m.window, "metrics-scope-window", metrics.DefaultScopeWindow, "per-scope series only for scopes active this recently")
	f.DurationVar(&m.every, "volume-check", health.DefaultEvery, "with --metrics, probe the volume and the sandboxes' projections (write, read back, delete) this often")
}

// observability is what --metrics serves; a nil one is off and costs
// nothing.
type observability struct {
	reg    *metrics.Registry
	checks *health.Checker

	mu    sync.Mutex
	conds []health.Condition // what /readyz asks besides the self-checks
}

// require adds a condition of readiness.
func (o *observability) require(name string, check func(context.Context) error) {
	if o == nil {
		return
	}
	o.mu.Lock()
	o.conds = append(o.conds, health.Condition{Name: name, Check: check})
	o.mu.Unlock()
}

func (o *observability) conditions() []health.Condition {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]health.Condition(nil), o.conds...)
}

// sink is the sink a door records into for s.
func (o *observability) sink(s audit.Sink) audit.Sink {
	if o == nil {
		return s
	}
	return o.reg.Sink(s)
}

// requests is the hook of a mount's FUSE requests (fusefs.Options.Requests).
func (o *observability) requests() func(string, syscall.Errno, time.Duration) {
	if o == nil {
		return nil
	}
	return o.reg.ObserveRequest
}

// startMetrics serves m.addr until stop is called; with no address it does
// nothing. g.obs is set for the commands' wiring (globals.node).
func (g *globals) startMetrics(ctx context.Context, m metricsFlags) (stop func(), err error) {
	if m.addr == "" {
		if m.tokenFile != "" {
			return nil, usagef("--metrics-token-file is for --metrics")
		}
		return func() {}, nil
	}
	token, err := readToken(m.tokenFile)
	if err != nil {
		return nil, err
	}
	ln, err := mcpserver.Listen(m.addr, token != "")
	if errors.Is(err, mcpserver.ErrTokenRequired) {
		return nil, usagef("--metrics %s is not a loopback address: serving beyond loopback needs --metrics-token-file", m.addr)
	}
	if err != nil {
		return nil, fmt.Errorf("--metrics %s: %w", m.addr, err)
	}
	cfg := g.storeConfig()
	vol, err := store.OpenVolume(ctx, cfg)
	if err != nil {
		ln.Close()
		return nil, err
	}
	o := &observability{
		reg:    metrics.New(metrics.Options{ScopeWindow: m.window, MaxScopes: m.scopes}),
		checks: &health.Checker{Every: m.every, Log: g.log},
	}
	o.reg.WatchChecks(func() []metrics.Check {
		var out []metrics.Check
		for _, r := range o.checks.Results() {
			out = append(out, metrics.Check{Target: r.Target, OK: r.OK, Time: r.Time, Took: r.Took})
		}
		return out
	})
	var limit int64
	if pol, err := g.loadPolicy(); err == nil {
		limit = pol.Limits.ScopeBytes
	}
	o.reg.QuotaOf(func(name string) (int64, int64, bool) {
		sc, err := store.ParseScope(name)
		if err != nil {
			return 0, 0, false
		}
		st, err := vol.ScopeQuotaState(sc)
		if err != nil || !st.Known && st.Holders == 0 {
			return 0, 0, false
		}
		return st.Used.Bytes, limit, true
	})
	o.reg.WatchQuarantines(func() ([]metrics.Quarantine, error) {
		ms, err := vol.Quarantines()
		out := make([]metrics.Quarantine, 0, len(ms))
		for _, q := range ms {
			out = append(out, metrics.Quarantine{Scope: q.Scope, Reason: shortReason(q.Reason)})
		}
		return out, err
	})
	node, _ := nodeid.Name()
	o.reg.WatchAuditSeal(func() (time.Time, bool, error) {
		a, err := audit.Heads(audit.Dir(vol.Path()), time.Now())
		if errors.Is(err, os.ErrNotExist) {
			return time.Time{}, false, nil
		}
		if err != nil {
			return time.Time{}, false, err
		}
		for _, h := range a.Heads {
			if h.Node == node && h.Seal != nil {
				return h.Seal.Time, true, nil
			}
		}
		return time.Time{}, false, nil
	})
	o.reg.WatchVolume(func() (metrics.Volume, error) {
		var st unix.Statfs_t
		if err := unix.Statfs(vol.Path(), &st); err != nil {
			return metrics.Volume{}, err
		}
		bs := uint64(st.Bsize)
		return metrics.Volume{Size: st.Blocks * bs, Available: st.Bavail * bs, Files: st.Files, FilesFree: st.Ffree}, nil
	})
	locks := filepath.Join(vol.Path(), store.LocksDir)
	o.checks.Add("volume", func(ctx context.Context) error {
		if err := os.MkdirAll(locks, 0o700); err != nil {
			return err
		}
		return health.ProbeDir(ctx, locks)
	})
	o.require("volume", func(ctx context.Context) error {
		v, err := store.OpenVolume(ctx, cfg)
		if err != nil {
			return err
		}
		return v.Close()
	})

	mux := http.NewServeMux()
	mux.Handle("GET /metrics", o.reg.Handler())
	o.checks.Handle(mux, o.conditions)
	var handler http.Handler = mux
	if token != "" {
		handler = mcpserver.RequireBearer(token, mux)
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	cctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		o.checks.Run(cctx)
	}()
	go func() {
		defer wg.Done()
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			g.log.Error("metrics server", zap.Error(err))
		}
	}()
	g.obs = o
	fmt.Fprintf(os.Stderr, "metrics at http://%s/metrics\n", ln.Addr())
	return func() {
		cancel()
		sctx, done := context.WithTimeout(context.Background(), 2*time.Second)
		srv.Shutdown(sctx)
		done()
		wg.Wait()
		vol.Close()
		g.obs = nil
	}, nil
}

// shortReason is a quarantine's reason as a label: its first clause,
// bounded, since a reason may carry an error's text.
func shortReason(r string) string {
	r, _, _ = strings.Cut(r, ":")
	if len(r) > 48 {
		r = r[:48]
	}
	return r
}

// watchService reports the node's session sandboxes and asks, for
// readiness, that the engine answers.
func (o *observability) watchService(svc *process.Service) {
	if o == nil {
		return
	}
	o.reg.WatchSandboxes(func() (boxes, procs int) {
		list := svc.Sandboxes()
		for _, b := range list {
			procs += b.Running
		}
		return len(list), procs
	})
	o.require("fence", func(context.Context) error { return svc.Fenced() })
	var mu sync.Mutex
	var engine *sandbox.Runner
	o.require("engine", func(ctx context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		if engine == nil {
			r, err := sandbox.NewRunner(ctx, sandbox.ConfigFromEnv())
			if err != nil {
				return err
			}
			engine = r
		}
		_, err := engine.Engine().Ping(ctx)
		return err
	})
}

// watchFence runs watch (store.WatchFence, or loom.Node.WatchFence, which
// also stops the node's work) and reports what it finds as
// loomfs_node_fenced: 0 while this node is not fenced from the shared
// volume, 1 once it is. It returns the fence, or nil when ctx ends first.
func (o *observability) watchFence(ctx context.Context, cfg store.Config, watch func(context.Context) error) error {
	if o != nil && cfg.Backend == store.BackendSharedPOSIX {
		o.reg.WatchingFence()
	}
	err := watch(ctx)
	if err != nil && o != nil {
		o.reg.Fenced(time.Now())
	}
	return err
}

// mounted self-checks a projection the node mounted for a command or a
// session sandbox, under its scope's name, until it is unmounted.
func (o *observability) mounted(sc store.Scope, m *fusefs.Mounted) func() {
	return o.checks.Add(sc.String(), m.Probe)
}

// watchFollow reports how far behind m's journal follower is.
func (o *observability) watchFollow(m *fusefs.Mounted) {
	if o != nil {
		o.reg.WatchJournalFollow(m.JournalRead)
	}
}

// watchMount probes the mount m serves of ws through its own self-check
// loop (report) and reports ws's quota while the scope is active.
func (o *observability) watchMount(ws *store.Workspace) (report func(err error, took time.Duration), stop func()) {
	if o == nil {
		return func(error, time.Duration) {}, func() {}
	}
	name := ws.Scope().String()
	limit := ws.Policy().Limits.ScopeBytes
	unwatch := o.reg.WatchQuota(name, func() (int64, int64, bool) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		u, err := ws.Usage(ctx)
		return u.Bytes, limit, err == nil
	})
	return func(err error, took time.Duration) { o.checks.Report(name, err, took) },
		func() { unwatch(); o.checks.Forget(name) }
}
