package metrics

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/agentloom/loomfs/audit"
)

// Sink returns a Sink that passes every event to next and counts it: the
// door, operation, result and code of each, the time it took, and the time
// next took to accept it. A next with a Status method (an *audit.Log) is
// also reported at scrape time (queue depth, records written, failures)
// until it is closed.
func (r *Registry) Sink(next audit.Sink) audit.Sink {
	if l, ok := next.(statuser); ok {
		r.mu.Lock()
		if len(r.logs) >= 64 {
			// Not scraped lately: drop the closed ones now.
			r.pruneLogs()
		}
		r.logs = append(r.logs, l)
		r.mu.Unlock()
	}
	return &sink{r: r, next: next}
}

type sink struct {
	r    *Registry
	next audit.Sink
}

func (s *sink) Record(ctx context.Context, e audit.Event) error {
	start := time.Now()
	err := s.next.Record(ctx, e)
	s.r.auditRecord.Observe(time.Since(start).Seconds())
	s.r.observe(e)
	return err
}

// observe counts one event. A change's "started" record is not counted:
// its outcome is, in the record that follows it.
func (r *Registry) observe(e audit.Event) {
	if e.Result == "started" {
		return
	}
	if e.Source == audit.SourceFUSE && e.Op == "throttle" {
		if n, ok := e.Detail["waits"].(int64); ok {
			r.throttled.Add(float64(n))
		}
		r.throttledSec.Add(e.Duration.Seconds())
	} else {
		s := r.eventSeries(e)
		if s.count != nil {
			s.count.Inc()
		}
		if s.latency != nil && e.Duration > 0 {
			s.latency.Observe(e.Duration.Seconds())
		}
		if s.refused != nil {
			s.refused.Inc()
		}
	}
	if e.Source == audit.SourceSandbox {
		r.starts.observe(e)
	}
	r.scopes.touch(e)
}

// startTimes measures a container's start: from its container_create
// record to its container_start (or container_start_failed) one.
type startTimes struct {
	latency prometheus.Histogram
	mu      sync.Mutex
	created map[string]time.Time // by container name
}

// maxStarting bounds the containers remembered between create and start:
// one whose start was never recorded is forgotten when room is needed.
const maxStarting = 1024

func (s *startTimes) observe(e audit.Event) {
	name, _ := e.Detail["container"].(string)
	if name == "" {
		return
	}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	switch e.Op {
	case "container_create":
		if len(s.created) >= maxStarting {
			clear(s.created)
		}
		s.created[name] = now
	case "container_start", "container_start_failed":
		if t, ok := s.created[name]; ok {
			delete(s.created, name)
			s.latency.Observe(now.Sub(t).Seconds())
		}
	}
}

// eventKey is what decides an event's series.
type eventKey struct {
	source           audit.Source
	op, result, code string
}

// eventSeries are the series one kind of event counts in.
type eventSeries struct {
	count, refused prometheus.Counter
	latency        prometheus.Observer
}

// eventSeries looks the series of e's kind up once, not hashing its labels
// again on every event.
func (r *Registry) eventSeries(e audit.Event) eventSeries {
	k := eventKey{e.Source, e.Op, e.Result, e.Code}
	if s, ok := r.events.Load(k); ok {
		return s.(eventSeries)
	}
	op, result, code := labelOf(e.Op), labelOf(e.Result), labelOf(e.Code)
	var s eventSeries
	switch e.Source {
	case audit.SourceTool:
		s.count = r.toolCalls.WithLabelValues(op, result, code)
		s.latency = r.toolSeconds.WithLabelValues(op)
	case audit.SourceFUSE:
		s.count = r.fuseOps.WithLabelValues(op, result, code)
	case audit.SourceSandbox:
		s.count = r.sandbox.WithLabelValues(op)
	}
	if e.Result == "refused" {
		s.refused = r.refusals.WithLabelValues(labelOf(string(e.Source)), code)
	}
	// Kinds past the label budget are not kept: the map stays bounded.
	if op != "other" && result != "other" && code != "other" {
		r.events.Store(k, s)
	}
	return s
}

