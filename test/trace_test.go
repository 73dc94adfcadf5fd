package test

import (
	"compress/gzip"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync"
	"testing"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpReceiver is an OTLP/HTTP trace receiver: it decodes the protocol's
// protobuf requests, as a collector does, and keeps every span.
type otlpReceiver struct {
	mu    sync.Mutex
	spans []*tracepb.Span
	bad   []string
}

func (r *otlpReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body := io.Reader(req.Body)
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	b, err := io.ReadAll(body)
	var msg collectortrace.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(b, &msg)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf" || err != nil {
		r.bad = append(r.bad, req.URL.Path+" "+req.Header.Get("Content-Type")+" "+strings.TrimSpace(func() string {
			if err != nil {
				return err.Error()
			}
			return ""
		}()))
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	for _, rs := range msg.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			r.spans = append(r.spans, ss.Spans...)
		}
	}
	out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(out)
}

func (r *otlpReceiver) received() ([]*tracepb.Span, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*tracepb.Span(nil), r.spans...), append([]string(nil), r.bad...)
}

// A command run under the platform's traceparent is one trace at the OTLP
// receiver: the tool call's span continues the platform's, the sandbox run
// and its container's create, start, wait and remove are below it, and the
// files the command's processes made through the projection are spans
// under the call too. The audit query for the trace id shows the call end
// to end, through both doors.
func TestTraceEndToEnd(t *testing.T) {
	recv := &otlpReceiver{}
	srv := httptest.NewServer(recv)
	t.Cleanup(srv.Close)
	c := newCLI(t)
	const scope = "sp/ag/trace"
	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	c.tool(scope, "workspace_write", `{"path":"in.txt","content":"x"}`)

	cmd := exec.Command(loomfsBin, "--root", c.root, "tool", "workspace_command", "--scope", scope,
		"--traceparent", "00-"+traceID+"-"+parentID+"-01",
		"--input", `{"command":"cat in.txt > out.txt && echo done"}`)
	cmd.Env = append(cliEnv(), "OTEL_EXPORTER_OTLP_ENDPOINT="+srv.URL, "LOOMFS_TRACE_FUSE=1")
	r := runCmd(t, cmd)
	if r.code != 0 || !strings.Contains(string(r.stdout), "done") {
		t.Fatalf("command: exit %d %s %s", r.code, r.stdout, r.stderr)
	}
	// The process flushes its spans before it exits.
	spans, bad := recv.received()
	if len(bad) > 0 {
		t.Fatalf("the receiver refused requests: %v", bad)
	}
	byName := map[string][]*tracepb.Span{}
	ids := map[string]*tracepb.Span{}
	for _, s := range spans {
		if got := hex.EncodeToString(s.TraceId); got != traceID {
			t.Errorf("span %q is in trace %s, not the platform's %s", s.Name, got, traceID)
		}
		byName[s.Name] = append(byName[s.Name], s)
		ids[hex.EncodeToString(s.SpanId)] = s
	}
	one := func(name string) *tracepb.Span {
		t.Helper()
		if len(byName[name]) != 1 {
			names := make([]string, 0, len(byName))
			for n := range byName {
				names = append(names, n)
			}
			t.Fatalf("want one span %q, got %d; spans: %v", name, len(byName[name]), names)
		}
		return byName[name][0]
	}
	for name, ss := range byName {
		t.Logf("%d span(s) %q", len(ss), name)
	}
	parentOf := func(s *tracepb.Span) string { return hex.EncodeToString(s.ParentSpanId) }
	tool := one("tool workspace_command")
	if parentOf(tool) != parentID {
		t.Errorf("the tool call's parent is %s, not the platform's span %s", parentOf(tool), parentID)
	}
	run := one("sandbox run")
	if parentOf(run) != hex.EncodeToString(tool.SpanId) {
		t.Errorf("sandbox run's parent is %s, not the tool call", parentOf(run))
	}
	for _, name := range []string{"container create", "container start", "container wait", "container remove"} {
		if s := one(name); parentOf(s) != hex.EncodeToString(run.SpanId) {
			t.Errorf("%s's parent is %s, not the sandbox run", name, parentOf(s))
		}
	}
	// One span for each audited operation, and one for each open for
	// reading, from the open to its release: the release's, with what was
	// read, or an open's when nothing was.
	var reads int
	for _, s := range append(byName["fuse open"], byName["fuse release"]...) {
		for _, a := range s.Attributes {
			if a.Key == "loomfs.path" && a.Value.GetStringValue() == "in.txt" {
				reads++
			}
		}
	}
	if reads != 1 {
		t.Errorf("%d spans for the projection's one open of in.txt among %d fuse open and %d fuse release spans, want 1", reads, len(byName["fuse open"]), len(byName["fuse release"]))
	}
	var created bool
	for _, s := range byName["fuse create"] {
		for _, a := range s.Attributes {
			if a.Key == "loomfs.path" && a.Value.GetStringValue() == "out.txt" {
				created = true
				if parentOf(s) != hex.EncodeToString(tool.SpanId) {
					t.Errorf("the projection's create of out.txt has parent %s, not the tool call", parentOf(s))
				}
			}
		}
	}
	if !created {
		t.Errorf("no span for the projection's create of out.txt among %d fuse spans", len(byName["fuse create"]))
	}
	if len(byName["fuse read"])+len(byName["fuse write"]) > 0 {
		t.Errorf("spans per read(2) or write(2): %d reads, %d writes", len(byName["fuse read"]), len(byName["fuse write"]))
	}

	// The audit, by trace id: the tool's records and the projection's.
	q := c.run("", "--json", "audit", "query", "--trace", traceID)
	if q.code != 0 {
		t.Fatalf("audit query --trace: exit %d %s", q.code, q.stderr)
	}
	sources := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(q.stdout)), "\n") {
		var rec struct {
			TraceID string `json:"trace_id"`
			Source  string `json:"source"`
			Path    string `json:"path"`
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("audit query line %q: %v", line, err)
		}
		if rec.TraceID != traceID {
			t.Errorf("audit query --trace returned a record of trace %q", rec.TraceID)
		}
		sources[rec.Source] = true
	}
	if !sources["tool"] || !sources["fuse"] {
		t.Errorf("audit query --trace %s shows sources %v; want the tool's and the projection's records", traceID, sources)
	}
	// Another trace's query shows nothing of this one.
	if q := c.run("", "--json", "audit", "query", "--trace", strings.Repeat("ab", 16)); strings.TrimSpace(string(q.stdout)) != "" {
		t.Errorf("a query for another trace returned records: %s", q.stdout)
	}
	if q := c.run("", "audit", "query", "--trace", "nothex"); q.code != 2 {
		t.Errorf("a malformed --trace: exit %d, want 2 (usage)", q.code)
	}
	if r := c.run("", "tool", "workspace_list", "--scope", scope, "--traceparent", "00-zz-00-01"); r.code != 2 {
		t.Errorf("a malformed --traceparent: exit %d, want 2 (usage): %s", r.code, r.stderr)
	}
}
