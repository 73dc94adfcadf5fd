// Package metrics tells operators what loomfs on one node is doing, in
// Prometheus's exposition format: tool calls, FUSE requests and refusals,
// audit, sandbox and self-check state.
//
// Counts and latencies come from the audit stream (Registry.Sink wraps the
// Sink a door records into) and from a mount's request hook
// (Registry.ObserveRequest for fusefs.Options.Requests), so no door's code
// knows of metrics. State (queue depths, quarantines, quota use, live
// sandboxes) is read from the packages' own status functions when
// Prometheus scrapes, never pushed from a request's path. Per-scope series
// exist only for the scopes active lately, at most Options.MaxScopes of
// them; totals per node always. The package decides no policy and never
// refuses an operation.
package metrics

import (
	"net/http"
	"runtime/debug"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Defaults of Options.
const (
	DefaultScopeWindow = 10 * time.Minute
	DefaultMaxScopes   = 100
)

// Options bound the per-scope series.
type Options struct {
	// ScopeWindow: a scope has series while it was active this recently;
	// 0 means DefaultScopeWindow.
	ScopeWindow time.Duration
	// MaxScopes is the most scopes with series at once; the one active
	// least recently makes room. 0 means DefaultMaxScopes.
	MaxScopes int
}

// Registry holds one process's metrics. It is safe for concurrent use.
type Registry struct {
	reg *prometheus.Registry

	toolCalls    *prometheus.CounterVec
	toolSeconds  *prometheus.HistogramVec
	fuseOps      *prometheus.CounterVec
	fuseRequests *prometheus.CounterVec
	fuseSeconds  *prometheus.HistogramVec
	refusals     *prometheus.CounterVec
	throttled    prometheus.Counter
	throttledSec prometheus.Counter
	sandbox      *prometheus.CounterVec
	auditRecord  prometheus.Histogram
	starts       *startTimes

	scopes   *scopeSet
	requests sync.Map // requestKey → requestSeries
	events   sync.Map // eventKey → eventSeries

	maxScopes int

	mu         sync.Mutex
	stateFuncs stateFuncs
	fence      fenceState
	logs       []statuser
	// What closed logs wrote, so the totals never go down.
	closedRecords, closedFailed float64
	readErrs                    map[string]float64
}

// latencyBuckets span a cached FUSE reply (tens of µs) to a tool call
// that waited on slow storage (seconds).
var latencyBuckets = []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

// New returns a Registry with the process's Go runtime and build info.
func New(opts Options) *Registry {
	if opts.ScopeWindow <= 0 {
		opts.ScopeWindow = DefaultScopeWindow
	}
	if opts.MaxScopes <= 0 {
		opts.MaxScopes = DefaultMaxScopes
	}
	r := &Registry{
		reg:       prometheus.NewRegistry(),
		scopes:    newScopeSet(opts.ScopeWindow, opts.MaxScopes),
		maxScopes: opts.MaxScopes,
		readErrs:  map[string]float64{},
	}
	r.toolCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "loomfs_tool_calls_total",
		Help: "Tool calls answered through the tool door, by tool, result (ok, refused, error) and loomfs error code.",
	}, []string{"tool", "result", "code"})
	r.toolSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "loomfs_tool_call_duration_seconds",
		Help:    "Time tool calls took, by tool, as their audit records give it.",
		Buckets: latencyBuckets,
	}, []string{"tool"})
	r.fuseOps = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "loomfs_fuse_operations_total",
		Help: "Audited operations of the FUSE projection (changes and refusals; reads and lookups are not audited), by operation, result and loomfs error code.",
	}, []string{"op", "result", "code"})
	r.fuseRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "loomfs_fuse_requests_total",
		Help: "FUSE requests the node's mounts answered, by opcode and errno (\"0\" for success).",
	}, []string{"op", "errno"})
	r.fuseSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "loomfs_fuse_request_duration_seconds",
		Help:    "Time the node's mounts took to answer FUSE requests, by opcode, throttle waits included.",
		Buckets: latencyBuckets,
	}, []string{"op"})
	r.refusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "loomfs_refusals_total",
		Help: "Operations the policy refused, by door (tool, fuse, sandbox, platform) and loomfs error code.",
	}, []string{"door", "code"})
	r.throttled = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "loomfs_throttle_waits_total",
		Help: "Waits of a millisecond or more for a scope's io_bytes_per_s or io_ops_per_s, counted as open files are released.",
	})
	r.throttledSec = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "loomfs_throttle_wait_seconds_total",
		Help: "Time spent waiting for scopes' I/O rate limits, counted as open files are released.",
	})
	r.sandbox = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "loomfs_sandbox_events_total",
		Help: "Sandbox container and session-sandbox events (container_create, container_start, container_start_failed, container_removed, container_remove_unconfirmed, process_start, ...), by event.",
	}, []string{"event"})
	r.auditRecord = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "loomfs_audit_record_duration_seconds",
		Help:    "Time a door waited for the audit log to accept a record (written for a synchronous log, queued for a mount's).",
		Buckets: latencyBuckets,
	})
	r.starts = &startTimes{created: map[string]time.Time{}, latency: prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "loomfs_sandbox_start_duration_seconds",
		Help:    "Time from a sandbox container's creation to its start (one-shot commands and session sandboxes), as their audit records give it.",
		Buckets: latencyBuckets,
	})}
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "loomfs_build_info",
		Help: "Always 1; the labels name the loomfs build and the Go version it was built with.",
	}, []string{"version", "revision", "goversion"})
	version, revision, goversion := buildInfo()
	build.WithLabelValues(version, revision, goversion).Set(1)

	r.reg.MustRegister(r.toolCalls, r.toolSeconds, r.fuseOps, r.fuseRequests, r.fuseSeconds, r.refusals,
		r.throttled, r.throttledSec, r.sandbox, r.auditRecord, r.starts.latency, build, r.scopes, stateCollector{r},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return r
}

func buildInfo() (version, revision, goversion string) {
	version, revision, goversion = "(devel)", "", ""
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return
	}
	goversion = bi.GoVersion
	if bi.Main.Version != "" {
		version = bi.Main.Version
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" {
			revision = s.Value
		}
	}
	return
}

// Handler serves the exposition (GET /metrics).
func (r *Registry) Handler() http.Handler {
	return promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// ObserveRequest counts one FUSE request a mount answered: give it as
// fusefs.Options.Requests. The series of each opcode and errno are looked
// up once, not hashed again on every request.
func (r *Registry) ObserveRequest(op string, errno syscall.Errno, took time.Duration) {
	k := requestKey{op, errno}
	m, ok := r.requests.Load(k)
	if !ok {
		m, _ = r.requests.LoadOrStore(k, requestSeries{
			count:   r.fuseRequests.WithLabelValues(op, errnoLabel(errno)),
			latency: r.fuseSeconds.WithLabelValues(op),
		})
	}
	s := m.(requestSeries)
	s.count.Inc()
	s.latency.Observe(took.Seconds())
}

type requestKey struct {
	op    string
	errno syscall.Errno
}

type requestSeries struct {
	count   prometheus.Counter
	latency prometheus.Observer
}

// errnoLabel names errno as C does ("ENOENT"), "0" for success.
func errnoLabel(errno syscall.Errno) string {
	if errno == 0 {
		return "0"
	}
	if name := unix.ErrnoName(errno); name != "" {
		return name
	}
	return strconv.Itoa(int(errno))
}
