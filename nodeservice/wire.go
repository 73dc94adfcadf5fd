package nodeservice

import (
	"encoding/json"
	"time"

	"github.com/agentloom/loomfs/policy"
)

// DefaultSocket is where loomfs serve listens: in the root-only directory
// beside the projections' mountpoints.
const DefaultSocket = "/run/loomfs/serve.sock"

// Operations, one URL path each.
const (
	opStart     = "/v1/process/start"
	opWrite     = "/v1/process/write"
	opRead      = "/v1/process/read"
	opResize    = "/v1/process/resize"
	opSignal    = "/v1/process/signal"
	opList      = "/v1/process/list"
	opCommand   = "/v1/command"
	opStop      = "/v1/sandbox/stop"
	opSandboxes = "/v1/sandbox/list"
)

// request is every operation's body: the scope (as loomfs tool names it)
// and the operation's own fields.
type request struct {
	Scope    string `json:"scope"`
	CallID   string `json:"call_id,omitempty"`
	ID       string `json:"process_id,omitempty"`
	Command  string `json:"command,omitempty"`
	TTY      bool   `json:"tty,omitempty"`
	Cols     int    `json:"cols,omitempty"`
	Rows     int    `json:"rows,omitempty"`
	YieldMS  int64  `json:"yield_ms,omitempty"`
	MaxBytes int    `json:"max_bytes,omitempty"`
	Input    string `json:"input,omitempty"`
	Since    int64  `json:"since,omitempty"`
	Signal   string `json:"signal,omitempty"`
	// TimeoutMS is a workspace_command's timeout.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
}

// response carries a result or a refusal.
type response struct {
	Result json.RawMessage `json:"result,omitempty"`
	Error  *policy.Error   `json:"error,omitempty"`
}

// StopResult answers a stop.
type StopResult struct {
	Stopped bool `json:"stopped"`
}

func ms(d time.Duration) int64 { return d.Milliseconds() }

func dur(ms int64) time.Duration { return time.Duration(ms) * time.Millisecond }
