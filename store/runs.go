package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
)

// Run bindings (SPEC §2.3). A new run records, once, where it lives:
// backend, volume id, layout version, scope ids and the user who started it,
// in <root>/.agentloom-runs/<run_id>.json. A session records the volume it
// is bound to in <root>/.agentloom-runs/sessions/<key>.json. Resuming a run
// reads its binding, never today's configuration: this node's configuration
// only says where the node sees the volume, and must agree with the binding
// or the resume is refused.
//
// A run with no binding is a legacy run from before bindings existed: its
// files stay in <data>/runs/<run_id>, are never moved, and are served from
// there with the same fd-based rules as every scope.

// SessionsDir holds session bindings inside RunsDir.
const SessionsDir = "sessions"

// LegacyRunsDir is where runs created before bindings keep their files,
// relative to the data directory.
const LegacyRunsDir = "runs"

// MaxUserBytes bounds the initiating user's name in a binding.
const MaxUserBytes = 256

// maxBindingBytes bounds what is read of a binding file.
const maxBindingBytes = 64 << 10

// RunSpec is what the platform's authorised run record says of a new run.
type RunSpec struct {
	Space, Agent, Session string
	Run                   string
	User                  string // the authenticated user who started the run
	// Priority is the run's class (policy.Priority); "" leaves it to the
	// policy's default when the run is opened.
	Priority policy.Priority
}

// Binding is a run's record: where its files are, fixed at creation.
type Binding struct {
	RunID         string    `json:"run_id"`
	Backend       string    `json:"backend"`
	VolumeID      string    `json:"volume_id"`
	LayoutVersion int       `json:"layout_version"`
	Space         string    `json:"space"`
	Agent         string    `json:"agent"`
	Session       string    `json:"session"`
	User          string    `json:"user"`
	Created       time.Time `json:"created"`
	// Priority is the run's class; "" (a binding from before priorities)
	// is the policy's default.
	Priority policy.Priority `json:"priority,omitempty"`
}

// MainScope is the scope of the session's main agent, which every run of
// the session shares.
func (b *Binding) MainScope() Scope {
	return Scope{Space: b.Space, Agent: b.Agent, Session: b.Session}
}

// InstanceScope is the scope of one child instance of the run.
func (b *Binding) InstanceScope(instance string) Scope {
	return Scope{Space: b.Space, Agent: b.Agent, Session: b.Session, Run: b.RunID, Instance: instance}
}

// sameVolume reports whether b and the volume (backend, id) agree.
func (b *Binding) sameVolume(backend, volumeID string) bool {
	return b.Backend == backend && b.VolumeID == volumeID
}

// sessionBinding ties a session to one volume for life (SPEC §2.2).
type sessionBinding struct {
	Backend       string    `json:"backend"`
	VolumeID      string    `json:"volume_id"`
	LayoutVersion int       `json:"layout_version"`
	Space         string    `json:"space"`
	Agent         string    `json:"agent"`
	Session       string    `json:"session"`
	FirstRun      string    `json:"first_run"`
	Created       time.Time `json:"created"`
}

// sessionFile names a session's binding. The key comes from the logical ids
// only, like every name loomfs derives, and not from the layout version: a
// session stays bound across layouts.
func sessionFile(space, agent, session string) string {
	h := sha256.New()
	fmt.Fprintf(h, "loomfs-session\x00%s\x00%s\x00%s", space, agent, session)
	return hex.EncodeToString(h.Sum(nil))[:32] + ".json"
}

// ValidateUser checks the initiating user's name: 1–256 bytes of UTF-8
// without control characters. It is compared byte for byte, never parsed.
func ValidateUser(user string) error {
	if user == "" || len(user) > MaxUserBytes || !utf8.ValidString(user) {
		return policy.Errorf(policy.InvalidInput, "user must be 1–%d bytes of UTF-8", MaxUserBytes)
	}
	for _, r := range user {
		if unicode.IsControl(r) {
			return policy.Errorf(policy.InvalidInput, "user contains a control character (U+%04X)", r)
		}
	}
	return nil
}

func (s RunSpec) validate() error {
	sc := Scope{Space: s.Space, Agent: s.Agent, Session: s.Session, Run: s.Run, Instance: "main"}
	if err := sc.Validate(); err != nil {
		return err
	}
	if s.Priority != "" {
		if _, err := policy.ParsePriority(string(s.Priority)); err != nil {
			return err
		}
	}
	return ValidateUser(s.User)
}

