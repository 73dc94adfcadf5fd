package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentloom/loomfs/tracing"
)

// traceparentFlag registers --traceparent on cmd: the platform's W3C trace
// context, which the call's spans continue and its audit records carry.
func traceparentFlag(cmd *cobra.Command, tp *string) {
	cmd.Flags().StringVar(tp, "traceparent", os.Getenv("TRACEPARENT"), "W3C traceparent of the platform's span (00-TRACE-SPAN-FLAGS): the call's spans continue its trace, and its audit records carry the trace id ($TRACEPARENT)")
}

// withTraceparent returns ctx carrying tp's span; a malformed tp is a
// usage error.
func withTraceparent(ctx context.Context, tp string) (context.Context, error) {
	ctx, err := tracing.WithTraceparent(ctx, tp)
	if err != nil {
		return ctx, usagef("--traceparent: %v", err)
	}
	return ctx, nil
}

// startTracing exports spans if the environment names an OTLP endpoint
// (package tracing) and returns what flushes them at exit. A setting it
// can't use is said on stderr, and loomfs runs untraced.
func startTracing() (stop func()) {
	shutdown, _, err := tracing.Setup(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, "loomfs: tracing is off:", err)
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		shutdown(ctx)
	}
}
