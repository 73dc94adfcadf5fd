package tools

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"time"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// Process tools (SPEC §5.1): a process outlives the call that starts it,
// in the scope's session sandbox; later calls write to it, read its output
// by cursor, resize its terminal and signal it.
const (
	ProcessStart  = "workspace_process_start"
	ProcessWrite  = "workspace_process_write"
	ProcessRead   = "workspace_process_read"
	ProcessResize = "workspace_process_resize"
	ProcessSignal = "workspace_process_signal"
	ProcessList   = "workspace_process_list"
)

// ProcessNames lists the process tools in a stable order.
var ProcessNames = []string{ProcessStart, ProcessWrite, ProcessRead, ProcessResize, ProcessSignal, ProcessList}

// Bounds of the process tools' inputs.
const (
	MaxYield           = 30 * time.Second
	DefaultStartYield  = 2 * time.Second
	DefaultWriteYield  = time.Second
	MaxProcessInput    = 64 << 10
	DefaultReadBytes   = 64 << 10
	MaxReadBytes       = 1 << 20
	MinTermSize        = 1
	MaxTermSize        = 1000
	DefaultCols        = 80
	DefaultRows        = 24
	maxProcessCommand  = 64 << 10
	processIDMaxLength = 64
)

// Signals a process may be sent.
var Signals = []string{"INT", "TERM", "KILL", "HUP"}

// ProcessStartRequest starts a process in the scope's session sandbox.
type ProcessStartRequest struct {
	Command    string
	TTY        bool
	Cols, Rows int           // the terminal's size, with TTY
	Yield      time.Duration // how long to wait for the process to exit
	MaxBytes   int           // most output bytes returned
	CallID     string
}

// ProcessInput writes Input to a process's stdin.
type ProcessInput struct {
	ID       string
	Input    string
	Yield    time.Duration
	MaxBytes int
	CallID   string
}

// ProcessReadRequest reads a process's output after the cursor Since.
type ProcessReadRequest struct {
	ID       string
	Since    int64
	Yield    time.Duration
	MaxBytes int
	CallID   string
}

// ProcessResizeRequest sets a process's terminal size.
type ProcessResizeRequest struct {
	ID         string
	Cols, Rows int
	CallID     string
}

// ProcessSignalRequest sends one of Signals to a process.
type ProcessSignalRequest struct {
	ID     string
	Signal string
	CallID string
}

// ProcessOutput is a process's state and the output after a cursor. Output
// holds the raw bytes as the process wrote them (with TTY, as the terminal
// saw them: both streams interleaved, control sequences kept); without
// TTY, Stdout and Stderr hold the same bytes split by stream, and Output
// both in the order they came. Since is the cursor of Output's first byte:
// the since asked for, or where the kept output starts when bytes after
// the asked since were dropped (DroppedBytes counts them), or the end when
// the asked since was past it; never more than Cursor. Cursor is where the
// next read starts, and Truncated says more output follows Cursor than
// MaxBytes let through. Once the process exited, LeftRunningKilled counts
// the processes its command left running, which were killed with it, and
// OOMKilled says the memory limit killed it.
type ProcessOutput struct {
	ProcessID    string `json:"process_id"`
	Status       string `json:"status"` // running, exited, or lost (its node was fenced)
	ExitCode     *int   `json:"exit_code"`
	TTY          bool   `json:"tty"`
	Output       string `json:"output"`
	Stdout       string `json:"stdout,omitempty"`
	Stderr       string `json:"stderr,omitempty"`
	Since        int64  `json:"since"`
	Cursor       int64  `json:"cursor"`
	DroppedBytes int64  `json:"dropped_bytes"`
	Truncated    bool   `json:"truncated"`
	Container    string `json:"container,omitempty"`
	// LeftRunningKilled is set once the process exited.
	LeftRunningKilled *int `json:"left_running_killed,omitempty"`
	OOMKilled         bool `json:"oom_killed,omitempty"`
	// SessionTmp is set when the session's /tmp was full as the process
	// ended or started.
	SessionTmp *SessionTmp `json:"session_tmp_full,omitempty"`
}

// SessionTmp says the session sandbox's /tmp is full: its limit, what it
// holds, and what to do.
type SessionTmp struct {
	Code       string     `json:"code"` // session_exhausted
	UsedBytes  int64      `json:"used_bytes"`
	LimitBytes int64      `json:"limit_bytes"`
	Largest    []TmpEntry `json:"largest,omitempty"`
	Message    string     `json:"message"`
}

