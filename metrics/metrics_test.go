package metrics

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http/httptest"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/agentloom/loomfs/audit"
)

var actor = audit.Actor{Space: "acme", Agent: "coder", Session: "s1"}

// TestSinkCounts: each audited event is counted once, under its door,
// operation, result and code, and passed on unchanged.
func TestSinkCounts(t *testing.T) {
	cases := []struct {
		name  string
		event audit.Event
		check func(r *Registry) float64
		want  float64
	}{
		{"a tool call is counted by tool, result and code",
			audit.Event{Source: audit.SourceTool, Op: "workspace_write", Result: "ok", Duration: time.Millisecond, Actor: actor},
			func(r *Registry) float64 {
				return testutil.ToFloat64(r.toolCalls.WithLabelValues("workspace_write", "ok", ""))
			}, 1},
		{"a tool call's latency is observed",
			audit.Event{Source: audit.SourceTool, Op: "workspace_read", Result: "ok", Duration: 3 * time.Millisecond, Actor: actor},
			func(r *Registry) float64 { return float64(testutil.CollectAndCount(r.toolSeconds)) }, 1},
		{"a change's started record is not counted",
			audit.Event{Source: audit.SourceTool, Op: "workspace_write", Result: "started", Actor: actor},
			func(r *Registry) float64 {
				return testutil.ToFloat64(r.toolCalls.WithLabelValues("workspace_write", "started", ""))
			}, 0},
		{"a refused FUSE operation counts a refusal of the fuse door",
			audit.Event{Source: audit.SourceFUSE, Op: "link", Result: "refused", Code: "link_unsupported", Actor: actor},
			func(r *Registry) float64 {
				return testutil.ToFloat64(r.refusals.WithLabelValues("fuse", "link_unsupported"))
			}, 1},
		{"a refused FUSE operation is an operation too",
			audit.Event{Source: audit.SourceFUSE, Op: "link", Result: "refused", Code: "link_unsupported", Actor: actor},
			func(r *Registry) float64 {
				return testutil.ToFloat64(r.fuseOps.WithLabelValues("link", "refused", "link_unsupported"))
			}, 1},
		{"a throttle record adds its waits",
			audit.Event{Source: audit.SourceFUSE, Op: "throttle", Result: "ok", Duration: 2 * time.Second, Actor: actor, Detail: map[string]any{"waits": int64(7)}},
			func(r *Registry) float64 { return testutil.ToFloat64(r.throttled) }, 7},
		{"a throttle record adds its seconds",
			audit.Event{Source: audit.SourceFUSE, Op: "throttle", Result: "ok", Duration: 2 * time.Second, Actor: actor, Detail: map[string]any{"waits": int64(7)}},
			func(r *Registry) float64 { return testutil.ToFloat64(r.throttledSec) }, 2},
		{"a sandbox event is counted by event",
			audit.Event{Source: audit.SourceSandbox, Op: "container_start", Result: "ok", Actor: actor},
			func(r *Registry) float64 { return testutil.ToFloat64(r.sandbox.WithLabelValues("container_start")) }, 1},
		{"a platform refusal counts under its door",
			audit.Event{Source: audit.SourcePlatform, Op: "stage", Result: "refused", Code: "no_space", Actor: actor},
			func(r *Registry) float64 {
				return testutil.ToFloat64(r.refusals.WithLabelValues("platform", "no_space"))
			}, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := New(Options{})
			var got []audit.Event
			s := r.Sink(sinkFunc(func(e audit.Event) { got = append(got, e) }))
			if err := s.Record(context.Background(), c.event); err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || got[0].Op != c.event.Op {
				t.Fatalf("passed on %v, want the event once", got)
			}
			if v := c.check(r); v != c.want {
				t.Errorf("got %v, want %v", v, c.want)
			}
		})
	}
}

type sinkFunc func(audit.Event)

func (f sinkFunc) Record(_ context.Context, e audit.Event) error { f(e); return nil }

