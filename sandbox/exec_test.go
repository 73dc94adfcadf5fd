package sandbox

import (
	"context"
	"errors"
	"testing"
	"time"
)

// An exec is refused as a fresh command is, before the engine is asked
// for anything: the same timeout range and command checks, and an id that
// names its notes safely.
func TestExecRefusedBeforeAnythingStarts(t *testing.T) {
	r := newTestRunner(t, Config{})
	ok := ExecRequest{Container: "no-such-container", Name: "x", ID: "c-1", Command: "true"}
	for _, tc := range []struct {
		name string
		edit func(*ExecRequest)
	}{
		{"timeout below 1s", func(q *ExecRequest) { q.Timeout = 500 * time.Millisecond }},
		{"timeout above 120s", func(q *ExecRequest) { q.Timeout = 121 * time.Second }},
		{"empty command", func(q *ExecRequest) { q.Command = "  " }},
		{"NUL in command", func(q *ExecRequest) { q.Command = "echo a\x00b" }},
		{"id with slash", func(q *ExecRequest) { q.ID = "../x" }},
		{"id with a space", func(q *ExecRequest) { q.ID = "c 1" }},
		{"empty id", func(q *ExecRequest) { q.ID = "" }},
		{"no container", func(q *ExecRequest) { q.Container = "" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := ok
			tc.edit(&req)
			if _, err := r.Exec(context.Background(), req); !errors.Is(err, ErrInvalidRequest) {
				t.Fatalf("Exec: err = %v, want ErrInvalidRequest", err)
			}
		})
	}
	// The valid request reaches the engine, which knows no such container.
	if _, err := r.Exec(context.Background(), ok); err == nil || errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("Exec in a missing container: err = %v, want the engine's refusal", err)
	}
}
