package tools

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/policy"
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

// startGate is a sink whose "started" records wait for release and then
// fail with fail (nil: kept). Every other record is kept at once.
type startGate struct {
	memSink
	entered chan struct{} // a started record reached the sink
	release chan struct{}
	fail    error
}

func (s *startGate) Record(ctx context.Context, e audit.Event) error {
	if e.Result == "started" {
		s.entered <- struct{}{}
		<-s.release
		if s.fail != nil {
			return s.fail
		}
	}
	return s.memSink.Record(ctx, e)
}

// TestNothingChangesBeforeItsStartRecord: a change's start record is
// written while the call takes the scope lock, but the handler waits for
// it: while it is not kept the file is not written; once it is, the change
// goes ahead and its outcome follows it in the log. A start record that
// fails, or does not come within the call's budget, leaves the file as it
// was and gets no outcome record (the late one stays a start without an
// outcome, as a crash would leave it).
func TestNothingChangesBeforeItsStartRecord(t *testing.T) {
	for _, c := range []struct {
		name    string
		fail    error
		budget  time.Duration
		code    policy.Code // "" for success
		records []string
	}{
		{"kept", nil, time.Minute, "", []string{"started", "ok"}},
		{"failed", errors.New("disk gone"), time.Minute, policy.AuditUnavailable, nil},
		// Kept after the caller was answered: a start with no outcome.
		{"not within the budget", nil, 300 * time.Millisecond, policy.Timeout, []string{"started"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			tb, dir := newBox(t, nil)
			sink := &startGate{entered: make(chan struct{}, 1), release: make(chan struct{}), fail: c.fail}
			tb.Audit = sink
			var once sync.Once
			release := func() { once.Do(func() { close(sink.release) }) }
			t.Cleanup(func() { release(); tb.Wait() })

			ctx, cancel := context.WithTimeout(context.Background(), c.budget)
			defer cancel()
			done := make(chan error, 1)
			go func() {
				_, err := tb.Call(ctx, Write, "c1", json.RawMessage(`{"path":"f.txt","content":"x"}`))
				done <- err
			}()
			<-sink.entered
			// Long enough for a handler that did not wait to have written.
			time.Sleep(100 * time.Millisecond)
			if _, err := os.Stat(filepath.Join(dir, "f.txt")); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("before its start record was kept the file was written (stat: %v)", err)
			}
			if c.code == policy.Timeout {
				err := <-done // the budget runs out with the record still on its way
				wantCode(t, err, c.code)
				release()
			} else {
				release()
				err := <-done
				if c.code == "" && err != nil {
					t.Fatal(err)
				}
				if c.code != "" {
					wantCode(t, err, c.code)
				}
			}
			tb.Wait()
			_, err := os.Stat(filepath.Join(dir, "f.txt"))
			if written := err == nil; written != (c.code == "") {
				t.Fatalf("file written: %v, want %v", written, c.code == "")
			}
			var got []string
			for _, e := range sink.take() {
				got = append(got, e.Result)
			}
			if !slices.Equal(got, c.records) {
				t.Fatalf("records %v, want %v", got, c.records)
			}
		})
	}
}
