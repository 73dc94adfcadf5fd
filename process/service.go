package process

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/sandbox"
	"github.com/agentloom/loomfs/store"
	"github.com/agentloom/loomfs/tools"
)

// Opener opens a scope's workspace and audit log for a session sandbox's
// life; close releases both.
type Opener func(ctx context.Context, sc store.Scope) (ws *store.Workspace, log audit.Sink, close func(), err error)

// MountFunc mounts ws's projection at mountpoint for a session sandbox,
// its FUSE records going to log.
type MountFunc func(ctx context.Context, ws *store.Workspace, log audit.Sink, mountpoint string, call sandbox.CallInfo) (sandbox.Projection, error)

// Config configures a Service.
type Config struct {
	Runner   *sandbox.Runner // the engine; its image, limits and user are the sandbox's
	Mount    MountFunc       // mounts a scope's projection for a session sandbox
	MountDir string          // root-only directory for mountpoints; "" means sandbox.DefaultMountDir
	Open     Opener
	Skills   map[string]string // skill id → host dir, mounted read-only
	// KeepEnded is how long the record of an ended process is kept for
	// late readers; 0 means DefaultKeepEnded.
	KeepEnded time.Duration
	Log       *zap.Logger
}

// lockWait bounds the wait for the scope lock when a process starts, as
// the Toolbox bounds a write's.
const lockWait = 30 * time.Second

// DefaultKeepEnded is how long ended processes stay readable.
const DefaultKeepEnded = time.Hour

// Service owns a node's session sandboxes and their processes. It
// implements tools.ProcessRunner; one Service per node serves every scope
// (loomfs serve), so a later call from any process on the node reaches
// the same process.
type Service struct {
	cfg   Config
	mu    sync.Mutex
	boxes map[string]*Sandbox // by scope hash
	procs map[string]*Process // by process id
	wg    sync.WaitGroup
	// fenced is the volume's fence of this node once Fence saw it: every
	// later call is refused with it.
	fenced error
}

var _ tools.ProcessRunner = (*Service)(nil)

// NewService returns a Service over cfg.
func NewService(cfg Config) *Service {
	if cfg.MountDir == "" {
		cfg.MountDir = sandbox.DefaultMountDir
	}
	if cfg.KeepEnded <= 0 {
		cfg.KeepEnded = DefaultKeepEnded
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	return &Service{cfg: cfg, boxes: map[string]*Sandbox{}, procs: map[string]*Process{}}
}

// Node is the name of the node this service runs on.
func (s *Service) Node() string { return s.cfg.Runner.Node() }

// Close stops every session sandbox and waits until their containers are
// confirmed gone.
func (s *Service) Close() error {
	err := s.stopAll(context.Background(), "service_stop", nil)
	s.wg.Wait()
	return err
}

// stopAll stops every session sandbox for reason; a non-nil fenced is
// recorded first, under the same lock, so no sandbox starts after it.
func (s *Service) stopAll(ctx context.Context, reason string, fenced error) error {
	s.mu.Lock()
	if fenced != nil && s.fenced == nil {
		s.fenced = fenced
	}
	boxes := make([]*Sandbox, 0, len(s.boxes))
	for _, b := range s.boxes {
		boxes = append(boxes, b)
	}
	s.mu.Unlock()
	var errs []error
	for _, b := range boxes {
		errs = append(errs, b.Stop(ctx, reason, ""))
	}
	return errors.Join(errs...)
}

// Fence ends this node's session sandboxes after the volume shut the node
// out (loomfs fence; cause is the refusal that showed it): each one's
// container is removed, its processes end, and every later call is
// refused with cause. A fenced node writes nothing, so the sandboxes'
// markers stay for the node that takes over (quarantine clear
// --fenced-node).
func (s *Service) Fence(ctx context.Context, cause error) error {
	return s.stopAll(ctx, "fenced", cause)
}

// writesNothing: once fenced, nothing this node's sandboxes do is written
// to the volume (records, markers, quarantines, audit): the node that
// takes over owns them, and a fenced node that can still reach the
// volume (a fresh mount, a fence an operator confirmed) must not touch
// them.
func (s *Service) writesNothing() bool { return s.Fenced() != nil }

// Fenced returns the fence Fence saw, or nil.
func (s *Service) Fenced() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fenced
}

