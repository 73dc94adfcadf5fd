package tracing

import (
	"context"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"
)

func TestWithTraceparent(t *testing.T) {
	const tid = "4bf92f3577b34da6a3ce929d0e0e4736"
	for _, tc := range []struct {
		tp      string
		wantID  string
		wantErr bool
	}{
		{"", "", false},
		{"00-" + tid + "-00f067aa0ba902b7-01", tid, false},
		{" 00-" + tid + "-00f067aa0ba902b7-00 ", tid, false}, // unsampled is still the trace
		{"00-" + strings.Repeat("0", 32) + "-00f067aa0ba902b7-01", "", true},
		{"00-" + tid + "-0000000000000000-01", "", true},
		{"00-zz-00f067aa0ba902b7-01", "", true},
		{"not a traceparent", "", true},
	} {
		ctx, err := WithTraceparent(context.Background(), tc.tp)
		if (err != nil) != tc.wantErr {
			t.Errorf("WithTraceparent(%q) error %v, want error %v", tc.tp, err, tc.wantErr)
		}
		if got := TraceID(ctx); got != tc.wantID {
			t.Errorf("WithTraceparent(%q): trace id %q, want %q", tc.tp, got, tc.wantID)
		}
		if tc.wantID != "" && !strings.Contains(Traceparent(ctx), tc.wantID) {
			t.Errorf("Traceparent after %q = %q", tc.tp, Traceparent(ctx))
		}
	}
}

// Without an exporter the no-op tracer still carries the platform's trace
// to the spans loomfs starts, so audit records name it.
func TestStartContinuesWithoutExporter(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	if _, exporting, err := Setup(context.Background()); exporting || err != nil {
		t.Fatalf("Setup without an endpoint: exporting %v, %v", exporting, err)
	}
	ctx, _ := WithTraceparent(context.Background(), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	ctx, span := Start(ctx, "x")
	defer span.End()
	if TraceID(ctx) != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatalf("trace id after Start: %q", TraceID(ctx))
	}
	if TraceID(context.Background()) != "" {
		t.Fatal("a context without a span has a trace id")
	}
}

func TestSetupRefusesGRPC(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	_, exporting, err := Setup(context.Background())
	if exporting || err == nil || !strings.Contains(err.Error(), "http/protobuf") {
		t.Fatalf("Setup with grpc: exporting %v, %v", exporting, err)
	}
}

func TestSampleFUSE(t *testing.T) {
	sampled := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}, TraceFlags: trace.FlagsSampled})
	unsampled := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}})
	for _, tc := range []struct {
		env    string
		parent trace.SpanContext
		want   bool
	}{
		{"", sampled, false},
		{"0", sampled, false},
		{"off", sampled, false},
		{"1", sampled, true},
		{"1", unsampled, false},
		{"1", trace.SpanContext{}, false},
	} {
		t.Setenv(FUSEEnv, tc.env)
		if got := SampleFUSE(tc.parent); got != tc.want {
			t.Errorf("%s=%q, sampled %v: %v, want %v", FUSEEnv, tc.env, tc.parent.IsSampled(), got, tc.want)
		}
	}
	// A share samples about that share of calls.
	t.Setenv(FUSEEnv, "0.5")
	n := 0
	for range 2000 {
		if SampleFUSE(sampled) {
			n++
		}
	}
	if n < 800 || n > 1200 {
		t.Errorf("%s=0.5 sampled %d of 2000 calls", FUSEEnv, n)
	}
}
