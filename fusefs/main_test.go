package fusefs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// The tests mount real FUSE filesystems: without /dev/fuse they fail.
func TestMain(m *testing.M) {
	if spec := os.Getenv(cycleClientEnv); spec != "" {
		if err := cycleClient(spec); err != nil {
			fmt.Fprintln(os.Stderr, "cycle client:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		fmt.Fprintln(os.Stderr, "fusefs tests need /dev/fuse:", err)
		os.Exit(1)
	}
	code := m.Run()
	if left := leftMounts(); len(left) > 0 {
		fmt.Fprintln(os.Stderr, "mounts left behind:", left)
		code = 1
	}
	os.Exit(code)
}

var (
	mountsMu sync.Mutex
	mounted  []string
)

// leftMounts lists the mountpoints the tests made that are still mounted.
func leftMounts() []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	mountsMu.Lock()
	defer mountsMu.Unlock()
	var left []string
	for _, line := range strings.Split(string(b), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 5 {
			continue
		}
		for _, m := range mounted {
			if fields[4] == m {
				left = append(left, m)
			}
		}
	}
	return left
}

// testScope is the main scope every test mounts.
var testScope = store.Scope{Space: "sp", Agent: "ag", Session: "se"}

// env is one scope on a fresh volume, mounted.
type env struct {
	t       *testing.T
	vol     *store.Volume
	ws      *store.Workspace
	backing string // the scope's directory on the host, for planting objects
	outside string // a directory outside the volume, for canaries
	mnt     string
	m       *Mounted
	sink    *recorder
}

type envConfig struct {
	root     string // the volume root; "" for a fresh local directory
	rules    []policy.Rule
	subtrees []policy.Subtree
	limits   func(*policy.Limits)
	opts     Options
	scope    store.Scope
	symlinks policy.Symlinks
	cache    policy.Cache
}

type envOption func(*envConfig)

func withRules(rules ...policy.Rule) envOption {
	return func(c *envConfig) { c.rules = rules }
}

func withSubtrees(subs ...policy.Subtree) envOption {
	return func(c *envConfig) { c.subtrees = subs }
}

func withLimits(fn func(*policy.Limits)) envOption {
	return func(c *envConfig) { c.limits = fn }
}

// withRoot puts the volume at root (a directory of a shared filesystem).
func withRoot(root string) envOption {
	return func(c *envConfig) { c.root = root }
}

func withCache(c policy.Cache) envOption {
	return func(cfg *envConfig) { cfg.cache = c }
}

func withOptions(fn func(*Options)) envOption {
	return func(c *envConfig) { fn(&c.opts) }
}

// newEnv opens a fresh volume and scope and mounts it; everything is
// undone in t.Cleanup.
func newEnv(t testing.TB, options ...envOption) *env {
	t.Helper()
	cfg := envConfig{scope: testScope}
	for _, o := range options {
		o(&cfg)
	}
	// The mountpoint's parent is root's alone, as allow_other requires.
	base := t.TempDir()
	if err := os.Chmod(base, 0o700); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	root := cfg.root
	if root == "" {
		root = filepath.Join(base, "volume")
	}
	vol, err := store.OpenVolume(ctx, store.Config{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vol.Close() })
	pol := policy.Default()
	if cfg.rules != nil {
		if err := pol.SetRules(cfg.rules); err != nil {
			t.Fatal(err)
		}
	}
	if cfg.subtrees != nil {
		if err := pol.SetSubtrees(cfg.subtrees); err != nil {
			t.Fatal(err)
		}
	}
	if cfg.limits != nil {
		cfg.limits(&pol.Limits)
	}
	if cfg.symlinks != "" {
		pol.Symlinks = cfg.symlinks
	}
	pol.Cache = cfg.cache
	ws, err := vol.Open(ctx, cfg.scope, pol)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	e := &env{
		vol:     vol,
		ws:      ws,
		backing: filepath.Join(vol.Path(), cfg.scope.Dir()),
		outside: filepath.Join(base, "outside"),
		sink:    &recorder{},
	}
	if tt, ok := t.(*testing.T); ok {
		e.t = tt
	}
	if err := os.Mkdir(e.outside, 0o700); err != nil {
		t.Fatal(err)
	}
	if cfg.opts.Audit == nil {
		cfg.opts.Audit = e.sink
	}
	e.mnt = mountAt(t, ws, filepath.Join(base, "mnt"), cfg.opts, &e.m)
	return e
}

// mountAt mounts ws at dir (created) and unmounts it in t.Cleanup.
func mountAt(t testing.TB, ws *store.Workspace, dir string, opts Options, out **Mounted) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	m, err := Mount(context.Background(), ws, dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	mountsMu.Lock()
	mounted = append(mounted, m.Dir())
	mountsMu.Unlock()
	t.Cleanup(func() {
		if err := m.Unmount(); err != nil {
			t.Errorf("unmount %s: %v", m.Dir(), err)
		}
	})
	if out != nil {
		*out = m
	}
	return m.Dir()
}

// path returns the mount path of rel.
func (e *env) path(rel string) string { return filepath.Join(e.mnt, rel) }

// host returns the backing path of rel, for the test to plant objects.
func (e *env) host(rel string) string { return filepath.Join(e.backing, rel) }

// recorder is an audit sink that keeps events and can be made to fail.
type recorder struct {
	mu     sync.Mutex
	events []audit.Event
	fail   bool
}

func (r *recorder) Record(ctx context.Context, e audit.Event) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail {
		return fmt.Errorf("%w: test sink set to fail", audit.ErrUnavailable)
	}
	r.events = append(r.events, e)
	return nil
}

func (r *recorder) setFail(v bool) {
	r.mu.Lock()
	r.fail = v
	r.mu.Unlock()
}

// find returns the events with op and result for path.
func (r *recorder) find(op, result, path string) []audit.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []audit.Event
	for _, e := range r.events {
		if e.Op == op && e.Result == result && (path == "" || e.Path == path) {
			out = append(out, e)
		}
	}
	return out
}

// waitReleased waits until the kernel has released every file opened in
// m (RELEASE comes after close(2) has returned, without being waited for)
// and the daemon has served each release (noted its end, recorded it).
func waitReleased(t *testing.T, m *Mounted) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		open := 0
		m.fsys.open.Range(func(any, any) bool { open++; return true })
		if open == 0 && m.fsys.releasing.Load() == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d files still open in the mount", open)
		}
		time.Sleep(time.Millisecond)
	}
}
