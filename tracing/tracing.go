// Package tracing carries loomfs's OpenTelemetry traces. A tool call is a
// span; a command's container create, start and wait are its children; and
// the filesystem operations the command's processes make through its
// projection are theirs, one span for each operation the audit records
// (an open, a create, an unlink: never one per read(2)), sampled by
// LOOMFS_TRACE_FUSE.
//
// Spans leave the process only when the standard OTEL_EXPORTER_OTLP_ENDPOINT
// or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set (OTLP over HTTP, with the
// standard variables for headers, timeouts, sampling and the resource).
// Otherwise the tracer is OpenTelemetry's no-op, whose cost is a context
// lookup, and which still carries a trace the platform started: a W3C
// traceparent handed to loomfs (the Go API's context, loomfs tool
// --traceparent, an MCP request's _meta) is continued, and its trace id is
// in every audit record of the call, so that loomfs audit query --trace ID
// shows the call end to end whether or not anything exports spans.
package tracing

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Name is the instrumentation scope of every span loomfs makes.
const Name = "github.com/agentloom/loomfs"

// FUSEEnv sets the share of calls whose projection's operations get spans
// of their own: 0 (the default) none, 1 every call, a fraction in between
// that share of calls. A call's tool and container spans are not affected.
const FUSEEnv = "LOOMFS_TRACE_FUSE"

// Setup exports spans over OTLP/HTTP when the environment names an
// endpoint, and reports whether it does. shutdown flushes what is queued;
// the caller runs it before the process ends. Without an endpoint it sets
// nothing: the global tracer stays the no-op.
func Setup(ctx context.Context) (shutdown func(context.Context) error, exporting bool, err error) {
	none := func(context.Context) error { return nil }
	otel.SetTextMapPropagator(propagation.TraceContext{})
	if os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
		return none, false, nil
	}
	if os.Getenv("OTEL_SDK_DISABLED") == "true" {
		return none, false, nil
	}
	p := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if p == "" {
		p = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	if p != "" && p != "http/protobuf" {
		return none, false, fmt.Errorf("OTLP protocol %s: loomfs exports traces over OTLP/HTTP only; set OTEL_EXPORTER_OTLP_PROTOCOL to http/protobuf (or unset it), and point the endpoint at the receiver's HTTP port (4318)", p)
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return none, false, fmt.Errorf("OTLP trace exporter: %w", err)
	}
	// The environment (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES) names
	// the service over these defaults.
	version := "(devel)"
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		version = bi.Main.Version
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", "loomfs"), attribute.String("service.version", version)),
		resource.WithHost(), resource.WithFromEnv())
	if err != nil {
		return none, false, fmt.Errorf("trace resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	return tp.Shutdown, true, nil
}

// Start starts a span named name as a child of ctx's span.
func Start(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	return otel.Tracer(Name).Start(ctx, name, trace.WithAttributes(attrs...))
}

// StartAt starts a span named name as a child of ctx's span, begun at
// start: the span of an operation timed before it was known to be traced.
func StartAt(ctx context.Context, name string, start time.Time, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	return otel.Tracer(Name).Start(ctx, name, trace.WithTimestamp(start), trace.WithAttributes(attrs...))
}

// WithTraceparent returns ctx carrying the remote span a W3C traceparent
// names ("00-<trace id>-<parent id>-<flags>"), so that loomfs's spans
// continue the platform's trace. An empty traceparent returns ctx as it is.
func WithTraceparent(ctx context.Context, traceparent string) (context.Context, error) {
	if traceparent == "" {
		return ctx, nil
	}
	carrier := propagation.MapCarrier{"traceparent": strings.TrimSpace(traceparent)}
	out := propagation.TraceContext{}.Extract(ctx, carrier)
	if !trace.SpanContextFromContext(out).IsValid() {
		return ctx, fmt.Errorf("traceparent %q is not a W3C trace context: want 00-<32 hex digits>-<16 hex digits>-<2 hex digits>, not all zero", traceparent)
	}
	return out, nil
}

// Traceparent is the W3C traceparent of ctx's span, "" if it has none: what
// a child process is handed to continue the trace.
func Traceparent(ctx context.Context) string {
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	return carrier["traceparent"]
}

// TraceID is the trace id of ctx's span, "" if it has none.
func TraceID(ctx context.Context) string {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		return sc.TraceID().String()
	}
	return ""
}

// SampleFUSE tells whether a call whose span is parent gets spans for its
// projection's operations (FUSEEnv). Only a sampled parent does: spans of
// an unsampled trace would be dropped anyway.
func SampleFUSE(parent trace.SpanContext) bool {
	if !parent.IsValid() || !parent.IsSampled() {
		return false
	}
	share, err := strconv.ParseFloat(os.Getenv(FUSEEnv), 64)
	if err != nil || share <= 0 {
		return false
	}
	return share >= 1 || rand.Float64() < share
}
