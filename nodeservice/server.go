package nodeservice

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/process"
	"github.com/agentloom/loomfs/store"
	"github.com/agentloom/loomfs/tools"
)

// Opener opens the scope a call names, for the call's length.
type Opener func(ctx context.Context, scope string) (*store.Workspace, func(), error)

// Server answers process calls for a node's process.Service.
type Server struct {
	Service *process.Service
	Open    Opener
	Log     *zap.Logger
}

// Listen makes the socket at path: its directory is created 0700 if
// missing and must be owned by root and closed to others; a stale socket
// (nobody answers) is replaced, a live one refused.
func Listen(path string) (net.Listener, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("socket directory: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return nil, fmt.Errorf("socket directory: %w", err)
	}
	if st.Uid != uint32(os.Geteuid()) || st.Mode&0o077 != 0 {
		return nil, fmt.Errorf("socket directory %s must be owned by this user and closed to others (mode 0700), is uid %d mode %04o", dir, st.Uid, st.Mode&0o7777)
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return nil, fmt.Errorf("a node service already answers at %s", path)
	}
	os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return &peerListener{ln.(*net.UnixListener)}, nil
}

// peerListener accepts only peers of this process's own uid.
type peerListener struct{ *net.UnixListener }

func (l *peerListener) Accept() (net.Conn, error) {
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			return nil, err
		}
		if peerUID(c) == os.Geteuid() {
			return c, nil
		}
		c.Close()
	}
}

func peerUID(c *net.UnixConn) int {
	raw, err := c.SyscallConn()
	if err != nil {
		return -1
	}
	uid := -1
	raw.Control(func(fd uintptr) {
		if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
			uid = int(cred.Uid)
		}
	})
	return uid
}

// Serve answers calls on ln until ctx ends.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	mux := http.NewServeMux()
	for path, h := range map[string]func(context.Context, *store.Workspace, request) (any, error){
		opStart: func(ctx context.Context, ws *store.Workspace, r request) (any, error) {
			return s.Service.StartProcess(ctx, ws, tools.ProcessStartRequest{Command: r.Command, TTY: r.TTY, Cols: r.Cols, Rows: r.Rows, Yield: dur(r.YieldMS), MaxBytes: r.MaxBytes, CallID: r.CallID})
		},
		opWrite: func(ctx context.Context, ws *store.Workspace, r request) (any, error) {
			return s.Service.WriteProcess(ctx, ws, tools.ProcessInput{ID: r.ID, Input: r.Input, Yield: dur(r.YieldMS), MaxBytes: r.MaxBytes, CallID: r.CallID})
		},
		opRead: func(ctx context.Context, ws *store.Workspace, r request) (any, error) {
			return s.Service.ReadProcess(ctx, ws, tools.ProcessReadRequest{ID: r.ID, Since: r.Since, Yield: dur(r.YieldMS), MaxBytes: r.MaxBytes, CallID: r.CallID})
		},
		opResize: func(ctx context.Context, ws *store.Workspace, r request) (any, error) {
			return s.Service.ResizeProcess(ctx, ws, tools.ProcessResizeRequest{ID: r.ID, Cols: r.Cols, Rows: r.Rows, CallID: r.CallID})
		},
		opSignal: func(ctx context.Context, ws *store.Workspace, r request) (any, error) {
			return s.Service.SignalProcess(ctx, ws, tools.ProcessSignalRequest{ID: r.ID, Signal: r.Signal, CallID: r.CallID})
		},
		opList: func(ctx context.Context, ws *store.Workspace, r request) (any, error) {
			return s.Service.ListProcesses(ctx, ws)
		},
		opCommand: func(ctx context.Context, ws *store.Workspace, r request) (any, error) {
			return s.Service.RunCommand(ctx, ws, tools.CommandRequest{Command: r.Command, Timeout: dur(r.TimeoutMS), CallID: r.CallID})
		},
		opStop: func(ctx context.Context, ws *store.Workspace, r request) (any, error) {
			stopped, err := s.Service.Stop(ctx, ws, r.CallID)
			return StopResult{Stopped: stopped}, err
		},
	} {
		mux.HandleFunc("POST "+path, s.handle(h))
	}
	mux.HandleFunc("POST "+opSandboxes, func(w http.ResponseWriter, r *http.Request) {
		reply(w, s.Service.Sandboxes(), nil)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second,
		BaseContext: func(net.Listener) context.Context { return ctx }}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	err := srv.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

func (s *Server) handle(h func(context.Context, *store.Workspace, request) (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, hr *http.Request) {
		var r request
		body, err := io.ReadAll(io.LimitReader(hr.Body, 4<<20))
		if err == nil {
			err = json.Unmarshal(body, &r)
		}
		if err != nil {
			reply(w, nil, policy.Errorf(policy.InvalidInput, "node service request: %v", err))
			return
		}
		ctx := hr.Context()
		ws, done, err := s.Open(ctx, r.Scope)
		if err != nil {
			reply(w, nil, err)
			return
		}
		defer done()
		res, err := h(ctx, ws, r)
		if err != nil && s.Log != nil {
			if pe := policy.AsError(err); pe.Message != policy.Public(err).Message {
				s.Log.Warn("process call failed", zap.String("scope", r.Scope), zap.String("code", string(pe.Code)), zap.Error(err))
			}
		}
		reply(w, res, err)
	}
}

// reply writes a result, or a refusal as a model may read it.
func reply(w http.ResponseWriter, res any, err error) {
	var resp response
	if err != nil {
		resp.Error = policy.Public(err)
	} else {
		b, merr := json.Marshal(res)
		if merr != nil {
			resp.Error = policy.Errorf(policy.Internal, "encode result: %v", merr)
		}
		resp.Result = b
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(resp)
}