// Stop stops the session sandbox of ws's scope, if this node runs one;
// stopped says whether it did.
func (s *Service) Stop(ctx context.Context, ws *store.Workspace, callID string) (stopped bool, err error) {
	s.mu.Lock()
	b := s.boxes[ws.Scope().Hash()]
	s.mu.Unlock()
	if b == nil {
		if m, _ := ws.SessionMarkerOf(); m != nil && m.Node != s.Node() {
			return false, otherNode(m.Node, "the session sandbox")
		}
		return false, nil
	}
	return true, b.Stop(ctx, "stop", callID)
}

// Sandboxes lists the session sandboxes this node runs.
func (s *Service) Sandboxes() []SandboxInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]SandboxInfo, 0, len(s.boxes))
	for _, b := range s.boxes {
		out = append(out, b.Info())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Scope < out[j].Scope })
	return out
}

// StartProcess implements tools.ProcessRunner.
func (s *Service) StartProcess(ctx context.Context, ws *store.Workspace, req tools.ProcessStartRequest) (tools.ProcessOutput, error) {
	p, err := s.start(ctx, ws, req)
	if err != nil {
		return tools.ProcessOutput{}, err
	}
	p.waitExit(ctx, req.Yield)
	return p.output(0, req.MaxBytes), nil
}

// start takes the scope lock only while it starts the sandbox and the exec.
func (s *Service) start(ctx context.Context, ws *store.Workspace, req tools.ProcessStartRequest) (*Process, error) {
	if err := ws.CheckQuarantine(); err != nil {
		return nil, err
	}
	lctx, cancel := context.WithTimeout(ctx, lockWait)
	unlock, err := ws.Lock(lctx)
	cancel()
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := ws.CheckQuarantine(); err != nil { // the lock may have found a dead worker's session
		return nil, err
	}
	s.collect(ws)
	b, err := s.sandbox(ctx, ws, req.CallID)
	if err != nil {
		return nil, err
	}
	if running, oomKilled, err := b.running(ctx); err == nil && !running {
		// Its container ended on its own: stop what is left of it and
		// start afresh, without an operator.
		b.died(oomKilled)
		if b, err = s.sandbox(ctx, ws, req.CallID); err != nil {
			return nil, err
		}
	}
	if err := b.checkRoom(ctx); err != nil {
		return nil, err
	}
	// A full /tmp does not stop a start (the process may be the one that
	// frees it), but its answer says so, if the controller can tell at
	// once; only after a process ended with it full.
	var tmp *tools.SessionTmp
	if b.tmpWasFull.Load() {
		tmp = b.tmpUse(ctx, true)
	}
	p, err := b.exec(ctx, newProcessID(), req)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.tmp = tmp
	p.mu.Unlock()
	s.mu.Lock()
	s.procs[p.ID] = p
	s.mu.Unlock()
	return p, nil
}

// sandbox returns the scope's running session sandbox, starting it if
// needed. The caller holds the scope lock.
func (s *Service) sandbox(ctx context.Context, ws *store.Workspace, callID string) (*Sandbox, error) {
	hash := ws.Scope().Hash()
	s.mu.Lock()
	b, fenced := s.boxes[hash], s.fenced
	s.mu.Unlock()
	if fenced != nil {
		return nil, fenced
	}
	if b != nil {
		if b.alive() {
			return b, nil
		}
		// This service's own sandbox of the scope is stopping (idle, its
		// lifetime, a Stop): it lets the session lease go last, so wait
		// for that rather than tell the caller that another worker holds
		// it. Stop takes no scope lock, and bounds its own waits.
		select {
		case <-b.done:
		case <-ctx.Done():
			return nil, policy.Errorf(policy.Timeout, "the workspace's session sandbox was still stopping when the call's budget ran out; nothing was run, retry")
		}
	}
	b, err := startSandbox(ctx, s, ws.Scope(), callID)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.boxes[hash] = b
	fenced = s.fenced
	s.mu.Unlock()
	if fenced != nil { // fenced while it started
		b.Stop(ctx, "fenced", callID)
		return nil, fenced
	}
	return b, nil
}