// TestSandboxStartLatency: a container's start is timed from its create
// record to its start record, one observation per container.
func TestSandboxStartLatency(t *testing.T) {
	r := New(Options{})
	s := r.Sink(audit.Discard)
	rec := func(op, name string) {
		s.Record(context.Background(), audit.Event{Source: audit.SourceSandbox, Op: op, Result: "ok", Actor: actor, Detail: map[string]any{"container": name}})
	}
	rec("container_create", "c1")
	rec("container_create", "c2")
	time.Sleep(10 * time.Millisecond)
	rec("container_start", "c1")
	rec("container_start_failed", "c2")
	rec("container_start", "c1") // a second start record of c1 is not a start
	rec("container_start", "c3") // nor one whose create was not seen
	if n := testutil.CollectAndCount(r.starts.latency); n != 1 {
		t.Fatalf("%d histograms", n)
	}
	body := exposition(t, r)
	if !strings.Contains(body, "loomfs_sandbox_start_duration_seconds_count 2") {
		t.Errorf("want two starts observed:\n%s", body)
	}
	if strings.Contains(body, `loomfs_sandbox_start_duration_seconds_bucket{le="0.005"} 1`) || strings.Contains(body, `loomfs_sandbox_start_duration_seconds_bucket{le="0.005"} 2`) {
		t.Errorf("a start of 10 ms counted under 5 ms")
	}
}

func exposition(t *testing.T, r *Registry) string {
	t.Helper()
	srv := httptest.NewServer(r.Handler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestRequestCounts: a mount's requests are counted by opcode and errno
// name.
func TestRequestCounts(t *testing.T) {
	r := New(Options{})
	for range 3 {
		r.ObserveRequest("CREATE", 0, time.Millisecond)
	}
	r.ObserveRequest("LOOKUP", syscall.ENOENT, time.Microsecond)
	if v := testutil.ToFloat64(r.fuseRequests.WithLabelValues("CREATE", "0")); v != 3 {
		t.Errorf("CREATE: %v, want 3", v)
	}
	if v := testutil.ToFloat64(r.fuseRequests.WithLabelValues("LOOKUP", "ENOENT")); v != 1 {
		t.Errorf("LOOKUP ENOENT: %v, want 1", v)
	}
}

// TestScopeSeriesBounded: 1,000 scopes touched once each leave at most
// the configured number of per-scope series, while the node's totals
// count every operation.
func TestScopeSeriesBounded(t *testing.T) {
	const max = 50
	r := New(Options{MaxScopes: max})
	s := r.Sink(audit.Discard)
	for i := range 1000 {
		a := audit.Actor{Space: "acme", Agent: "coder", Session: fmt.Sprintf("s%d", i)}
		s.Record(context.Background(), audit.Event{Source: audit.SourceFUSE, Op: "create", Result: "ok", Actor: a})
	}
	scopes := map[string]bool{}
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	series := 0
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "loomfs_scope_") {
			continue
		}
		for _, m := range mf.GetMetric() {
			series++
			for _, l := range m.GetLabel() {
				if l.GetName() == "scope" {
					scopes[l.GetValue()] = true
				}
			}
		}
	}
	if len(scopes) != max {
		t.Errorf("%d scopes have series, want %d", len(scopes), max)
	}
	// ops, refusals and throttle seconds: three series a scope.
	if series > 3*max {
		t.Errorf("%d per-scope series, want at most %d", series, 3*max)
	}
	if v := testutil.ToFloat64(r.fuseOps.WithLabelValues("create", "ok", "")); v != 1000 {
		t.Errorf("node total %v, want 1000", v)
	}
	// The most recent scopes are the ones kept.
	if !scopes["acme/coder/s999"] || scopes["acme/coder/s0"] {
		t.Errorf("kept the wrong scopes: s999 %v, s0 %v", scopes["acme/coder/s999"], scopes["acme/coder/s0"])
	}
}

// TestScopeSeriesExpire: a scope quiet for longer than the window loses
// its series; the node's totals stay.
func TestScopeSeriesExpire(t *testing.T) {
	r := New(Options{ScopeWindow: time.Minute})
	now := time.Now()
	r.scopes.now = func() time.Time { return now }
	r.Sink(audit.Discard).Record(context.Background(), audit.Event{Source: audit.SourceTool, Op: "workspace_read", Result: "ok", Actor: actor})
	if n := testutil.CollectAndCount(r.scopes, "loomfs_scope_operations_total"); n != 1 {
		t.Fatalf("%d series while active, want 1", n)
	}
	now = now.Add(2 * time.Minute)
	if n := testutil.CollectAndCount(r.scopes, "loomfs_scope_operations_total"); n != 0 {
		t.Errorf("%d series after the window, want 0", n)
	}
	if v := testutil.ToFloat64(r.toolCalls.WithLabelValues("workspace_read", "ok", "")); v != 1 {
		t.Errorf("node total %v, want 1", v)
	}
}

