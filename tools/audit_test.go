package tools

import (
	"context"
	"sync"
	"testing"

	"github.com/agentloom/loomfs/audit"
)

// memSink keeps what it is given.
type memSink struct {
	mu     sync.Mutex
	events []audit.Event
}

func (s *memSink) Record(_ context.Context, e audit.Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, e)
	return nil
}

func (s *memSink) take() []audit.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	ev := s.events
	s.events = nil
	return ev
}

// TestAuditRecordsPerCall: a change is recorded before it is made and
// again with its outcome (two appends); a read, and input refused before
// anything runs, are one record each, their outcome.
func TestAuditRecordsPerCall(t *testing.T) {
	tb, _ := newBox(t, nil)
	sink := &memSink{}
	tb.Audit = sink
	for _, c := range []struct {
		name    string
		tool    string
		in      any
		results []string
	}{
		{"a write: started, then ok", Write, map[string]any{"path": "f.txt", "content": "x\n"}, []string{"started", "ok"}},
		{"a read: its outcome only", Read, map[string]any{"path": "f.txt"}, []string{"ok"}},
		{"a refused read: one record", Read, map[string]any{"path": "missing.txt"}, []string{"refused"}},
		{"a list: one record", List, map[string]any{}, []string{"ok"}},
		{"a refused write: started, then refused", Write, map[string]any{"path": "d/f.txt", "content": "x", "parents": false}, []string{"started", "refused"}},
		{"a write with bad input: one record", Write, map[string]any{"path": 7}, []string{"refused"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			call(t, tb, c.tool, c.in)
			var got []string
			for _, e := range sink.take() {
				if e.Op != c.tool {
					t.Errorf("record of %s in a %s call", e.Op, c.tool)
				}
				got = append(got, e.Result)
			}
			if len(got) != len(c.results) {
				t.Fatalf("records %v, want %v", got, c.results)
			}
			for i := range got {
				if got[i] != c.results[i] {
					t.Fatalf("records %v, want %v", got, c.results)
				}
			}
		})
	}
}
