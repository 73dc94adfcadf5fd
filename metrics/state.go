package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/agentloom/loomfs/audit"
)

// statuser is an audit log whose state is read at scrape time.
type statuser interface{ Status() audit.Status }

// Quarantine is one quarantined scope, as the volume's markers say.
type Quarantine struct {
	Scope, Reason string
}

// Check is the last outcome of one self-check target.
type Check struct {
	Target string        // "volume", or the scope a mount serves
	OK     bool          // the last probe passed
	Time   time.Time     // when it ended
	Took   time.Duration // how long it took
}

var (
	auditQueued = prometheus.NewDesc("loomfs_audit_queue_depth",
		"Audit records accepted by the node's open logs and not yet written.", nil, nil)
	auditRecords = prometheus.NewDesc("loomfs_audit_records_written_total",
		"Audit records (checkpoints included) this process's logs wrote.", nil, nil)
	auditFailed = prometheus.NewDesc("loomfs_audit_write_failures_total",
		"Writes of queued audit records that failed (each is retried).", nil, nil)
	auditUp = prometheus.NewDesc("loomfs_audit_writable",
		"1 if every open audit log's last write succeeded, 0 if one is failing (operations are then refused: audit_unavailable).", nil, nil)
	auditSeal = prometheus.NewDesc("loomfs_audit_last_seal_timestamp_seconds",
		"When this node's audit ledger was last sealed (signed), in Unix seconds; absent without a node key.", nil, nil)
	quarantined = prometheus.NewDesc("loomfs_quarantined_scopes",
		"Scopes of the volume quarantined now: writes and commands are refused until an administrator clears them.", nil, nil)
	quarantine = prometheus.NewDesc("loomfs_quarantine",
		"1 for each quarantined scope, with the reason its marker gives.", []string{"scope", "reason"}, nil)
	sandboxes = prometheus.NewDesc("loomfs_session_sandboxes",
		"Session sandbox containers this node runs.", nil, nil)
	processes = prometheus.NewDesc("loomfs_session_processes_running",
		"Processes running in this node's session sandboxes.", nil, nil)
	checkOK = prometheus.NewDesc("loomfs_self_check_ok",
		"1 if the target's last self-check (write, read back, delete a probe file) passed, 0 if it failed.", []string{"target"}, nil)
	checkTime = prometheus.NewDesc("loomfs_self_check_timestamp_seconds",
		"When the target's last self-check ended, in Unix seconds.", []string{"target"}, nil)
	checkTook = prometheus.NewDesc("loomfs_self_check_duration_seconds",
		"How long the target's last self-check took.", []string{"target"}, nil)
	volSize = prometheus.NewDesc("loomfs_volume_size_bytes",
		"Size of the filesystem the volume is on.", nil, nil)
	volAvail = prometheus.NewDesc("loomfs_volume_available_bytes",
		"Bytes of the volume's filesystem loomfs's service user may still use.", nil, nil)
	volFiles = prometheus.NewDesc("loomfs_volume_files",
		"Inodes of the volume's filesystem.", nil, nil)
	volFilesFree = prometheus.NewDesc("loomfs_volume_files_free",
		"Inodes of the volume's filesystem still free.", nil, nil)
	followLag = prometheus.NewDesc("loomfs_journal_follow_lag_seconds",
		"Time since the mount last read its scope's change journals to drop what other doors and nodes changed from the kernel's caches (read every few hundred milliseconds; more means its follower is stuck).", nil, nil)
	nodeFenced = prometheus.NewDesc("loomfs_node_fenced",
		"1 once the shared volume shut this node out (loomfs fence: its storage client answers ESHUTDOWN, or the volume records its fence), 0 while the process watches and it was not; absent where the volume is not shared.", nil, nil)
	nodeFencedAt = prometheus.NewDesc("loomfs_node_fenced_timestamp_seconds",
		"When this process saw the fence of its node, in Unix seconds; absent until then.", nil, nil)
	stateErr = prometheus.NewDesc("loomfs_state_read_errors_total",
		"Scrapes that could not read a piece of state (quarantines, audit heads), by what.", []string{"what"}, nil)
)

// stateCollector reads the node's state when Prometheus scrapes.
type stateCollector struct{ r *Registry }

func (c stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{auditQueued, auditRecords, auditFailed, auditUp, auditSeal,
		quarantined, quarantine, sandboxes, processes, checkOK, checkTime, checkTook,
		volSize, volAvail, volFiles, volFilesFree, followLag, nodeFenced, nodeFencedAt, stateErr} {
		ch <- d
	}
}

