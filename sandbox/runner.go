package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/agentloom/loomfs/nodeid"
	"github.com/agentloom/loomfs/slots"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/stdcopy"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/tracing"
)

// Limits on one command's run time (SPEC §5).
const (
	DefaultTimeout = 60 * time.Second
	MinTimeout     = 1 * time.Second
	MaxTimeout     = 120 * time.Second
)

// Labels on every sandbox container. Orphans finds containers by LabelScopeHash.
const (
	LabelScope     = "io.loomfs.scope"
	LabelScopeHash = "io.loomfs.scope_hash"
	LabelRun       = "io.loomfs.run"
	LabelCall      = "io.loomfs.call"
	LabelNode      = "io.loomfs.node"
	// LabelOwner names the loomfs process that created the container,
	// "PID:START" (START in clock ticks since boot), so that a container
	// found later is told from an orphan by whether its owner still runs.
	LabelOwner = "io.loomfs.owner"
	// LabelPrepared, "1", marks a container created before its command
	// was asked for (Runner.Prepare): its LabelCall is empty, since the
	// call is not known when labels are set; the call's marker and audit
	// records name it. One found in state "created" never ran.
	LabelPrepared = "io.loomfs.prepared"
)

// Defaults for a zero Config field.
const (
	DefaultUser           = "1000:1000"
	DefaultMemory         = 512 << 20
	DefaultNanoCPUs       = 1_000_000_000
	DefaultPidsLimit      = 256
	DefaultTmpSize        = 64 << 20
	DefaultOutputLimit    = 64 << 10
	DefaultCleanupTimeout = 30 * time.Second
)

// engineTimeout bounds one create or kill request made on a context that
// outlives the caller's.
const engineTimeout = 30 * time.Second

// DefaultStartDir holds the node's container start slots (Config.Starts).
const DefaultStartDir = "/run/loomfs/starts"

// StartsEnv names the variable ConfigFromEnv reads Config.Starts from.
const StartsEnv = "AGENT_LOOM_ENGINE_STARTS"

// DefaultStarts is the bound on the containers a node creates and starts
// at once when Config.Starts is 0: enough to keep an engine busy, and far
// below the 50 in one second that deadlocked dockerd on a 2-CPU node.
func DefaultStarts() int { return max(4, 2*runtime.NumCPU()) }

var (
	// ErrEngineBusy marks a request refused because the node's container
	// start slots stayed taken for as long as it could wait: nothing was
	// created, and the same request may be made again.
	ErrEngineBusy = errors.New("sandbox: the node's container engine is busy")
	// ErrInvalidRequest marks a request refused before anything started.
	ErrInvalidRequest = errors.New("sandbox: invalid request")
	// ErrQuarantined marks a run whose container removal was not confirmed:
	// its execution marker stays and the scope must be cleared by an
	// administrator (SPEC §7.3).
	ErrQuarantined = errors.New("sandbox: scope quarantined")
	// ErrStartFailed marks a container the engine created but could not
	// start; the error carries the runtime's own message, host paths
	// masked.
	ErrStartFailed = errors.New("sandbox: the container runtime failed to start the container")
)

// Config configures a Runner. Zero fields take the defaults above; none is
// read from the environment except through ConfigFromEnv.
type Config struct {
	Host           string        // engine address, unix:// only; "" means DefaultHost
	Image          string        // "" means DefaultImage
	Runtime        string        // engine runtime such as runsc; "" for the engine's default
	User           string        // numeric "uid:gid", never root; "" means DefaultUser
	Node           string        // this worker's name in labels and markers; "" means the hostname
	Memory         int64         // bytes, swap included
	NanoCPUs       int64         // CPU quota in 1e-9 CPUs
	PidsLimit      int64         // processes and threads
	TmpSize        int64         // bytes of the tmpfs at /tmp
	OutputLimit    int           // bytes kept of each of stdout and stderr
	CleanupTimeout time.Duration // how long to wait for the engine to confirm removal
	// Starts bounds the containers that every runner on this node has
	// the engine create and start at once; 0 means DefaultStarts. The
	// bound is kept with lock files in StartDir, "" meaning
	// DefaultStartDir, which every runner of the node must share.
	Starts   int
	StartDir string

	envErr error // a variable ConfigFromEnv could not read

	// Observe, when set, receives one call per container event for the audit
	// log: container_create, container_start, container_exit, container_kill,
	// container_removed and container_remove_unconfirmed; for a container
	// made ahead of its command (Prepare) container_prepare instead of
	// container_create, and container_prepared_gone when the engine no
	// longer knew it as its command came (one is then created); and
	// container_engine_busy for a command refused because the node's
	// start slots stayed taken (nothing was created).
	Observe func(ctx context.Context, op string, detail map[string]any)
}