// labelOf bounds the values a label takes: an operation or code is one
// loomfs names, but a record's op may carry what a caller sent (an unknown
// tool's name); past maxLabelValues distinct ones, the rest are "other".
func labelOf(s string) string {
	if v, ok := known.Load(s); ok {
		return v.(string)
	}
	knownMu.Lock()
	defer knownMu.Unlock()
	if v, ok := known.Load(s); ok {
		return v.(string)
	}
	v := s
	if knownCount >= maxLabelValues || len(s) > 64 {
		v = "other"
	} else {
		knownCount++
	}
	known.Store(s, v)
	return v
}

const maxLabelValues = 512

var (
	known      sync.Map
	knownMu    sync.Mutex
	knownCount int
)

// scopeSet keeps per-scope counts for the scopes active within window, at
// most max of them: Prometheus stores every label set it ever saw, so a
// node that serves thousands of sessions a day must not give each its
// own series for good. A scope that goes quiet loses its series; one that
// comes back starts its counters again (rate() takes that as a reset).
type scopeSet struct {
	window time.Duration
	max    int
	now    func() time.Time

	mu sync.Mutex
	m  map[scopeKey]*scopeCounts

	ops, refused, waited, used, limit *prometheus.Desc
	active                            *prometheus.Desc
	quota                             map[string]func() (used, limit int64, ok bool)
	// quotaOf reads the quota of an active scope no watch reports, for
	// the doors that open a scope per call; nil: none.
	quotaOf func(scope string) (used, limit int64, ok bool)
}

// quotaReadWait bounds how long a scrape waits for the quota accounts it
// reads through quotaOf: a scope whose account is not read in time (its
// ledger locked by a long reconcile) has no quota series in that scrape.
var quotaReadWait = time.Second

// scopeKey names a scope as an event does, so a touch builds no string.
type scopeKey struct {
	actor audit.Actor
	hash  string
}

type scopeCounts struct {
	name    string // the scope's label
	seen    time.Time
	ops     map[audit.Source]float64
	refused float64
	waited  float64 // seconds
}

func newScopeSet(window time.Duration, max int) *scopeSet {
	return &scopeSet{
		window: window, max: max, now: time.Now,
		m:     map[scopeKey]*scopeCounts{},
		quota: map[string]func() (int64, int64, bool){},
		ops: prometheus.NewDesc("loomfs_scope_operations_total",
			"Audited operations of one scope active lately (see loomfs_scopes_active), by door.", []string{"scope", "door"}, nil),
		refused: prometheus.NewDesc("loomfs_scope_refusals_total",
			"Refusals in one scope active lately.", []string{"scope"}, nil),
		waited: prometheus.NewDesc("loomfs_scope_throttle_wait_seconds_total",
			"Time one scope active lately waited for its I/O rate limits.", []string{"scope"}, nil),
		used: prometheus.NewDesc("loomfs_scope_quota_used_bytes",
			"Bytes one scope active lately holds, as its quota account has it.", []string{"scope"}, nil),
		limit: prometheus.NewDesc("loomfs_scope_quota_limit_bytes",
			"The policy's scope_bytes of one scope active lately (absent when unlimited).", []string{"scope"}, nil),
		active: prometheus.NewDesc("loomfs_scopes_active",
			"Scopes with per-scope series now: active within the window, at most the configured number.", nil, nil),
	}
}

// scopeLabel names the scope of e as loomfs names scopes
// (SPACE/AGENT/SESSION[/RUN/INSTANCE]), or by its hash without ids.
func scopeLabel(a audit.Actor, hash string) string {
	switch {
	case a.Space == "":
		return hash
	case a.Run == "":
		return a.Space + "/" + a.Agent + "/" + a.Session
	}
	return a.Space + "/" + a.Agent + "/" + a.Session + "/" + a.Run + "/" + a.Instance
}

