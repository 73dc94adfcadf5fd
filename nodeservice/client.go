package nodeservice

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"syscall"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/process"
	"github.com/agentloom/loomfs/store"
	"github.com/agentloom/loomfs/tools"
)

// Client reaches a node service over its socket. It implements
// tools.ProcessRunner, so a Toolbox's process tools reach the node's
// processes from any process on the node.
type Client struct {
	http *http.Client
}

var _ tools.ProcessRunner = (*Client)(nil)

// A Client also runs the commands of a "commands: session" policy in the
// service's session sandboxes.
var _ tools.CommandRunner = (*Client)(nil)

// NewClient returns a client of the service at socket. Nothing is dialled
// until the first call.
func NewClient(socket string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		MaxIdleConnsPerHost: 4,
	}
	return &Client{http: &http.Client{Transport: tr}}
}

// Close releases idle connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }

func (c *Client) do(ctx context.Context, op string, req request, out any) error {
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://loomfs"+op, bytes.NewReader(b))
	if err != nil {
		return err
	}
	hr.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(hr)
	if err != nil {
		if ctx.Err() != nil {
			return policy.Errorf(policy.Cancelled, "the call was cancelled")
		}
		if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
			return &policy.Error{Code: policy.ProcessServiceUnavailable, Message: "no process service answers on this node, so processes can't be reached (an operator starts it with loomfs serve)", Err: err}
		}
		return &policy.Error{Code: policy.ProcessServiceUnavailable, Message: "the node's process service did not answer", Err: err}
	}
	defer resp.Body.Close()
	var r response
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return fmt.Errorf("node service answer: %w", err)
	}
	if r.Error != nil {
		return r.Error
	}
	if out != nil {
		return json.Unmarshal(r.Result, out)
	}
	return nil
}

func scopeOf(ws *store.Workspace) string { return ws.Scope().String() }

// StartProcess implements tools.ProcessRunner.
func (c *Client) StartProcess(ctx context.Context, ws *store.Workspace, req tools.ProcessStartRequest) (out tools.ProcessOutput, err error) {
	err = c.do(ctx, opStart, request{Scope: scopeOf(ws), CallID: req.CallID, Command: req.Command, TTY: req.TTY, Cols: req.Cols, Rows: req.Rows, YieldMS: ms(req.Yield), MaxBytes: req.MaxBytes}, &out)
	return out, err
}

// WriteProcess implements tools.ProcessRunner.
func (c *Client) WriteProcess(ctx context.Context, ws *store.Workspace, req tools.ProcessInput) (out tools.ProcessOutput, err error) {
	err = c.do(ctx, opWrite, request{Scope: scopeOf(ws), CallID: req.CallID, ID: req.ID, Input: req.Input, YieldMS: ms(req.Yield), MaxBytes: req.MaxBytes}, &out)
	return out, err
}

// ReadProcess implements tools.ProcessRunner.
func (c *Client) ReadProcess(ctx context.Context, ws *store.Workspace, req tools.ProcessReadRequest) (out tools.ProcessOutput, err error) {
	err = c.do(ctx, opRead, request{Scope: scopeOf(ws), CallID: req.CallID, ID: req.ID, Since: req.Since, YieldMS: ms(req.Yield), MaxBytes: req.MaxBytes}, &out)
	return out, err
}

// ResizeProcess implements tools.ProcessRunner.
func (c *Client) ResizeProcess(ctx context.Context, ws *store.Workspace, req tools.ProcessResizeRequest) (out tools.ProcessInfo, err error) {
	err = c.do(ctx, opResize, request{Scope: scopeOf(ws), CallID: req.CallID, ID: req.ID, Cols: req.Cols, Rows: req.Rows}, &out)
	return out, err
}

// SignalProcess implements tools.ProcessRunner.
func (c *Client) SignalProcess(ctx context.Context, ws *store.Workspace, req tools.ProcessSignalRequest) (out tools.ProcessInfo, err error) {
	err = c.do(ctx, opSignal, request{Scope: scopeOf(ws), CallID: req.CallID, ID: req.ID, Signal: req.Signal}, &out)
	return out, err
}

// ListProcesses implements tools.ProcessRunner.
func (c *Client) ListProcesses(ctx context.Context, ws *store.Workspace) (out []tools.ProcessInfo, err error) {
	err = c.do(ctx, opList, request{Scope: scopeOf(ws)}, &out)
	return out, err
}

// RunCommand implements tools.CommandRunner: the command runs in the
// service's session sandbox of the scope. The caller holds the scope lock.
func (c *Client) RunCommand(ctx context.Context, ws *store.Workspace, req tools.CommandRequest) (out tools.CommandResult, err error) {
	err = c.do(ctx, opCommand, request{Scope: scopeOf(ws), CallID: req.CallID, Command: req.Command, TimeoutMS: ms(req.Timeout)}, &out)
	return out, err
}

// Stop stops the session sandbox of scope on the service's node.
func (c *Client) Stop(ctx context.Context, scope, callID string) (StopResult, error) {
	var out StopResult
	err := c.do(ctx, opStop, request{Scope: scope, CallID: callID}, &out)
	return out, err
}

// Sandboxes lists the session sandboxes the service runs.
func (c *Client) Sandboxes(ctx context.Context) ([]process.SandboxInfo, error) {
	var out []process.SandboxInfo
	err := c.do(ctx, opSandboxes, request{}, &out)
	return out, err
}