// forget drops a stopped sandbox.
func (s *Service) forget(b *Sandbox) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.boxes[b.scope.Hash()] == b {
		delete(s.boxes, b.scope.Hash())
	}
}

// WriteProcess implements tools.ProcessRunner.
func (s *Service) WriteProcess(ctx context.Context, ws *store.Workspace, req tools.ProcessInput) (tools.ProcessOutput, error) {
	p, err := s.find(ws, req.ID)
	if err != nil {
		return tools.ProcessOutput{}, err
	}
	end, _, _ := p.out.state()
	if err := p.write(ctx, req.Input, req.CallID); err != nil {
		return tools.ProcessOutput{}, err
	}
	p.waitOutput(ctx, end, req.Yield)
	return p.output(end, req.MaxBytes), nil
}

// ReadProcess implements tools.ProcessRunner.
func (s *Service) ReadProcess(ctx context.Context, ws *store.Workspace, req tools.ProcessReadRequest) (tools.ProcessOutput, error) {
	p, err := s.find(ws, req.ID)
	if err != nil {
		if rec, ok := s.ended(ws, req.ID); ok {
			return rec.endedOutput(req.Since), nil
		}
		return tools.ProcessOutput{}, err
	}
	p.box.touch()
	p.waitOutput(ctx, req.Since, req.Yield)
	return p.output(req.Since, req.MaxBytes), nil
}

// ResizeProcess implements tools.ProcessRunner.
func (s *Service) ResizeProcess(ctx context.Context, ws *store.Workspace, req tools.ProcessResizeRequest) (tools.ProcessInfo, error) {
	p, err := s.find(ws, req.ID)
	if err != nil {
		return tools.ProcessInfo{}, err
	}
	if err := p.resize(ctx, req.Cols, req.Rows, req.CallID); err != nil {
		return tools.ProcessInfo{}, err
	}
	return p.Info(), nil
}

// SignalProcess implements tools.ProcessRunner.
func (s *Service) SignalProcess(ctx context.Context, ws *store.Workspace, req tools.ProcessSignalRequest) (tools.ProcessInfo, error) {
	p, err := s.find(ws, req.ID)
	if err != nil {
		return tools.ProcessInfo{}, err
	}
	if err := p.signal(ctx, req.Signal, req.CallID); err != nil {
		return tools.ProcessInfo{}, err
	}
	// A signal that ends the process is answered with its exit; after a
	// KILL, which answers once the tree is gone, that is only the exec's
	// end and the final sweep.
	wait := 2 * time.Second
	if req.Signal == "KILL" {
		wait = 5 * time.Second
	}
	p.waitExit(ctx, wait)
	return p.Info(), nil
}

// ListProcesses implements tools.ProcessRunner: the scope's records, with
// this node's live processes as they are now.
func (s *Service) ListProcesses(ctx context.Context, ws *store.Workspace) ([]tools.ProcessInfo, error) {
	s.collect(ws)
	ids, err := ws.ProcessRecordIDs()
	if err != nil {
		return nil, err
	}
	out := make([]tools.ProcessInfo, 0, len(ids))
	for _, id := range ids {
		s.mu.Lock()
		p := s.procs[id]
		s.mu.Unlock()
		if p != nil && p.box.scope == ws.Scope() {
			out = append(out, p.Info())
			continue
		}
		var rec Record
		if ok, err := ws.ReadProcessRecord(id, &rec); err == nil && ok {
			out = append(out, rec.Info())
		}
	}
	return out, nil
}