// TmpEntry is one of the largest entries at the top of /tmp.
type TmpEntry struct {
	Path  string `json:"path"`
	Bytes int64  `json:"bytes"`
}

// Process states.
const (
	StatusRunning = "running"
	StatusExited  = "exited"
	// StatusLost: the node that ran it was fenced (loomfs fence); it
	// ended there, at a time nobody recorded, and its output is gone.
	StatusLost = "lost"
)

// ProcessInfo describes one process of a scope.
type ProcessInfo struct {
	ProcessID string     `json:"process_id"`
	Command   string     `json:"command"`
	TTY       bool       `json:"tty"`
	Cols      int        `json:"cols,omitempty"`
	Rows      int        `json:"rows,omitempty"`
	Status    string     `json:"status"`
	ExitCode  *int       `json:"exit_code"`
	Signal    string     `json:"signal,omitempty"` // the last signal sent
	Node      string     `json:"node"`
	Container string     `json:"container"`
	ExecID    string     `json:"exec_id"`
	CallID    string     `json:"call_id"`
	Started   time.Time  `json:"started_at"`
	Ended     *time.Time `json:"ended_at,omitempty"`
	Cursor    int64      `json:"cursor"`
	// LeftRunningKilled counts, once it exited, the processes its command
	// left running, which were killed with it.
	LeftRunningKilled *int   `json:"left_running_killed,omitempty"`
	OOMKilled         bool   `json:"oom_killed,omitempty"`
	Reason            string `json:"reason,omitempty"` // why it ended, when not by itself
}

// ProcessList is workspace_process_list's result.
type ProcessListResult struct {
	Processes []ProcessInfo `json:"processes"`
}

// ProcessRunner owns a node's session sandboxes and their processes. The
// Toolbox does not take the scope lock for these calls: a runner takes it
// for what needs it (starting the sandbox or a process), never for a
// process's life.
type ProcessRunner interface {
	StartProcess(ctx context.Context, ws *store.Workspace, req ProcessStartRequest) (ProcessOutput, error)
	WriteProcess(ctx context.Context, ws *store.Workspace, req ProcessInput) (ProcessOutput, error)
	ReadProcess(ctx context.Context, ws *store.Workspace, req ProcessReadRequest) (ProcessOutput, error)
	ResizeProcess(ctx context.Context, ws *store.Workspace, req ProcessResizeRequest) (ProcessInfo, error)
	SignalProcess(ctx context.Context, ws *store.Workspace, req ProcessSignalRequest) (ProcessInfo, error)
	ListProcesses(ctx context.Context, ws *store.Workspace) ([]ProcessInfo, error)
}

func init() {
	Names = append(Names, ProcessNames...)
	for _, n := range []string{ProcessStart, ProcessWrite, ProcessResize, ProcessSignal} {
		mutating[n] = true
		selfLocking[n] = true
	}
	handlers[ProcessStart] = handleProcessStart
	handlers[ProcessWrite] = handleProcessWrite
	handlers[ProcessRead] = handleProcessRead
	handlers[ProcessResize] = handleProcessResize
	handlers[ProcessSignal] = handleProcessSignal
	handlers[ProcessList] = handleProcessList
}

// selfLocking tools are recorded as changes but take no scope lock for
// the call: their runner locks what it must, briefly.
var selfLocking = map[string]bool{}

func (t *Toolbox) processes() (ProcessRunner, error) {
	if t.Processes == nil {
		return nil, policy.Errorf(policy.ProcessServiceUnavailable, "no process service is configured for this workspace, so processes can't run; use workspace_command")
	}
	return t.Processes, nil
}

// changingProcesses is processes for a call that may change the scope
// (start a process, feed one input): refused in a quarantined scope.
func (t *Toolbox) changingProcesses() (ProcessRunner, error) {
	p, err := t.processes()
	if err != nil {
		return nil, err
	}
	if err := t.WS.CheckQuarantine(); err != nil {
		return nil, err
	}
	return p, nil
}

