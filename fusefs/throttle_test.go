package fusefs

import (
	"bytes"
	"context"
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

// TestInterruptedWriteStaysThrottled: a write whose wait for the scope's
// bytes is interrupted (a signal to the writer cancels the request) moves
// only what it took, a page at least, and answers a short count; it does
// not let the rest through unthrottled.
func TestInterruptedWriteStaysThrottled(t *testing.T) {
	e := newEnv(t, withLimits(func(l *policy.Limits) { l.IOBytesPerSec = 64 << 10 }))
	f, err := os.OpenFile(e.path("f"), os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var h *handle
	e.m.fsys.open.Range(func(k, _ any) bool {
		h = k.(*handle)
		return false
	})
	if h == nil {
		t.Fatal("the open file has no handle in the mount")
	}
	interrupted, cancel := context.WithCancel(context.Background())
	cancel()
	data := bytes.Repeat([]byte("t"), 64<<10)
	for _, tc := range []struct {
		name string
		ctx  context.Context
		want int
	}{
		{"interrupted", interrupted, writeAtLeast},
		{"not interrupted", context.Background(), len(data)},
	} {
		n, errno := h.write(tc.ctx, [][]byte{data}, len(data), 0)
		if errno != 0 || int(n) != tc.want {
			t.Errorf("%s: a write of %d bytes moved %d (%v), want %d", tc.name, len(data), n, errno, tc.want)
		}
	}
}