// ConfigFromEnv returns a Config naming the engine, image and runtime of
// AGENT_LOOM_DOCKER_HOST, AGENT_LOOM_SANDBOX_IMAGE and AGENT_LOOM_SANDBOX_RUNTIME,
// and the node's bound on container starts of AGENT_LOOM_ENGINE_STARTS. A
// value it can't read makes NewRunner fail with what is wrong.
func ConfigFromEnv() Config {
	c := Config{Host: HostFromEnv(), Image: ImageFromEnv(), Runtime: os.Getenv("AGENT_LOOM_SANDBOX_RUNTIME")}
	if v := os.Getenv(StartsEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			c.envErr = fmt.Errorf("sandbox: %s=%q: want the number of containers this node may start at once, 1 or more", StartsEnv, v)
		}
		c.Starts = n
	}
	return c
}

func (c Config) withDefaults() (Config, error) {
	if c.envErr != nil {
		return c, c.envErr
	}
	if c.Starts < 0 {
		return c, fmt.Errorf("sandbox: %d container starts at once: want 1 or more, or 0 for the default", c.Starts)
	}
	if c.Starts == 0 {
		c.Starts = DefaultStarts()
	}
	if c.StartDir == "" {
		c.StartDir = DefaultStartDir
	}
	if c.Host == "" {
		c.Host = DefaultHost
	}
	if c.Image == "" {
		c.Image = DefaultImage
	}
	if _, err := normalizeTag(c.Image, false); err != nil {
		return c, err
	}
	if c.Runtime != "" && !validName(c.Runtime, 64) {
		return c, fmt.Errorf("sandbox: runtime %q: not a runtime name", c.Runtime)
	}
	uid, gid, err := parseUser(c.User)
	if err != nil {
		return c, err
	}
	c.User = fmt.Sprintf("%d:%d", uid, gid)
	if c.Node == "" {
		if c.Node, err = nodeid.Name(); err != nil {
			return c, fmt.Errorf("sandbox: %w", err)
		}
	}
	for _, f := range []struct {
		v   *int64
		def int64
	}{{&c.Memory, DefaultMemory}, {&c.NanoCPUs, DefaultNanoCPUs}, {&c.PidsLimit, DefaultPidsLimit}, {&c.TmpSize, DefaultTmpSize}} {
		if *f.v < 0 {
			return c, fmt.Errorf("sandbox: negative resource limit %d", *f.v)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	if c.OutputLimit <= 0 {
		c.OutputLimit = DefaultOutputLimit
	}
	if c.CleanupTimeout <= 0 {
		c.CleanupTimeout = DefaultCleanupTimeout
	}
	return c, nil
}

// parseUser parses a numeric "uid:gid" and refuses root.
func parseUser(s string) (uid, gid int, err error) {
	if s == "" {
		s = DefaultUser
	}
	u, g, ok := strings.Cut(s, ":")
	uid, err1 := strconv.Atoi(u)
	gid, err2 := strconv.Atoi(g)
	if !ok || err1 != nil || err2 != nil || uid < 0 || gid < 0 {
		return 0, 0, fmt.Errorf("%w: user %q: want numeric uid:gid", ErrInvalidRequest, s)
	}
	if uid == 0 || gid == 0 {
		return 0, 0, fmt.Errorf("%w: user %q: sandbox commands never run as root", ErrInvalidRequest, s)
	}
	return uid, gid, nil
}

// Runner runs commands in sandbox containers on one local engine. It is safe
// for concurrent use.
type Runner struct {
	cli     *client.Client
	cfg     Config
	seccomp string     // the profile's JSON (SeccompProfile)
	owner   Owner      // this process, in LabelOwner and markers
	starts  *slots.Set // the node's container start slots
}

// NewRunner connects to the engine named by cfg and checks that it answers.
// It does not require the image; CheckImage does.
func NewRunner(ctx context.Context, cfg Config) (*Runner, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	profile, err := SeccompProfile()
	if err != nil {
		return nil, err
	}
	cli, err := dial(ctx, cfg.Host)
	if err != nil {
		return nil, err
	}
	return &Runner{cli: cli, cfg: cfg, seccomp: profile, owner: self(), starts: slots.New(cfg.StartDir, cfg.Starts)}, nil
}

// StartSlot waits, for as long as wait or until ctx ends, for one of the
// node's container start slots, and holds it until release is called:
// a container's create and start are made within one, so that a burst of
// commands reaches the engine a few at a time. When wait runs out first
// the error wraps ErrEngineBusy.
func (r *Runner) StartSlot(ctx context.Context, wait time.Duration) (release func(), err error) {
	_, span := tracing.Start(ctx, "container start slot")
	defer span.End()
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	release, err = r.starts.Take(wctx)
	switch {
	case err == nil:
		return release, nil
	case ctx.Err() != nil:
		return nil, fmt.Errorf("sandbox: %w", context.Cause(ctx))
	case errors.Is(err, slots.ErrBusy):
		return nil, fmt.Errorf("%w: this node's %d container starts at once (%s) stayed taken for %s, so nothing was started",
			ErrEngineBusy, r.starts.Size(), StartsEnv, wait)
	}
	return nil, fmt.Errorf("sandbox: container start slots: %s", policy.MaskHostPaths(err.Error()))
}

// Close releases the engine connection.
func (r *Runner) Close() error { return r.cli.Close() }

// Image returns the image the runner starts containers from.
func (r *Runner) Image() string { return r.cfg.Image }

// CheckImage reports ErrImageMissing, with the command that builds it, when
// the runner's image is not on the engine. Images are never pulled.
func (r *Runner) CheckImage(ctx context.Context) error {
	_, err := r.imageID(ctx)
	return err
}

// imageID returns the engine's id of the runner's image, or CheckImage's
// error.
func (r *Runner) imageID(ctx context.Context) (string, error) {
	info, err := r.cli.ImageInspect(ctx, r.cfg.Image)
	switch {
	case err == nil:
		return info.ID, nil
	case !cerrdefs.IsNotFound(err):
		return "", fmt.Errorf("sandbox: inspect image %s: %w", r.cfg.Image, err)
	}
	build := "loomfs image build --tag " + r.cfg.Image
	switch r.cfg.Image {
	case DefaultImage:
		build = "loomfs image build"
	case MinimalImage:
		build = "loomfs image build --minimal"
	}
	return "", fmt.Errorf("%w: %s; build it with `%s` (images are never pulled)", ErrImageMissing, r.cfg.Image, build)
}

// Request is one command to run in a fresh container.
type Request struct {
	Command   string            // run by sh -c with umask 077 in /workspace
	Timeout   time.Duration     // 0 means DefaultTimeout; else MinTimeout..MaxTimeout
	Workspace string            // existing host directory mounted read-write at /workspace
	Skills    map[string]string // skill id → existing host directory, read-only at /skills/<id>
	Scope     string            // the logical scope, for labels and the marker
	ScopeHash string            // the scope's hash; letters and digits
	Run, Call string            // run and call ids, for labels and the marker
	Marker    MarkerHooks       // required: persists the execution marker
	// Name is the container's name; "" picks one with NewContainerName.
	// Callers set it to label what they prepare before the container
	// exists (the projection's audit records).
	Name string
	// Prepared, if set, is a container Prepare made for this request's
	// scope and mounts, not yet started: Run starts it instead of creating
	// one, and hands it Command on its standard input. Name must be its
	// name or "". If the engine no longer knows it, Run creates a container
	// by the same name as usual.
	Prepared *Prepared
}

// Marker is the execution marker persisted while a container may exist.
type Marker struct {
	Container string    `json:"container_name"`
	Node      string    `json:"node"`
	Run       string    `json:"run"`
	Call      string    `json:"call"`
	Scope     string    `json:"scope"`
	Time      time.Time `json:"time"`
	PID       int       `json:"pid"`
	PIDStart  uint64    `json:"pid_start_ticks"` // with PID, names this process for good
}

// MarkerHooks persists a scope's execution marker. Set is called before the
// container is created, so a crash at any later point leaves the marker;
// Clear is called only after the engine confirmed the container's removal,
// or after a failed Set, when no container was asked for.
type MarkerHooks interface {
	Set(ctx context.Context, m Marker) error
	Clear(ctx context.Context) error
}

// Result is what a command did. A non-zero exit code or a timeout is a
// result, not an error.
type Result struct {
	ExitCode        int           `json:"exit_code"` // -1 when no exit status was received
	Stdout          string        `json:"stdout"`
	Stderr          string        `json:"stderr"`
	StdoutTruncated bool          `json:"stdout_truncated"`
	StderrTruncated bool          `json:"stderr_truncated"`
	TimedOut        bool          `json:"timed_out"`
	Cancelled       bool          `json:"cancelled"`
	ContainerName   string        `json:"container_name"`
	ContainerID     string        `json:"container_id"`
	Duration        time.Duration `json:"duration_ns"`
}

// Run runs req.Command in a new container and removes it. It sets the
// execution marker first, creates and starts the container, kills it on
// timeout or when ctx ends, removes it on a context of its own, and clears
// the marker once the engine confirms the removal. If removal is not
// confirmed the error wraps ErrQuarantined and the marker stays. A cancelled
// ctx returns the partial Result and an error wrapping ctx's error.
// req.Prepared is removed in every case.
func (r *Runner) Run(ctx context.Context, req Request) (Result, error) {
	if p := req.Prepared; p != nil {
		ran := false
		defer func() {
			if !ran { // refused before it could start
				p.Remove(ctx)
			}
		}()
		return r.run(ctx, req, &ran)
	}
	return r.run(ctx, req, new(bool))
}

// run is Run; it sets ran once req.Prepared is the command's, to start
// and remove.
func (r *Runner) run(ctx context.Context, req Request, ran *bool) (Result, error) {
	timeout, err := req.check()
	if err != nil {
		return Result{}, err
	}
	if err := ctx.Err(); err != nil {
		return Result{}, fmt.Errorf("sandbox: %w", err)
	}
	if req.Prepared == nil {
		if err := r.CheckImage(ctx); err != nil {
			return Result{}, err
		}
	} else if err := req.Prepared.fits(r, req); err != nil {
		return Result{}, err
	}
	began := time.Now()
	res := Result{ExitCode: -1, ContainerName: req.Name}
	if req.Prepared != nil {
		res.ContainerName = req.Prepared.Name
	}
	if res.ContainerName == "" {
		res.ContainerName = NewContainerName(req.ScopeHash)
	} else if !validName(res.ContainerName, 128) {
		return res, fmt.Errorf("%w: container name %q", ErrInvalidRequest, res.ContainerName)
	}
	m := Marker{Container: res.ContainerName, Node: r.cfg.Node, Run: req.Run, Call: req.Call,
		Scope: req.Scope, Time: began.UTC(), PID: r.owner.PID, PIDStart: r.owner.Start}
	if err := req.Marker.Set(ctx, m); err != nil {
		// No container was requested, so a half-written marker may go.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.CleanupTimeout)
		defer cancel()
		return res, errors.Join(fmt.Errorf("sandbox: set execution marker for %s: %w", res.ContainerName, err), req.Marker.Clear(cctx))
	}
	ctx, span := tracing.Start(ctx, "sandbox run", attribute.String("loomfs.container", res.ContainerName),
		attribute.String("loomfs.runtime", r.cfg.Runtime))
	defer span.End()
	release, err := r.StartSlot(ctx, timeout)
	if err != nil {
		if errors.Is(err, ErrEngineBusy) {
			r.observe(ctx, "container_engine_busy", req, &res, map[string]any{"starts": r.starts.Size(), "waited_ms": timeout.Milliseconds()})
		}
		// Nothing was asked of the engine: the marker may go.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.CleanupTimeout)
		defer cancel()
		return res, errors.Join(err, req.Marker.Clear(cctx))
	}
	started := sync.OnceFunc(release)
	defer started()
	*ran = true
	known, runErr := r.execute(ctx, req, timeout, &res, started)
	cleanErr := r.cleanup(context.WithoutCancel(ctx), req, &res, known)
	span.SetAttributes(attribute.Int("loomfs.exit_code", res.ExitCode), attribute.Bool("loomfs.timed_out", res.TimedOut))
	if err := errors.Join(runErr, cleanErr); err != nil {
		span.SetStatus(codes.Error, policy.MaskHostPaths(err.Error()))
	}
	res.Duration = time.Since(began)
	return res, errors.Join(runErr, cleanErr)
}

// execute creates, starts and waits for the container, or starts and
// waits for req.Prepared. known reports whether the engine answered the
// create request, so that its outcome is known. It calls started once the
// engine answered the start request, to free the start slot it was made
// in.
func (r *Runner) execute(ctx context.Context, req Request, timeout time.Duration, res *Result, started func()) (known bool, err error) {
	octx := context.WithoutCancel(ctx)
	var hj types.HijackedResponse
	var created container.CreateResponse
	prepared := false
	if p := req.Prepared; p != nil {
		_, span := tracing.Start(octx, "container attach prepared")
		hj, err = r.cli.ContainerAttach(octx, p.ID, container.AttachOptions{Stream: true, Stdin: true, Stdout: true, Stderr: true})
		span.End()
		switch {
		case err == nil:
			created.ID, prepared = p.ID, true
		case isNotFound(err):
			// Removed behind our back (docker container prune removes
			// created containers): make one by the same name.
			r.observe(octx, "container_prepared_gone", req, res, map[string]any{"container_id": p.ID})
		default:
			res.ContainerID = p.ID
			return true, fmt.Errorf("sandbox: attach to %s: %w", res.ContainerName, err)
		}
	}
	if !prepared {
		cc, hc := r.containerConfig(req, false)
		// The create request runs to its answer even if ctx ends meanwhile: only
		// an answered request lets cleanup prove that no container is left.
		cctx, cancel := context.WithTimeout(octx, engineTimeout)
		_, span := tracing.Start(octx, "container create")
		created, err = r.cli.ContainerCreate(cctx, cc, hc, nil, nil, res.ContainerName)
		span.End()
		cancel()
		if err != nil {
			return answered(err), fmt.Errorf("sandbox: create container %s: %w", res.ContainerName, err)
		}
		res.ContainerID = created.ID
		r.observe(octx, "container_create", req, res, map[string]any{"image": r.cfg.Image})
		hj, err = r.cli.ContainerAttach(octx, created.ID, container.AttachOptions{Stream: true, Stdout: true, Stderr: true})
		if err != nil {
			return true, fmt.Errorf("sandbox: attach to %s: %w", res.ContainerName, err)
		}
	}
	res.ContainerID = created.ID
	defer hj.Close()
	stdout, stderr := newCapture(r.cfg.OutputLimit), newCapture(r.cfg.OutputLimit)
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		stdcopy.StdCopy(stdout, stderr, hj.Reader) // ends when the container's stdio closes or hj is closed
	}()
	defer func() {
		// Let the stream finish briefly, then cut it; captures are read only after the copier is done.
		select {
		case <-copied:
		case <-time.After(2 * time.Second):
			hj.Close()
			<-copied
		}
		res.Stdout, res.StdoutTruncated = stdout.result()
		res.Stderr, res.StderrTruncated = stderr.result()
	}()

	wctx, wcancel := context.WithCancel(octx)
	defer wcancel()
	waitC, waitErrC := r.cli.ContainerWait(wctx, created.ID, container.WaitConditionNextExit)
	waited := false
	defer func() {
		if !waited { // release the client's goroutine, which may still deliver a status
			go func() {
				select {
				case <-waitC:
				case <-waitErrC:
				}
			}()
		}
	}()

	// A runtime that never answers the start request costs the command's
	// budget, not more.
	sctx, scancel := context.WithTimeout(ctx, timeout)
	_, span := tracing.Start(octx, "container start")
	err = r.cli.ContainerStart(sctx, created.ID, container.StartOptions{})
	span.End()
	startExpired := sctx.Err() != nil
	scancel()
	started()
	var reason string
	switch {
	case err != nil && ctx.Err() != nil:
		hj.Close() // nothing more will come
		res.Cancelled = true
		return true, fmt.Errorf("sandbox: command cancelled: %w", context.Cause(ctx))
	case err != nil && startExpired:
		// The engine took the whole budget to start it (a loaded host): the
		// command ran out of time, as it would have running. The container
		// may still start: it is killed like any command over its time.
		res.TimedOut, reason = true, "timeout"
		r.observe(octx, "container_start", req, res, map[string]any{"timeout_ms": timeout.Milliseconds(), "expired": true})
	case err != nil:
		hj.Close() // nothing more will come
		msg := policy.MaskHostPaths(err.Error())
		r.observe(octx, "container_start_failed", req, res, map[string]any{"error": msg, "runtime": r.cfg.Runtime})
		return true, fmt.Errorf("%w: %s", ErrStartFailed, msg)
	default:
		r.observe(octx, "container_start", req, res, map[string]any{"timeout_ms": timeout.Milliseconds(), "prepared": prepared})
		if prepared {
			// The command, then the end of its input: the entrypoint
			// reads up to the end (preparedEntrypoint). The write goes
			// to the engine's socket, which takes it whole or fails
			// when hj is closed.
			go func() {
				if _, err := io.WriteString(hj.Conn, req.Command); err == nil {
					hj.CloseWrite()
				}
			}()
		}
	}

	timer := time.NewTimer(timeout)
	defer timer.Stop()
	_, span = tracing.Start(octx, "container wait")
	defer span.End()
	if !res.TimedOut {
		select {
		case w := <-waitC:
			waited = true
			res.ExitCode = int(w.StatusCode)
			r.observe(octx, "container_exit", req, res, map[string]any{"exit_code": res.ExitCode})
			if w.Error != nil && w.Error.Message != "" {
				return true, fmt.Errorf("sandbox: wait for %s: %s", res.ContainerName, w.Error.Message)
			}
			return true, nil
		case err := <-waitErrC:
			waited = true
			return true, fmt.Errorf("sandbox: wait for %s: %w", res.ContainerName, err)
		case <-timer.C:
			res.TimedOut, reason = true, "timeout"
		case <-ctx.Done():
			res.Cancelled, reason = true, "cancelled"
		}
	}

	kctx, kcancel := context.WithTimeout(octx, engineTimeout)
	kerr := r.cli.ContainerKill(kctx, created.ID, "KILL")
	kcancel()
	detail := map[string]any{"reason": reason}
	if kerr != nil {
		detail["error"] = kerr.Error()
	}
	r.observe(octx, "container_kill", req, res, detail)
	select { // the exit status, also when the kill lost a race with a normal exit
	case w := <-waitC:
		waited = true
		res.ExitCode = int(w.StatusCode)
		r.observe(octx, "container_exit", req, res, map[string]any{"exit_code": res.ExitCode})
	case <-waitErrC:
		waited = true
	case <-time.After(exitWait(startExpired)):
	}
	if res.Cancelled {
		return true, fmt.Errorf("sandbox: command cancelled: %w", context.Cause(ctx))
	}
	return true, nil
}

// exitWait is how long a killed container's exit status is waited for: a
// container whose start did not answer in time may never have run, and
// cleanup's forced removal settles it either way.
func exitWait(startExpired bool) time.Duration {
	if startExpired {
		return time.Second
	}
	return 10 * time.Second
}

// cleanup force-removes the container and waits until the engine no longer
// knows it, then clears the marker. Anything short of that quarantines the
// scope. ctx carries values only; the wait is bounded by CleanupTimeout.
func (r *Runner) cleanup(ctx context.Context, req Request, res *Result, known bool) error {
	cctx, cancel := context.WithTimeout(ctx, r.cfg.CleanupTimeout)
	defer cancel()
	_, span := tracing.Start(ctx, "container remove")
	defer span.End()
	ref := res.ContainerID
	if ref == "" {
		ref = res.ContainerName
	}
	err := r.removeConfirmed(cctx, ref)
	if err == nil && !known {
		err = errors.New("the engine did not answer the create request, so the container may still appear")
	}
	if err != nil {
		r.observe(ctx, "container_remove_unconfirmed", req, res, map[string]any{"error": err.Error()})
		return fmt.Errorf("%w: scope %s: removal of container %s not confirmed: %v; writes and commands stay refused until an administrator makes sure it is gone and runs `loomfs quarantine clear`",
			ErrQuarantined, req.Scope, res.ContainerName, err)
	}
	r.observe(ctx, "container_removed", req, res, nil)
	if err := req.Marker.Clear(cctx); err != nil {
		return fmt.Errorf("%w: scope %s: container %s is removed but its execution marker could not be cleared: %v",
			ErrQuarantined, req.Scope, res.ContainerName, err)
	}
	return nil
}

// removeConfirmed removes ref with force until an inspect answers not found.
func (r *Runner) removeConfirmed(ctx context.Context, ref string) error {
	for {
		err := r.cli.ContainerRemove(ctx, ref, container.RemoveOptions{Force: true, RemoveVolumes: true})
		if err == nil || isNotFound(err) {
			_, err = r.cli.ContainerInspect(ctx, ref)
			if isNotFound(err) {
				return nil
			}
			if err == nil {
				err = errors.New("the engine still lists it")
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last answer: %v)", ctx.Err(), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// containerConfig is the whole security posture of a sandbox container.
// A prepared container (Prepare) has the same posture, and reads its
// command from its standard input instead of its arguments.
func (r *Runner) containerConfig(req Request, prepared bool) (*container.Config, *container.HostConfig) {
	mounts := []mount.Mount{{
		Type: mount.TypeBind, Source: req.Workspace, Target: "/workspace",
		BindOptions: &mount.BindOptions{Propagation: mount.PropagationRPrivate},
	}}
	for _, id := range sortedKeys(req.Skills) {
		mounts = append(mounts, mount.Mount{
			Type: mount.TypeBind, Source: req.Skills[id], Target: "/skills/" + id, ReadOnly: true,
			BindOptions: &mount.BindOptions{Propagation: mount.PropagationRPrivate},
		})
	}
	pids := r.cfg.PidsLimit
	cc := &container.Config{
		Image: r.cfg.Image,
		User:  r.cfg.User,
		// "$1" hands the command to the inner shell as one argument, unquoted by nobody.
		Entrypoint:   []string{"/bin/sh", "-c", `umask 077 && exec /bin/sh -c "$1"`, "sh", req.Command},
		WorkingDir:   "/workspace",
		Env:          commandEnv,
		AttachStdout: true,
		AttachStderr: true,
		Labels: map[string]string{
			LabelScope: req.Scope, LabelScopeHash: req.ScopeHash,
			LabelRun: req.Run, LabelCall: req.Call, LabelNode: r.cfg.Node,
			LabelOwner: r.owner.String(),
		},
	}
	if prepared {
		cc.Entrypoint = preparedEntrypoint
		cc.OpenStdin, cc.StdinOnce, cc.AttachStdin = true, true, true
		cc.Labels[LabelCall] = ""
		cc.Labels[LabelPrepared] = "1"
	}
	hc := &container.HostConfig{
		NetworkMode:    "none",
		ReadonlyRootfs: true,
		Mounts:         mounts,
		// exec: the engine's tmpfs default is noexec, which breaks go test
		// and every build that runs what it just made in /tmp; the
		// workspace is executable anyway.
		Tmpfs:       map[string]string{"/tmp": fmt.Sprintf("rw,exec,nosuid,nodev,size=%d,mode=1777", r.cfg.TmpSize)},
		CapDrop:     []string{"ALL"},
		SecurityOpt: []string{"no-new-privileges", "seccomp=" + r.seccomp},
		IpcMode:     container.IPCModePrivate,
		Runtime:     r.cfg.Runtime,
		LogConfig:   container.LogConfig{Type: "none"}, // output is captured by attach, bounded; the engine keeps none
		Resources: container.Resources{
			Memory:     r.cfg.Memory,
			MemorySwap: r.cfg.Memory,
			NanoCPUs:   r.cfg.NanoCPUs,
			PidsLimit:  &pids,
		},
	}
	return cc, hc
}

func (r *Runner) observe(ctx context.Context, op string, req Request, res *Result, extra map[string]any) {
	if r.cfg.Observe == nil {
		return
	}
	detail := map[string]any{
		"container": res.ContainerName, "container_id": res.ContainerID, "node": r.cfg.Node,
		"scope": req.Scope, "scope_hash": req.ScopeHash, "run": req.Run, "call": req.Call,
	}
	for k, v := range extra {
		detail[k] = v
	}
	r.cfg.Observe(ctx, op, detail)
}

// check validates the request and returns its effective timeout.
func (req *Request) check() (time.Duration, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidRequest, fmt.Sprintf(format, args...))
	}
	timeout, err := checkCommand(req.Command, req.Timeout)
	if err != nil {
		return 0, err
	}
	if req.Marker == nil {
		return 0, bad("no execution marker hooks: a command may not run without a persisted marker")
	}
	if !validHash(req.ScopeHash) {
		return 0, bad("scope hash %q: want 1 to 128 letters and digits", req.ScopeHash)
	}
	for what, v := range map[string]string{"scope": req.Scope, "run": req.Run, "call": req.Call} {
		if len(v) > 512 || strings.IndexFunc(v, unicode.IsControl) >= 0 {
			return 0, bad("%s %q: too long or contains control characters", what, v)
		}
	}
	if req.Scope == "" {
		return 0, bad("empty scope")
	}
	if err := checkDir("workspace", req.Workspace); err != nil {
		return 0, err
	}
	for id, dir := range req.Skills {
		if !validName(id, 64) {
			return 0, bad("skill id %q: want up to 64 letters, digits, '.', '_' or '-', starting with a letter or digit", id)
		}
		if err := checkDir("skill "+id, dir); err != nil {
			return 0, err
		}
	}
	return timeout, nil
}

// checkDir requires p to be an existing directory named by a clean absolute
// path, not a symlink: bind mount sources are never created or followed.
func checkDir(what, p string) error {
	if !filepath.IsAbs(p) || filepath.Clean(p) != p {
		return fmt.Errorf("%w: %s %q: want a clean absolute host path", ErrInvalidRequest, what, p)
	}
	if p == "/" {
		return fmt.Errorf("%w: %s may not be the host's root directory", ErrInvalidRequest, what)
	}
	fi, err := os.Lstat(p)
	switch {
	case err != nil:
		return fmt.Errorf("%w: %s: %v (bind mount sources are never created)", ErrInvalidRequest, what, err)
	case fi.Mode()&os.ModeSymlink != 0:
		return fmt.Errorf("%w: %s %q is a symlink", ErrInvalidRequest, what, p)
	case !fi.IsDir():
		return fmt.Errorf("%w: %s %q is not a directory", ErrInvalidRequest, what, p)
	}
	return nil
}

func validHash(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// hostPath is an absolute path in an engine or runtime message.
// NewContainerName returns loomfs-<first 12 of the scope hash>-<8 random hex digits>.
func NewContainerName(scopeHash string) string {
	var b [4]byte
	rand.Read(b[:])
	return "loomfs-" + strings.ToLower(scopeHash[:min(12, len(scopeHash))]) + "-" + hex.EncodeToString(b[:])
}