// volumeKey is what a binding records of cfg's volume: the local backend
// has no volume id, whatever the configuration says.
func volumeKey(cfg Config) (backend, volumeID string) {
	if cfg.Backend == "" || cfg.Backend == BackendLocal {
		return BackendLocal, ""
	}
	return cfg.Backend, cfg.VolumeID
}

// CreateRun records a new run's binding. A shared volume is checked first
// (root and marker; nothing is created when it fails). The session is bound
// to the volume on its first run; a run of the same session on another
// volume is refused. Creating a run whose identical binding exists returns
// that binding, so a platform may retry; any other existing binding, or a
// legacy run of that id, is refused.
func CreateRun(ctx context.Context, cfg Config, spec RunSpec) (*Binding, error) {
	if err := spec.validate(); err != nil {
		return nil, err
	}
	backend, volumeID := volumeKey(cfg)
	vol, err := OpenVolume(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer vol.Close()
	if dir, ok, err := legacyRunDir(cfg, spec.Run); err != nil {
		return nil, err
	} else if ok {
		return nil, policy.Errorf(policy.Exists, "run %s already exists as a legacy run (%s); it keeps its old layout and gets no binding", spec.Run, dir)
	}
	runsFD, sessFD, err := vol.bindingDirs()
	if err != nil {
		return nil, err
	}
	defer unix.Close(runsFD)
	defer unix.Close(sessFD)

	now := time.Now().UTC()
	b := &Binding{RunID: spec.Run, Backend: backend, VolumeID: volumeID, LayoutVersion: LayoutVersion,
		Space: spec.Space, Agent: spec.Agent, Session: spec.Session, User: spec.User, Created: now, Priority: spec.Priority}
	name := spec.Run + ".json"
	// An existing binding is answered before the session is bound, so a
	// refused request records nothing; the create below settles races.
	if prev, err := sameBinding(runsFD, name, b); prev != nil || err != nil {
		return prev, err
	}
	sb := sessionBinding{Backend: backend, VolumeID: volumeID, LayoutVersion: LayoutVersion,
		Space: spec.Space, Agent: spec.Agent, Session: spec.Session, FirstRun: spec.Run, Created: now}
	if err := bindSession(sessFD, sb); err != nil {
		return nil, err
	}
	err = createJSONAt(runsFD, name, b)
	if err == unix.EEXIST {
		prev, err := sameBinding(runsFD, name, b)
		if prev == nil && err == nil {
			err = fmt.Errorf("binding of run %s vanished while it was being created", spec.Run)
		}
		return prev, err
	}
	if err != nil {
		return nil, fmt.Errorf("record binding of run %s: %w", spec.Run, err)
	}
	return b, ctx.Err()
}

// bindingDirs opens (creating) .agentloom-runs and its sessions directory,
// readable so that their entries can be fsynced.
func (v *Volume) bindingDirs() (runsFD, sessFD int, err error) {
	fd, err := mkdirAll(int(v.root.Fd()), RunsDir+"/"+SessionsDir)
	if err != nil {
		return -1, -1, fmt.Errorf("run bindings directory: %w", err)
	}
	unix.Close(fd)
	runsFD, err = openBeneath(int(v.root.Fd()), RunsDir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return -1, -1, fmt.Errorf("run bindings directory: %w", err)
	}
	sessFD, err = openBeneath(runsFD, SessionsDir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		unix.Close(runsFD)
		return -1, -1, fmt.Errorf("session bindings directory: %w", err)
	}
	return runsFD, sessFD, nil
}

// sameBinding reads the existing binding name: nil if there is none, the
// binding if it is b's (but for its creation time), an exists error if it
// is another run's.
func sameBinding(dfd int, name string, b *Binding) (*Binding, error) {
	var prev Binding
	found, err := readJSONAt(dfd, name, &prev)
	if err != nil || !found {
		return nil, err
	}
	same := prev
	same.Created = b.Created
	if same == *b {
		return &prev, nil
	}
	return nil, policy.Errorf(policy.Exists, "run %s already has a binding (another session, user or volume); resume it instead", b.RunID)
}

// bindSession records sb unless the session is bound already; a binding to
// another volume is refused.
func bindSession(dfd int, sb sessionBinding) error {
	name := sessionFile(sb.Space, sb.Agent, sb.Session)
	err := createJSONAt(dfd, name, sb)
	if err == nil {
		return nil
	}
	if err != unix.EEXIST {
		return fmt.Errorf("record session binding: %w", err)
	}
	var prev sessionBinding
	if _, err := readJSONAt(dfd, name, &prev); err != nil {
		return err
	}
	if prev.Space != sb.Space || prev.Agent != sb.Agent || prev.Session != sb.Session {
		return fmt.Errorf("session binding %s names session %s/%s/%s, not %s/%s/%s", name, prev.Space, prev.Agent, prev.Session, sb.Space, sb.Agent, sb.Session)
	}
	if prev.Backend != sb.Backend || prev.VolumeID != sb.VolumeID {
		return policy.Errorf(policy.VolumeUnavailable, "session %s/%s/%s is bound to %s; this node is configured for %s; a session never changes volumes",
			sb.Space, sb.Agent, sb.Session, describeVolume(prev.Backend, prev.VolumeID), describeVolume(sb.Backend, sb.VolumeID))
	}
	return nil
}

func describeVolume(backend, volumeID string) string {
	if backend == BackendLocal {
		return "the local backend"
	}
	return fmt.Sprintf("%s volume %q", backend, volumeID)
}

// Run is a resumed run: its binding and the volume it is bound to, or a
// legacy run's directory.
type Run struct {
	id      string
	binding *Binding // nil for a legacy run
	vol     *Volume  // the bound volume; for a legacy run, the data directory
}

// ResumeRun finds run runID's binding and opens its volume. On a shared
// backend the configured root and marker are checked first, and nothing
// else is consulted when they fail: without the volume loomfs can't know
// whether the run has a binding, so it never guesses "legacy". A binding
// whose backend, volume id or layout version differs from this node's is
// refused, naming both. A run with no binding but a directory in
// <data>/runs is a legacy run.
func ResumeRun(ctx context.Context, cfg Config, runID string) (*Run, error) {
	if err := ValidateID("run", runID); err != nil {
		return nil, err
	}
	if cfg.Backend == "" {
		cfg.Backend = BackendLocal
	}
	switch cfg.Backend {
	case BackendLocal:
	case BackendSharedPOSIX:
		root, err := filepath.Abs(cfg.RootPath())
		if err != nil {
			return nil, fmt.Errorf("volume root: %w", err)
		}
		if err := CheckMarker(root, cfg.VolumeID); err != nil {
			return nil, err
		}
	default:
		return nil, policy.Errorf(policy.InvalidInput, "backend %q: want %s or %s", cfg.Backend, BackendLocal, BackendSharedPOSIX)
	}
	b, err := readBinding(cfg, runID)
	if err != nil {
		return nil, err
	}
	if b == nil {
		return resumeLegacy(cfg, runID)
	}
	backend, volumeID := volumeKey(cfg)
	if !b.sameVolume(backend, volumeID) {
		return nil, policy.Errorf(policy.VolumeUnavailable, "run %s is bound to %s; this node is configured for %s; resume it where its volume is configured (loomfs never moves a run or falls back to another directory)",
			runID, describeVolume(b.Backend, b.VolumeID), describeVolume(backend, volumeID))
	}
	vol, err := OpenVolume(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &Run{id: runID, binding: b, vol: vol}, nil
}

// readBinding reads run runID's binding on cfg's root, or returns nil if it
// has none. Nothing is created: a missing local root has no bindings.
func readBinding(cfg Config, runID string) (*Binding, error) {
	root, err := filepath.Abs(cfg.RootPath())
	if err != nil {
		return nil, fmt.Errorf("volume root: %w", err)
	}
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err == unix.ENOENT {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open volume root %s: %w", root, err)
	}
	defer unix.Close(rfd)
	dfd, err := openBeneath(rfd, RunsDir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err == unix.ENOENT {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", RunsDir, err)
	}
	defer unix.Close(dfd)
	var b Binding
	found, err := readJSONAt(dfd, runID+".json", &b)
	if err != nil || !found {
		return nil, err
	}
	if err := b.check(runID); err != nil {
		return nil, err
	}
	return &b, nil
}

// check refuses a binding this loomfs can't honour as recorded.
func (b *Binding) check(runID string) error {
	if b.RunID != runID {
		return fmt.Errorf("binding %s.json names run %q", runID, b.RunID)
	}
	if err := (Scope{Space: b.Space, Agent: b.Agent, Session: b.Session}).Validate(); err != nil {
		return fmt.Errorf("binding of run %s: %w", runID, err)
	}
	switch {
	case b.Backend == BackendLocal && b.VolumeID == "":
	case b.Backend == BackendSharedPOSIX && b.VolumeID != "":
	default:
		return fmt.Errorf("binding of run %s: backend %q with volume id %q is not a volume loomfs knows", runID, b.Backend, b.VolumeID)
	}
	if b.LayoutVersion != LayoutVersion {
		return policy.Errorf(policy.Unsupported, "run %s was created with layout version %d; this loomfs serves layout %d and never reinterprets a run under another layout", runID, b.LayoutVersion, LayoutVersion)
	}
	return nil
}

// legacyRunDir reports whether <data>/runs/<runID> exists (as anything:
// a name taken is a name taken).
func legacyRunDir(cfg Config, runID string) (string, bool, error) {
	dir := filepath.Join(dataDir(cfg), LegacyRunsDir, runID)
	var st unix.Stat_t
	err := unix.Lstat(dir, &st)
	if err == unix.ENOENT || err == unix.ENOTDIR {
		return dir, false, nil
	}
	if err != nil {
		return dir, false, fmt.Errorf("look for legacy run %s: %w", dir, err)
	}
	return dir, true, nil
}

func dataDir(cfg Config) string {
	if cfg.DataDir == "" {
		return "./data"
	}
	return cfg.DataDir
}

// resumeLegacy opens the data directory of a run without a binding.
func resumeLegacy(cfg Config, runID string) (*Run, error) {
	data, err := filepath.Abs(dataDir(cfg))
	if err != nil {
		return nil, fmt.Errorf("data directory: %w", err)
	}
	fd, err := unix.Open(data, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err == nil {
		var st unix.Stat_t
		err = unix.Fstatat(fd, LegacyRunsDir+"/"+runID, &st, unix.AT_SYMLINK_NOFOLLOW)
		if err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			unix.Close(fd)
			return nil, policy.Errorf(policy.NotDir, "legacy run %s: %s/%s is not a directory", runID, LegacyRunsDir, runID)
		}
		if err != nil {
			unix.Close(fd)
		}
	}
	if err == unix.ENOENT || err == unix.ENOTDIR {
		return nil, policy.Errorf(policy.NotFound, "run %s has no binding on this volume and no legacy directory %s", runID, filepath.Join(data, LegacyRunsDir, runID))
	}
	if err != nil {
		return nil, fmt.Errorf("legacy run %s: %w", runID, err)
	}
	vol := &Volume{cfg: Config{Backend: BackendLocal, Root: data, DataDir: data}, path: data, root: os.NewFile(uintptr(fd), data)}
	return &Run{id: runID, vol: vol}, nil
}

// LegacyScope is the scope a legacy run's workspace is known by (in lock
// names, messages and audit records). It names no directory on a volume.
func LegacyScope(runID string) Scope {
	return Scope{Space: "legacy", Agent: "runs", Session: runID}
}

// ID returns the run id.
func (r *Run) ID() string { return r.id }

// Binding returns the run's binding, or nil for a legacy run.
func (r *Run) Binding() *Binding { return r.binding }

// Legacy reports whether the run predates bindings.
func (r *Run) Legacy() bool { return r.binding == nil }

// Volume returns the volume the run is bound to; for a legacy run, the data
// directory holding runs/<run_id>.
func (r *Run) Volume() *Volume { return r.vol }

// Close releases the volume.
func (r *Run) Close() error { return r.vol.Close() }

// Main opens the run's main workspace: the session's main scope for a bound
// run, <data>/runs/<run_id> for a legacy run.
func (r *Run) Main(ctx context.Context, pol *policy.Policy) (*Workspace, error) {
	if r.binding != nil {
		return r.vol.Open(ctx, r.binding.MainScope(), r.policy(pol))
	}
	return r.openLegacy(pol)
}

// Instance opens one child instance of the run. Legacy runs have none.
func (r *Run) Instance(ctx context.Context, instance string, pol *policy.Policy) (*Workspace, error) {
	if r.binding == nil {
		return nil, policy.Errorf(policy.Unsupported, "run %s is a legacy run: its files are one directory, with no child instances", r.id)
	}
	return r.vol.Open(ctx, r.binding.InstanceScope(instance), r.policy(pol))
}

// policy is pol for the run's priority class, as its binding records it.
func (r *Run) policy(pol *policy.Policy) *policy.Policy {
	if pol == nil {
		pol = policy.Default()
	}
	return pol.ForPriority(r.binding.Priority)
}

// openLegacy opens <data>/runs/<run_id> beneath the data directory without
// following a symlink, and never moves or adds to it: the lock and call
// records go to <data>/.agentloom-locks/<hash>, outside the run.
func (r *Run) openLegacy(pol *policy.Policy) (*Workspace, error) {
	if pol == nil {
		pol = policy.Default()
	}
	rel := LegacyRunsDir + "/" + r.id
	fd, err := openBeneath(int(r.vol.root.Fd()), rel, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, policy.FromErrno(err, "open legacy run", rel)
	}
	st, mnt, err := lstatAt(fd, "")
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("stat legacy run %s: %w", r.id, err)
	}
	s := LegacyScope(r.id)
	sfd, err := r.vol.stateDir(s)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("legacy run state dir: %w", err)
	}
	w := &Workspace{
		vol:   r.vol,
		scope: s,
		// Not a main scope: a legacy run never reserved "subagents", and
		// its files must all stay reachable.
		pol:     pol.ForPriority("").WithScope(false),
		dir:     os.NewFile(uintptr(fd), rel),
		state:   os.NewFile(uintptr(sfd), LocksDir+"/"+s.Hash()),
		dev:     st.Dev,
		mnt:     mnt,
		journal: &journal{},
		quota:   &scopeQuota{},
	}
	w.calls.Late = w.lateCallLine
	return w, nil
}

// createJSONAt writes v as a new file name in dfd, atomically: readers see
// no file or the whole record. An existing name answers EEXIST.
func createJSONAt(dfd int, name string, v any) error {
	return writeJSONAt(dfd, name, v, true)
}

// readJSONAt reads the JSON file name in dfd into v. A missing file is
// (false, nil); a symlink, a hard link or anything but a regular file is
// refused, since no loomfs writer makes one.
func readJSONAt(dfd int, name string, v any) (bool, error) {
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err == unix.ENOENT {
		return false, nil
	}
	if err != nil {
		return false, policy.FromErrno(err, "read", name)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return false, fmt.Errorf("stat %s: %w", name, err)
	}
	if err := policy.CheckObject(policy.OpRead, name, policy.ObjectOf(&st)); err != nil {
		return false, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return false, policy.Errorf(policy.SpecialFileRefused, "%s is not a regular file", name)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxBindingBytes+1))
	if err != nil {
		return false, fmt.Errorf("read %s: %w", name, err)
	}
	if len(data) > maxBindingBytes {
		return false, fmt.Errorf("%s is over %d bytes; not a binding", name, maxBindingBytes)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return false, fmt.Errorf("%s: %w", name, err)
	}
	return true, nil
}

// SessionPriorities returns the priority class of each session that has
// run bindings on the volume, by its main scope: the highest class of its
// runs, a run recorded without one counting as def. Reclaim takes the
// lowest first (package retention).
func (v *Volume) SessionPriorities(ctx context.Context, def policy.Priority) (map[Scope]policy.Priority, error) {
	out := map[Scope]policy.Priority{}
	dfd, err := openBeneath(int(v.root.Fd()), RunsDir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err == unix.ENOENT {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", RunsDir, err)
	}
	dir := os.NewFile(uintptr(dfd), RunsDir)
	defer dir.Close()
	names, err := dir.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", RunsDir, err)
	}
	for _, name := range names {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		runID, ok := strings.CutSuffix(name, ".json")
		if !ok || ValidateID("run", runID) != nil {
			continue
		}
		var b Binding
		if found, err := readJSONAt(dfd, name, &b); err != nil || !found || b.check(runID) != nil {
			continue // not a binding this loomfs honours: it names no session
		}
		c := b.Priority.Or(def)
		sc := b.MainScope()
		if have, ok := out[sc]; !ok || c.Rank() > have.Rank() {
			out[sc] = c
		}
	}
	return out, nil
}