func (c stateCollector) Collect(ch chan<- prometheus.Metric) {
	r := c.r
	r.mu.Lock()
	r.pruneLogs()
	queued, records, failed, up := 0.0, r.closedRecords, r.closedFailed, 1.0
	for _, l := range r.logs {
		st := l.Status()
		queued += float64(st.Queued)
		records += float64(st.Records)
		failed += float64(st.Failed)
		if st.Err != nil {
			up = 0
		}
	}
	state := r.stateFuncs
	fence := r.fence
	r.mu.Unlock()

	ch <- prometheus.MustNewConstMetric(auditQueued, prometheus.GaugeValue, queued)
	ch <- prometheus.MustNewConstMetric(auditRecords, prometheus.CounterValue, records)
	ch <- prometheus.MustNewConstMetric(auditFailed, prometheus.CounterValue, failed)
	ch <- prometheus.MustNewConstMetric(auditUp, prometheus.GaugeValue, up)

	if state.seal != nil {
		if s, err := state.seal(); err != nil {
			r.readErr("audit_heads")
		} else if s.ok {
			ch <- prometheus.MustNewConstMetric(auditSeal, prometheus.GaugeValue, float64(s.at.UnixNano())/1e9)
		}
	}
	if state.quarantines != nil {
		qs, err := state.quarantines()
		if err != nil {
			r.readErr("quarantines")
		} else {
			ch <- prometheus.MustNewConstMetric(quarantined, prometheus.GaugeValue, float64(len(qs)))
			for i, q := range qs {
				if i == r.maxScopes {
					break // bounded like every per-scope series
				}
				ch <- prometheus.MustNewConstMetric(quarantine, prometheus.GaugeValue, 1, q.Scope, q.Reason)
			}
		}
	}
	if state.sandboxes != nil {
		boxes, procs := state.sandboxes()
		ch <- prometheus.MustNewConstMetric(sandboxes, prometheus.GaugeValue, float64(boxes))
		ch <- prometheus.MustNewConstMetric(processes, prometheus.GaugeValue, float64(procs))
	}
	if state.volume != nil {
		if v, err := state.volume(); err != nil {
			r.readErr("volume")
		} else {
			ch <- prometheus.MustNewConstMetric(volSize, prometheus.GaugeValue, float64(v.Size))
			ch <- prometheus.MustNewConstMetric(volAvail, prometheus.GaugeValue, float64(v.Available))
			ch <- prometheus.MustNewConstMetric(volFiles, prometheus.GaugeValue, float64(v.Files))
			ch <- prometheus.MustNewConstMetric(volFilesFree, prometheus.GaugeValue, float64(v.FilesFree))
		}
	}
	if state.follow != nil {
		if t, ok := state.follow(); ok {
			ch <- prometheus.MustNewConstMetric(followLag, prometheus.GaugeValue, time.Since(t).Seconds())
		}
	}
	if fence.watched {
		v := 0.0
		if !fence.at.IsZero() {
			v = 1
			ch <- prometheus.MustNewConstMetric(nodeFencedAt, prometheus.GaugeValue, float64(fence.at.UnixNano())/1e9)
		}
		ch <- prometheus.MustNewConstMetric(nodeFenced, prometheus.GaugeValue, v)
	}
	if state.checks != nil {
		for _, ck := range state.checks() {
			ok := 0.0
			if ck.OK {
				ok = 1
			}
			ch <- prometheus.MustNewConstMetric(checkOK, prometheus.GaugeValue, ok, ck.Target)
			ch <- prometheus.MustNewConstMetric(checkTime, prometheus.GaugeValue, float64(ck.Time.UnixNano())/1e9, ck.Target)
			ch <- prometheus.MustNewConstMetric(checkTook, prometheus.GaugeValue, ck.Took.Seconds(), ck.Target)
		}
	}
	r.mu.Lock()
	for what, n := range r.readErrs {
		ch <- prometheus.MustNewConstMetric(stateErr, prometheus.CounterValue, n, what)
	}
	r.mu.Unlock()
}

// pruneLogs forgets the closed logs, keeping what they wrote in the
// totals. The caller holds r.mu.
func (r *Registry) pruneLogs() {
	open := r.logs[:0]
	for _, l := range r.logs {
		if st := l.Status(); st.Closed {
			r.closedRecords += float64(st.Records)
			r.closedFailed += float64(st.Failed)
			continue
		}
		open = append(open, l)
	}
	clear(r.logs[len(open):])
	r.logs = open
}

func (r *Registry) readErr(what string) {
	r.mu.Lock()
	r.readErrs[what]++
	r.mu.Unlock()
}