// TestAuditLogState: a real queued audit log wrapped by the sink is read
// at scrape time: the records it wrote, and none once it is closed and
// forgotten, without the total going down.
func TestAuditLogState(t *testing.T) {
	log, err := audit.Open(t.TempDir(), audit.Options{Queue: audit.DefaultQueue})
	if err != nil {
		t.Fatal(err)
	}
	r := New(Options{})
	s := r.Sink(log)
	for range 5 {
		if err := s.Record(context.Background(), audit.Event{Source: audit.SourceFUSE, Op: "create", Result: "ok", Actor: actor}); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for log.Status().Queued > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	written := float64(log.Status().Records)
	if written < 5 {
		t.Fatalf("log wrote %v records, want at least 5", written)
	}
	if v := gathered(t, r, "loomfs_audit_records_written_total"); v != written {
		t.Errorf("records written %v, want %v", v, written)
	}
	if err := log.Close(); err != nil {
		t.Fatal(err)
	}
	closed := float64(log.Status().Records)
	if v := gathered(t, r, "loomfs_audit_records_written_total"); v != closed {
		t.Errorf("after close: %v, want %v", v, closed)
	}
	if v := gathered(t, r, "loomfs_audit_records_written_total"); v != closed {
		t.Errorf("after close, scraped again: %v, want %v (it must not go down)", v, closed)
	}
	if len(r.logs) != 0 {
		t.Errorf("%d logs still watched after close", len(r.logs))
	}
}

func gathered(t *testing.T, r *Registry, name string) float64 {
	t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		m := mf.GetMetric()[0]
		if c := m.GetCounter(); c != nil {
			return c.GetValue()
		}
		return m.GetGauge().GetValue()
	}
	t.Fatalf("no %s", name)
	return 0
}