func yieldOf(ms *int, def time.Duration) (time.Duration, error) {
	if ms == nil {
		return def, nil
	}
	if *ms < 0 || time.Duration(*ms)*time.Millisecond > MaxYield {
		return 0, policy.Errorf(policy.InvalidInput, "yield_ms %d is out of range: allowed 0–%d", *ms, MaxYield.Milliseconds())
	}
	return time.Duration(*ms) * time.Millisecond, nil
}

func maxBytesOf(field string, n *int) (int, error) {
	if n == nil {
		return DefaultReadBytes, nil
	}
	if *n < 1 || *n > MaxReadBytes {
		return 0, policy.Errorf(policy.InvalidInput, "%s %d is out of range: allowed 1–%d bytes", field, *n, MaxReadBytes)
	}
	return *n, nil
}

func termSize(cols, rows *int) (int, int, error) {
	c, r := DefaultCols, DefaultRows
	if cols != nil {
		c = *cols
	}
	if rows != nil {
		r = *rows
	}
	if c < MinTermSize || c > MaxTermSize || r < MinTermSize || r > MaxTermSize {
		return 0, 0, policy.Errorf(policy.InvalidInput, "terminal size %dx%d is out of range: cols and rows allowed %d–%d", c, r, MinTermSize, MaxTermSize)
	}
	return c, r, nil
}

func checkProcessID(id string) error {
	if id == "" || len(id) > processIDMaxLength || strings.Trim(id, "abcdefghijklmnopqrstuvwxyz0123456789-") != "" {
		return policy.Errorf(policy.InvalidInput, "process_id %q is not a process id (from workspace_process_start or workspace_process_list)", id)
	}
	return nil
}

func handleProcessStart(ctx context.Context, t *Toolbox, input json.RawMessage) (any, error) {
	var in struct {
		Command  string `json:"command"`
		TTY      bool   `json:"tty"`
		Cols     *int   `json:"cols"`
		Rows     *int   `json:"rows"`
		YieldMS  *int   `json:"yield_ms"`
		MaxBytes *int   `json:"max_output_bytes"`
	}
	if err := decode(input, &in); err != nil {
		return nil, err
	}
	switch {
	case strings.TrimSpace(in.Command) == "":
		return nil, policy.Errorf(policy.InvalidInput, "command is empty")
	case len(in.Command) > maxProcessCommand:
		return nil, policy.Errorf(policy.InvalidInput, "command is %d bytes; the limit is %d", len(in.Command), maxProcessCommand)
	case strings.ContainsRune(in.Command, 0):
		return nil, policy.Errorf(policy.InvalidInput, "command contains a NUL byte")
	}
	yield, err := yieldOf(in.YieldMS, DefaultStartYield)
	if err != nil {
		return nil, err
	}
	maxBytes, err := maxBytesOf("max_output_bytes", in.MaxBytes)
	if err != nil {
		return nil, err
	}
	cols, rows, err := termSize(in.Cols, in.Rows)
	if err != nil {
		return nil, err
	}
	p, err := t.changingProcesses()
	if err != nil {
		return nil, err
	}
	out, err := p.StartProcess(ctx, t.WS, ProcessStartRequest{Command: in.Command, TTY: in.TTY, Cols: cols, Rows: rows, Yield: yield, MaxBytes: maxBytes, CallID: CallID(ctx)})
	if err != nil {
		return nil, err
	}
	t.changed(".")
	return out, nil
}

func handleProcessWrite(ctx context.Context, t *Toolbox, input json.RawMessage) (any, error) {
	var in struct {
		ID       string `json:"process_id"`
		Input    string `json:"input"`
		YieldMS  *int   `json:"yield_ms"`
		MaxBytes *int   `json:"max_output_bytes"`
	}
	if err := decode(input, &in); err != nil {
		return nil, err
	}
	if err := checkProcessID(in.ID); err != nil {
		return nil, err
	}
	if len(in.Input) > MaxProcessInput {
		return nil, policy.Errorf(policy.InvalidInput, "input is %d bytes; the limit per call is %d", len(in.Input), MaxProcessInput)
	}
	yield, err := yieldOf(in.YieldMS, DefaultWriteYield)
	if err != nil {
		return nil, err
	}
	maxBytes, err := maxBytesOf("max_output_bytes", in.MaxBytes)
	if err != nil {
		return nil, err
	}
	p, err := t.changingProcesses()
	if err != nil {
		return nil, err
	}
	out, err := p.WriteProcess(ctx, t.WS, ProcessInput{ID: in.ID, Input: in.Input, Yield: yield, MaxBytes: maxBytes, CallID: CallID(ctx)})
	if err != nil {
		return nil, err
	}
	t.changed(".")
	return out, nil
}