func (s *scopeSet) touch(e audit.Event) {
	if e.Actor.Space == "" && e.Scope == "" {
		return
	}
	// The container and operator vary within a scope; the scope is its ids.
	k := scopeKey{audit.Actor{Space: e.Actor.Space, Agent: e.Actor.Agent, Session: e.Actor.Session, Run: e.Actor.Run, Instance: e.Actor.Instance}, ""}
	if e.Actor.Space == "" {
		k.hash = e.Scope
	}
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.m[k]
	if c == nil {
		if len(s.m) >= s.max {
			s.evict(now)
		}
		c = &scopeCounts{name: scopeLabel(k.actor, k.hash), ops: map[audit.Source]float64{}}
		s.m[k] = c
	}
	c.seen = now
	if e.Source == audit.SourceFUSE && e.Op == "throttle" {
		c.waited += e.Duration.Seconds()
		return
	}
	c.ops[e.Source]++
	if e.Result == "refused" {
		c.refused++
	}
}

// evict drops the scopes gone quiet, and then, if none did, the one
// active least recently. The caller holds s.mu.
func (s *scopeSet) evict(now time.Time) {
	var oldest *scopeKey
	var at time.Time
	for k, c := range s.m {
		if now.Sub(c.seen) > s.window {
			delete(s.m, k)
			continue
		}
		if oldest == nil || c.seen.Before(at) {
			oldest, at = &k, c.seen
		}
	}
	if len(s.m) >= s.max && oldest != nil {
		delete(s.m, *oldest)
	}
}

// watchQuota reports scope's quota use while the scope is active; the
// returned func stops it.
func (s *scopeSet) watchQuota(scope string, fn func() (used, limit int64, ok bool)) func() {
	s.mu.Lock()
	s.quota[scope] = fn
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		delete(s.quota, scope)
		s.mu.Unlock()
	}
}

func (s *scopeSet) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{s.ops, s.refused, s.waited, s.used, s.limit, s.active} {
		ch <- d
	}
}

func (s *scopeSet) Collect(ch chan<- prometheus.Metric) {
	now := s.now()
	type quota struct {
		name string
		fn   func() (int64, int64, bool)
	}
	var quotas []quota
	s.mu.Lock()
	for k, c := range s.m {
		if now.Sub(c.seen) > s.window {
			delete(s.m, k)
			continue
		}
		name := c.name
		for door, n := range c.ops {
			ch <- prometheus.MustNewConstMetric(s.ops, prometheus.CounterValue, n, name, string(door))
		}
		ch <- prometheus.MustNewConstMetric(s.refused, prometheus.CounterValue, c.refused, name)
		ch <- prometheus.MustNewConstMetric(s.waited, prometheus.CounterValue, c.waited, name)
		if fn := s.quota[name]; fn != nil {
			quotas = append(quotas, quota{name, fn})
		} else if s.quotaOf != nil {
			quotas = append(quotas, quota{name, func() (int64, int64, bool) { return s.quotaOf(name) }})
		}
	}
	ch <- prometheus.MustNewConstMetric(s.active, prometheus.GaugeValue, float64(len(s.m)))
	s.mu.Unlock()
	// Read outside the lock, side by side and for a bounded time: an
	// account's read touches the volume, and may wait for its ledger.
	type reading struct {
		name        string
		used, limit int64
		ok          bool
	}
	got := make(chan reading, len(quotas))
	for _, q := range quotas {
		go func() {
			used, limit, ok := q.fn()
			got <- reading{q.name, used, limit, ok}
		}()
	}
	wait := time.NewTimer(quotaReadWait)
	defer wait.Stop()
	for range quotas {
		var r reading
		select {
		case r = <-got:
		case <-wait.C:
			return
		}
		if !r.ok {
			continue
		}
		ch <- prometheus.MustNewConstMetric(s.used, prometheus.GaugeValue, float64(r.used), r.name)
		if r.limit > 0 {
			ch <- prometheus.MustNewConstMetric(s.limit, prometheus.GaugeValue, float64(r.limit), r.name)
		}
	}
}