// stateFuncs are the status functions read at scrape time.
type stateFuncs struct {
	seal        func() (sealed, error)
	quarantines func() ([]Quarantine, error)
	sandboxes   func() (boxes, procs int)
	checks      func() []Check
	volume      func() (Volume, error)
	follow      func() (time.Time, bool)
}

// fenceState is what the process's fence watcher said.
type fenceState struct {
	watched bool      // WatchingFence was called: the volume is shared
	at      time.Time // when Fenced was called; zero while not fenced
}

// WatchingFence says the process watches whether its node is fenced from
// a shared volume (store.WatchFence): loomfs_node_fenced is 0 from then
// on, until Fenced.
func (r *Registry) WatchingFence() {
	r.mu.Lock()
	r.fence.watched = true
	r.mu.Unlock()
}

// Fenced says the process's fence watcher found this node fenced:
// loomfs_node_fenced is 1 from then on (a fence is lifted only by
// re-admitting the node and starting its loomfs afresh). The first call
// sets the time.
func (r *Registry) Fenced(at time.Time) {
	r.mu.Lock()
	r.fence.watched = true
	if r.fence.at.IsZero() {
		r.fence.at = at
	}
	r.mu.Unlock()
}

// WatchJournalFollow reports how long ago a mount last read its scope's
// change journals, as fn tells (fusefs.Mounted.JournalRead).
func (r *Registry) WatchJournalFollow(fn func() (time.Time, bool)) {
	r.mu.Lock()
	r.stateFuncs.follow = fn
	r.mu.Unlock()
}

// Volume is the space of the filesystem the volume is on.
type Volume struct {
	Size, Available  uint64 // bytes
	Files, FilesFree uint64 // inodes
}

// WatchVolume reports the volume's space as fn reads it (a statfs).
func (r *Registry) WatchVolume(fn func() (Volume, error)) {
	r.mu.Lock()
	r.stateFuncs.volume = fn
	r.mu.Unlock()
}

// WatchAuditSeal reports the time this node's audit ledger was last
// sealed, as fn reads it (from the ledger, at most every few seconds).
func (r *Registry) WatchAuditSeal(fn func() (t time.Time, sealed bool, err error)) {
	r.mu.Lock()
	r.stateFuncs.seal = cached(15*time.Second, func() (sealed, error) {
		t, ok, err := fn()
		return sealed{t, ok}, err
	})
	r.mu.Unlock()
}

// WatchQuarantines reports the volume's quarantined scopes as fn lists
// them, at most every few seconds (a list reads a file per scope).
func (r *Registry) WatchQuarantines(fn func() ([]Quarantine, error)) {
	r.mu.Lock()
	r.stateFuncs.quarantines = cached(15*time.Second, fn)
	r.mu.Unlock()
}

// WatchSandboxes reports the node's session sandboxes and their running
// processes as fn counts them.
func (r *Registry) WatchSandboxes(fn func() (boxes, procs int)) {
	r.mu.Lock()
	r.stateFuncs.sandboxes = fn
	r.mu.Unlock()
}

// WatchChecks reports the last self-check of each target fn gives.
func (r *Registry) WatchChecks(fn func() []Check) {
	r.mu.Lock()
	r.stateFuncs.checks = fn
	r.mu.Unlock()
}

// WatchQuota reports scope's quota use and limit (0: unlimited), as fn
// reads them, while the scope has per-scope series; stop ends it.
func (r *Registry) WatchQuota(scope string, fn func() (used, limit int64, ok bool)) (stop func()) {
	return r.scopes.watchQuota(scope, fn)
}

// QuotaOf reads the quota use and limit (0: unlimited) of an active scope
// no WatchQuota reports, by its name (SPACE/AGENT/SESSION[/RUN/INSTANCE]):
// the scopes the tool door opens for a call and closes after it. Set it
// before the registry is scraped.
func (r *Registry) QuotaOf(fn func(scope string) (used, limit int64, ok bool)) {
	r.scopes.mu.Lock()
	r.scopes.quotaOf = fn
	r.scopes.mu.Unlock()
}

type sealed struct {
	at time.Time
	ok bool
}

// cached calls fn at most once every d, answering from its last result
// in between: the state it reads is files on the volume.
func cached[T any](d time.Duration, fn func() (T, error)) func() (T, error) {
	var mu sync.Mutex
	var at time.Time
	var v T
	var err error
	return func() (T, error) {
		mu.Lock()
		defer mu.Unlock()
		if at.IsZero() || time.Since(at) >= d {
			v, err = fn()
			at = time.Now()
		}
		return v, err
	}
}