// find returns this node's live process id of ws's scope, or the error a
// model can act on: process_on_other_node naming the owner, or not_found.
func (s *Service) find(ws *store.Workspace, id string) (*Process, error) {
	s.mu.Lock()
	p := s.procs[id]
	s.mu.Unlock()
	if p != nil && p.box.scope == ws.Scope() {
		return p, nil
	}
	var rec Record
	ok, err := ws.ReadProcessRecord(id, &rec)
	if err != nil {
		return nil, err
	}
	switch {
	case !ok:
		return nil, policy.Errorf(policy.NotFound, "no process %s in this workspace (ended processes are kept %s); see workspace_process_list", id, s.cfg.KeepEnded)
	case rec.Node != s.Node():
		if lost, ok := newFencedNodes(ws).settle(rec); ok {
			rec = lost
		}
		if rec.Status == tools.StatusLost {
			return nil, policy.Errorf(policy.NotFound, "process %s is %s", id, rec.Reason)
		}
		return nil, otherNode(rec.Node, "process "+id)
	case rec.Status == tools.StatusExited:
		return nil, policy.Errorf(policy.NotFound, "process %s has exited (exit code %s); its output is no longer kept", id, exitText(rec.ExitCode))
	}
	return nil, policy.Errorf(policy.NotFound, "process %s is gone: the service that ran it on node %s stopped", id, rec.Node)
}

// ended returns the record of an ended process of this node.
func (s *Service) ended(ws *store.Workspace, id string) (Record, bool) {
	var rec Record
	ok, err := ws.ReadProcessRecord(id, &rec)
	return rec, err == nil && ok && rec.Node == s.Node() && rec.Status == tools.StatusExited
}

// collect removes the records of processes that ended more than
// KeepEnded ago, with the output this node kept of them, and marks ended
// those a dead service of this node left running.
func (s *Service) collect(ws *store.Workspace) {
	ids, err := ws.ProcessRecordIDs()
	if err != nil {
		return
	}
	fenced := newFencedNodes(ws)
	for _, id := range ids {
		var rec Record
		if ok, err := ws.ReadProcessRecord(id, &rec); err != nil || !ok {
			continue
		}
		if rec.Node != s.Node() {
			// A fenced node's process: this node, taking over, records
			// it lost, to be collected KeepEnded after the fence.
			if lost, ok := fenced.settle(rec); ok {
				ws.WriteProcessRecord(id, lost)
				continue
			}
		}
		s.mu.Lock()
		_, live := s.procs[id]
		s.mu.Unlock()
		if b := s.boxOf(ws.Scope()); b != nil && !live {
			b.mu.Lock()
			_, live = b.procs[id] // known to its sandbox before its record is written
			b.mu.Unlock()
		}
		if rec.Ended == nil && rec.Node == s.Node() && !live {
			// Left running by a service of this node that died: it ended
			// with that service's sandbox, at an unknown time.
			now := time.Now().UTC()
			rec.Status, rec.Ended, rec.Reason = tools.StatusExited, &now, "the service that ran it stopped"
			ws.WriteProcessRecord(id, rec)
			continue
		}
		if rec.Ended != nil && time.Since(*rec.Ended) > s.cfg.KeepEnded {
			ws.RemoveProcessRecord(id)
			s.mu.Lock()
			delete(s.procs, id) // its output goes with its record
			s.mu.Unlock()
			if b := s.boxOf(ws.Scope()); b != nil {
				b.mu.Lock()
				delete(b.procs, id)
				b.mu.Unlock()
			}
		}
	}
}

func (s *Service) boxOf(sc store.Scope) *Sandbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.boxes[sc.Hash()]
}

func otherNode(node, what string) error {
	return policy.Errorf(policy.ProcessOnOtherNode, "%s runs on node %s; only that node serves it: make the call there", what, node)
}

func exitText(code *int) string {
	if code == nil {
		return "unknown"
	}
	return fmt.Sprint(*code)
}

func newProcessID() string {
	var b [6]byte
	rand.Read(b[:])
	return "p-" + hex.EncodeToString(b[:])
}

// record audits a process or sandbox event in the scope's log.
func (b *Sandbox) record(op, callID string, bytes int64, detail map[string]any) {
	if b.log == nil || b.svc.writesNothing() {
		return
	}
	d := map[string]any{"container": b.name, "node": b.svc.Node()}
	for k, v := range detail {
		d[k] = v
	}
	sc := b.scope
	b.log.Record(context.Background(), audit.Event{
		CallID: callID, Scope: sc.Hash(), Source: audit.SourceSandbox, Op: op, Result: "ok", Bytes: bytes,
		Actor:  audit.Actor{Space: sc.Space, Agent: sc.Agent, Session: sc.Session, Run: sc.Run, Instance: sc.Instance, Container: b.name},
		Detail: d,
	})
}

func pid() int { return os.Getpid() }
