package fusefs

import (
	"bytes"
	"os"
	"testing"

	"github.com/agentloom/loomfs/policy"
)

// TestThrottleRecord: a writer over the scope's io_bytes_per_s is slowed,
// not failed: its whole file arrives, and its open gets one "throttle"
// record with the waits and the rates. A writer that never waited gets
// none.
func TestThrottleRecord(t *testing.T) {
	e := newEnv(t, withLimits(func(l *policy.Limits) { l.IOBytesPerSec = 1 << 20 }))
	data := bytes.Repeat([]byte("t"), 2<<20)
	if err := os.WriteFile(e.path("big"), data, 0o600); err != nil {
		t.Fatalf("a throttled write failed: %v", err)
	}
	if err := os.WriteFile(e.path("small"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	waitReleased(t, e.m)
	if b, err := os.ReadFile(e.host("big")); err != nil || !bytes.Equal(b, data) {
		t.Fatalf("throttled file: %d bytes, %v", len(b), err)
	}
	recs := e.sink.find("throttle", "ok", "big")
	if len(recs) != 1 {
		t.Fatalf("%d throttle records for the throttled open, want 1", len(recs))
	}
	if r := recs[0]; r.Detail["waits"].(int64) == 0 || r.Detail["io_bytes_per_s"].(int64) != 1<<20 || r.Duration <= 0 {
		t.Errorf("throttle record: %+v", r)
	}
	if n := len(e.sink.find("throttle", "ok", "small")); n != 0 {
		t.Errorf("%d throttle records for an open that did not wait", n)
	}
}
