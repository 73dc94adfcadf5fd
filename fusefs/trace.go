package fusefs

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/tracing"
)

// tracedSink makes a span of each record the mount keeps while it serves a
// call sampled for it (tracing.SampleFUSE), as a child of the call's span:
// one for each operation the audit records (an open, a create, a rename, a
// refusal, the release of an open with what was read and written through
// it), never one per read(2) or write(2). Other calls cost a pointer load
// per record.
type tracedSink struct {
	audit.Sink
	f *fsys
}

func (s tracedSink) Record(ctx context.Context, e audit.Event) error {
	err := s.Sink.Record(ctx, e)
	if c := s.f.servedCall(); c.traced {
		traceRecord(ctx, c.Trace, e)
	}
	return err
}

// traceUnrecorded makes the span of an operation at rel that took took
// and that the audit keeps no record of (an open that read nothing), for
// a call sampled as tracedSink's are. An open for reading gets one span,
// from the open to its release: its release record's, or this one.
func (f *fsys) traceUnrecorded(ctx context.Context, op, rel string, took time.Duration) {
	if c := f.servedCall(); c.traced {
		traceRecord(ctx, c.Trace, audit.Event{Op: op, Path: rel, Result: "ok", Duration: took})
	}
}

func traceRecord(ctx context.Context, parent trace.SpanContext, e audit.Event) {
	end := time.Now()
	_, span := tracing.StartAt(trace.ContextWithSpanContext(ctx, parent), "fuse "+e.Op, end.Add(-e.Duration),
		attribute.String("loomfs.path", e.Path), attribute.String("loomfs.result", e.Result))
	if e.Code != "" {
		span.SetAttributes(attribute.String("loomfs.code", e.Code))
	}
	if pid, ok := e.Detail["pid"]; ok {
		if p, ok := pid.(uint32); ok {
			span.SetAttributes(attribute.Int("process.pid", int(p)))
		}
	}
	if e.Result == "refused" || e.Result == "error" {
		span.SetStatus(codes.Error, e.Code)
	}
	span.End(trace.WithTimestamp(end))
}