func handleProcessRead(ctx context.Context, t *Toolbox, input json.RawMessage) (any, error) {
	var in struct {
		ID       string `json:"process_id"`
		Since    *int64 `json:"since"`
		YieldMS  *int   `json:"yield_ms"`
		MaxBytes *int   `json:"max_bytes"`
	}
	if err := decode(input, &in); err != nil {
		return nil, err
	}
	if err := checkProcessID(in.ID); err != nil {
		return nil, err
	}
	since := int64(0)
	if in.Since != nil {
		since = *in.Since
	}
	if since < 0 {
		return nil, policy.Errorf(policy.InvalidInput, "since %d is not a cursor: cursors start at 0", since)
	}
	yield, err := yieldOf(in.YieldMS, 0)
	if err != nil {
		return nil, err
	}
	maxBytes, err := maxBytesOf("max_bytes", in.MaxBytes)
	if err != nil {
		return nil, err
	}
	p, err := t.processes()
	if err != nil {
		return nil, err
	}
	return p.ReadProcess(ctx, t.WS, ProcessReadRequest{ID: in.ID, Since: since, Yield: yield, MaxBytes: maxBytes, CallID: CallID(ctx)})
}

func handleProcessResize(ctx context.Context, t *Toolbox, input json.RawMessage) (any, error) {
	var in struct {
		ID   string `json:"process_id"`
		Cols *int   `json:"cols"`
		Rows *int   `json:"rows"`
	}
	if err := decode(input, &in); err != nil {
		return nil, err
	}
	if err := checkProcessID(in.ID); err != nil {
		return nil, err
	}
	cols, rows, err := termSize(in.Cols, in.Rows)
	if err != nil {
		return nil, err
	}
	p, err := t.processes()
	if err != nil {
		return nil, err
	}
	return p.ResizeProcess(ctx, t.WS, ProcessResizeRequest{ID: in.ID, Cols: cols, Rows: rows, CallID: CallID(ctx)})
}

func handleProcessSignal(ctx context.Context, t *Toolbox, input json.RawMessage) (any, error) {
	var in struct {
		ID     string `json:"process_id"`
		Signal string `json:"signal"`
	}
	if err := decode(input, &in); err != nil {
		return nil, err
	}
	if err := checkProcessID(in.ID); err != nil {
		return nil, err
	}
	sig := strings.TrimPrefix(strings.ToUpper(in.Signal), "SIG")
	known := false
	for _, s := range Signals {
		known = known || s == sig
	}
	if !known {
		return nil, policy.Errorf(policy.InvalidInput, "signal %q: allowed %s", in.Signal, strings.Join(Signals, ", "))
	}
	p, err := t.processes()
	if err != nil {
		return nil, err
	}
	return p.SignalProcess(ctx, t.WS, ProcessSignalRequest{ID: in.ID, Signal: sig, CallID: CallID(ctx)})
}

func handleProcessList(ctx context.Context, t *Toolbox, input json.RawMessage) (any, error) {
	var in struct{}
	if err := decode(input, &in); err != nil {
		return nil, err
	}
	p, err := t.processes()
	if err != nil {
		return nil, err
	}
	list, err := p.ListProcesses(ctx, t.WS)
	if err != nil {
		return nil, err
	}
	if list == nil {
		list = []ProcessInfo{}
	}
	return ProcessListResult{Processes: list}, nil
}

// controlSeq matches terminal control sequences: CSI (ESC [ … final),
// OSC (ESC ] … BEL or ESC \), other two-byte escapes, and C0 controls
// other than tab and newline.
var controlSeq = regexp.MustCompile("\x1b\\[[0-?]*[ -/]*[@-~]|\x1b\\][^\x07\x1b]*(?:\x07|\x1b\\\\)|\x1b[@-Z\\\\-_]|[\x00-\x08\x0b-\x1f\x7f]")

// StripControl returns s as a model should read it: terminal control
// sequences removed, "\r\n" as "\n". The structured result keeps the raw
// bytes.
func StripControl(s string) string {
	s = strings.ReplaceAll(s, "\r\n", "\n")
	return controlSeq.ReplaceAllString(s, "")
}