// TestExpositionPassesPromtool: what /metrics serves, with every kind of
// series present, passes Prometheus's own linter.
func TestExpositionPassesPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found: install Debian's prometheus package (scripts/setup does)")
	}
	r := New(Options{})
	s := r.Sink(audit.Discard)
	s.Record(context.Background(), audit.Event{Source: audit.SourceTool, Op: "workspace_write", Result: "refused", Code: "quota_exceeded", Duration: time.Millisecond, Actor: actor})
	s.Record(context.Background(), audit.Event{Source: audit.SourceFUSE, Op: "throttle", Result: "ok", Duration: time.Second, Actor: actor, Detail: map[string]any{"waits": int64(1)}})
	s.Record(context.Background(), audit.Event{Source: audit.SourceSandbox, Op: "container_start", Result: "ok", Actor: actor})
	r.ObserveRequest("GETATTR", 0, time.Microsecond)
	r.WatchChecks(func() []Check { return []Check{{Target: "volume", OK: true, Time: time.Now(), Took: time.Millisecond}} })
	r.WatchQuarantines(func() ([]Quarantine, error) {
		return []Quarantine{{Scope: "acme/coder/s2", Reason: "worker died"}}, nil
	})
	r.WatchSandboxes(func() (int, int) { return 1, 2 })
	r.WatchJournalFollow(func() (time.Time, bool) { return time.Now().Add(-time.Second), true })
	r.WatchVolume(func() (Volume, error) { return Volume{Size: 100, Available: 5, Files: 10, FilesFree: 1}, nil })
	r.WatchAuditSeal(func() (time.Time, bool, error) { return time.Now(), true, nil })
	r.Fenced(time.Now())
	stop := r.WatchQuota("acme/coder/s1", func() (int64, int64, bool) { return 10, 100, true })
	defer stop()

	srv := httptest.NewServer(r.Handler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, name := range []string{"loomfs_self_check_ok", "loomfs_quarantine{", "loomfs_scope_quota_limit_bytes", "loomfs_audit_last_seal_timestamp_seconds", "loomfs_session_processes_running", "loomfs_build_info", "loomfs_volume_available_bytes", "loomfs_journal_follow_lag_seconds", "loomfs_node_fenced 1", "loomfs_node_fenced_timestamp_seconds"} {
		if !bytes.Contains(body, []byte(name)) {
			t.Errorf("exposition lacks %s", name)
		}
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = bytes.NewReader(body)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}

// TestNodeFenced: loomfs_node_fenced is absent until the process watches
// a shared volume for its fence, 0 while it watches and its node is not
// fenced, and 1 with the time it saw the fence once it is; the first time
// stays.
func TestNodeFenced(t *testing.T) {
	r := New(Options{})
	srv := httptest.NewServer(r.Handler())
	defer srv.Close()
	scrape := func() string {
		t.Helper()
		resp, err := srv.Client().Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		var lines []string
		for _, l := range strings.Split(string(body), "\n") {
			if strings.HasPrefix(l, "loomfs_node_fenced") {
				lines = append(lines, l)
			}
		}
		return strings.Join(lines, "\n")
	}
	if got := scrape(); got != "" {
		t.Errorf("before the process watches: %q, want no series", got)
	}
	r.WatchingFence()
	if got := scrape(); got != "loomfs_node_fenced 0" {
		t.Errorf("while watching: %q, want loomfs_node_fenced 0", got)
	}
	at := time.Unix(1700000000, 500e6)
	r.Fenced(at)
	r.Fenced(at.Add(time.Minute))
	want := "loomfs_node_fenced 1\nloomfs_node_fenced_timestamp_seconds 1.7000000005e+09"
	if got := scrape(); got != want {
		t.Errorf("once fenced: %q, want %q", got, want)
	}
}

// fakeLog is an audit log as the registry sees it: its status.
type fakeLog struct{ st audit.Status }

func (f *fakeLog) Record(context.Context, audit.Event) error { return nil }
func (f *fakeLog) Status() audit.Status                      { return f.st }

// TestClosedLogsForgotten: logs opened and closed one after another (a
// session each) are not kept for good by a registry nobody scrapes, and
// what they wrote stays in the total.
func TestClosedLogsForgotten(t *testing.T) {
	r := New(Options{})
	for range 1000 {
		l := &fakeLog{}
		r.Sink(l)
		l.st = audit.Status{Closed: true, Records: 2}
	}
	r.mu.Lock()
	n := len(r.logs)
	r.mu.Unlock()
	if n > 64 {
		t.Errorf("%d logs kept, want at most 64", n)
	}
	if v := gathered(t, r, "loomfs_audit_records_written_total"); v != 2000 {
		t.Errorf("records written %v, want 2000", v)
	}
}

// TestScopeQuotaOf: an active scope no watch reports has its quota read
// through QuotaOf; a watch wins over it; an account that can't be read
// leaves no series, and one that does not answer in time is left out of
// the scrape instead of holding it up.
func TestScopeQuotaOf(t *testing.T) {
	r := New(Options{})
	slow := make(chan struct{})
	t.Cleanup(func() { close(slow) })
	r.QuotaOf(func(scope string) (int64, int64, bool) {
		switch scope {
		case "acme/coder/read":
			return 7, 100, true
		case "acme/coder/slow":
			<-slow
			return 1, 1, true
		}
		return 0, 0, false
	})
	stop := r.WatchQuota("acme/coder/watched", func() (int64, int64, bool) { return 3, 0, true })
	defer stop()
	sink := r.Sink(audit.Discard)
	for _, s := range []string{"read", "slow", "unread", "watched"} {
		a := audit.Actor{Space: "acme", Agent: "coder", Session: s}
		sink.Record(context.Background(), audit.Event{Source: audit.SourceTool, Op: "workspace_write", Result: "ok", Actor: a})
	}
	old := quotaReadWait
	quotaReadWait = 200 * time.Millisecond
	t.Cleanup(func() { quotaReadWait = old })
	start := time.Now()
	out := exposition(t, r)
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the scrape waited %v for a slow account", took)
	}
	for _, want := range []string{
		`loomfs_scope_quota_used_bytes{scope="acme/coder/read"} 7`,
		`loomfs_scope_quota_limit_bytes{scope="acme/coder/read"} 100`,
		`loomfs_scope_quota_used_bytes{scope="acme/coder/watched"} 3`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("exposition lacks %s:\n%s", want, out)
		}
	}
	for _, absent := range []string{
		`loomfs_scope_quota_used_bytes{scope="acme/coder/unread"}`,
		`loomfs_scope_quota_used_bytes{scope="acme/coder/slow"}`,
		`loomfs_scope_quota_limit_bytes{scope="acme/coder/watched"}`,
	} {
		if strings.Contains(out, absent) {
			t.Errorf("exposition has %s:\n%s", absent, out)
		}
	}
}
