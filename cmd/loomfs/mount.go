package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/fusefs"
	"github.com/agentloom/loomfs/store"
)

func init() { addCommand(newMountCmd) }

func newMountCmd(g *globals) *cobra.Command {
	var (
		scope     string
		opts      fusefs.Options
		selfCheck time.Duration
		reconcile time.Duration
		profile   string
		procs     int
		follow    bool
		stopAfter time.Duration
		mf        metricsFlags
	)
	cmd := &cobra.Command{
		Use:   "mount --scope S MOUNTPOINT",
		Short: "Serve a scope's policed projection at MOUNTPOINT, in the foreground",
		Long: `Serve a scope's policed FUSE projection at MOUNTPOINT until SIGINT or SIGTERM,
then unmount it. Every operation through the mount is checked by the same
policy as the tools and recorded in the volume's audit log.

The mount is nosuid and nodev. Objects are shown as owned by --uid:--gid
(the sandbox user), with their owner bits only: a program keeps the owner
bits it asks for, never a group, other, setuid, setgid or sticky bit. A
stale mount left at MOUNTPOINT by a daemon that died is cleared first.
"mounted SCOPE at DIR" is printed on stderr once the mount is ready.
After SIGINT or SIGTERM it exits within --stop-timeout: a mount still busy
then, or a workspace still closing (on a shared volume the quota share is
folded into a ledger every node uses), is detached or left as a crash
leaves it, for the next user of the scope; a second signal cuts it short.

On a shared volume the mount asks every ` + store.FenceCheckEvery.String() + ` whether this node was fenced
("loomfs fence --help"); once it was, it unmounts (detached if busy),
leaves the workspace unclosed for the node that takes over, and exits 1. A
node the volume records as fenced can't mount until it is re-admitted.

The kernel keeps entries, attributes, failed lookups, listings and the
pages of unchanged files for 5 minutes: the mount follows the scope's change
journals and drops what another door or node changed (on this node at
once, from another node within 500 ms plus the shared filesystem's delay).
A change made to the backing store behind loomfs's back is seen only when
the cache expires; policy "cache: strict" caches for one second instead.
Policy limits io_bytes_per_s and io_ops_per_s slow the mount down to them.

Symbolic links made in the workspace (policy "symlinks: emulate") are shown
as links, but not followed unless --follow-links is given: a process that
follows a link resolves it against its own root, and on the host a link to
/etc/passwd is the host's. Give --follow-links for a mount served to a
container, whose processes resolve links against the container's view.

` + metricsHelp + ` The mount's own self-check
(--self-check) is reported there too.`,

		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if opts.UID == 0 || opts.GID == 0 {
				return usagef("--uid and --gid name the sandbox user, which is never root")
			}
			opts.NoFollowLinks = !follow
			setProcs(procs, cmd.Flags().Changed("procs"), g.storeConfig().RootPath())
			if profile != "" {
				f, err := os.Create(profile)
				if err != nil {
					return err
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return err
				}
				defer pprof.StopCPUProfile()
			}
			if stopAfter <= 0 {
				return usagef("--stop-timeout must be positive")
			}
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			stopMetrics, err := g.startMetrics(ctx, mf)
			if err != nil {
				return err
			}
			defer stopMetrics()
			return runMount(ctx, g, scope, args[0], opts, mountTimes{selfCheck: selfCheck, reconcile: reconcile, stop: stopAfter})
		},
	}
	f := cmd.Flags()
	f.StringVar(&scope, "scope", "", "scope to serve: SPACE/AGENT/SESSION or SPACE/AGENT/SESSION/RUN/INSTANCE, or run:RUN[/INSTANCE] (through the run's binding)")
	f.Uint32Var(&opts.UID, "uid", fusefs.DefaultUID, "uid shown as the owner of every object (the sandbox user)")
	f.Uint32Var(&opts.GID, "gid", fusefs.DefaultGID, "gid shown as the group of every object")
	f.BoolVar(&opts.AllowOther, "allow-other", false, "let other users (the sandbox container's) use the mount; MOUNTPOINT's parent must be root's, mode 0700")
	f.BoolVar(&opts.ReadOnly, "read-only", false, "refuse every change (EROFS)")
	f.BoolVar(&opts.UserXattrs, "user-xattrs", false, `serve extended attributes in the "user." namespace (every other is refused)`)
	f.BoolVar(&opts.Passthrough, "passthrough", false, "let the kernel read files opened read-only from the backing store (Linux 6.9+); writes always come to the daemon")
	f.BoolVar(&follow, "follow-links", false, "let processes follow the symbolic links made in the workspace (readlink answers); without it links are shown but not followed, since on the host an absolute target names a host file")
	f.BoolVar(&opts.Debug, "debug", false, "log every FUSE request to stderr")
	f.StringVar(&profile, "cpuprofile", "", "write a CPU profile of the daemon to this file (for performance work)")
	addProcsFlag(f, &procs)
	addMetricsFlags(f, &mf)
	f.DurationVar(&reconcile, "reconcile", 5*time.Minute, "compare the scope's quota account with a walk this often and correct it when nothing is changing (each correction is logged with its size); 0 turns it off")
	f.DurationVar(&selfCheck, "self-check", 30*time.Second, "probe the mount (write, read back, delete) this often; failures are logged and shown by loomfs check; 0 turns it off")
	f.DurationVar(&stopAfter, "stop-timeout", defaultStopTimeout, "after SIGINT or SIGTERM, how long unmounting and closing the workspace may take; then the mount is detached and the process exits, leaving what it did not close to the next user of the scope, as after a crash")
	return cmd
}

// addProcsFlag adds --procs to a command that serves a mount in process.
func addProcsFlag(f *pflag.FlagSet, procs *int) {
	f.IntVar(procs, "procs", servingProcs(cpusAllowed(), false), "CPUs the process runs Go code on at once (GOMAXPROCS; 0: one per CPU); the default is 1, or 3 for a process allowed on one CPU only or serving a volume on a FUSE or network filesystem (ceph-fuse, NFS); the GOMAXPROCS variable wins unless this is given")
}

// setProcs sets GOMAXPROCS for a process whose work is serving a FUSE
// mount of the volume at root. procs comes from --procs, given says
// whether it was given; when it was not, the GOMAXPROCS variable wins,
// and without it servingProcs decides for root.
func setProcs(procs int, given bool, root string) {
	if !given {
		if os.Getenv("GOMAXPROCS") != "" {
			return
		}
		procs = servingProcs(cpusAllowed(), remoteFS(root))
	}
	if procs > 0 {
		runtime.GOMAXPROCS(procs)
	}
}

// servingProcs is the number of Ps (GOMAXPROCS) a process serving a FUSE
// mount runs best with when it may run on cpus CPUs and its volume is on
// a remote filesystem or not.
//
// go-fuse keeps two readers waiting in read(2) on the FUSE device. With a
// P per CPU, the runtime keeps handing the P of a waiting reader to another
// thread, woken on another CPU, and each request pays for the trip: on a
// 2-CPU machine one P made creating, statting and deleting small files
// twice as fast, tar -x 15% faster, and slowed no parallel workload
// (BENCHMARKS.md); the daemon's system calls still run in parallel.
//
// But with one P there is never an idle P, so the runtime's monitor takes
// the P of every thread blocked in a system call at its next tick (20 µs)
// and wakes that often while any is. A process allowed on one CPU only
// meets that with every reader blocked in read(2); one serving a volume on
// a FUSE client (ceph-fuse) or a network filesystem with every call to the
// volume, each a request to another daemon or server (100–300 µs on
// ceph-fuse). One P per waiting reader and one spare leave the monitor
// asleep and a blocked thread its P: pinned to one CPU, that cut the
// daemon's CPU time per small file by a fifth; on CephFS tar -x through the
// mount took about a tenth less.
func servingProcs(cpus int, remote bool) int {
	if cpus == 1 || remote {
		return 3
	}
	return 1
}

// remoteFS reports whether root (or the nearest directory above it that
// exists) is on a filesystem whose every call is a request to another
// process or machine: a FUSE client such as ceph-fuse or glusterfs, NFS,
// CephFS's or SMB's kernel client.
func remoteFS(root string) bool {
	for dir := filepath.Clean(root); ; dir = filepath.Dir(dir) {
		var st unix.Statfs_t
		err := unix.Statfs(dir, &st)
		if err == nil {
			switch uint32(st.Type) {
			case unix.FUSE_SUPER_MAGIC, unix.NFS_SUPER_MAGIC, unix.CEPH_SUPER_MAGIC,
				unix.SMB2_SUPER_MAGIC, unix.CIFS_SUPER_MAGIC:
				return true
			}
			return false
		}
		if err != unix.ENOENT || dir == filepath.Dir(dir) {
			return false
		}
	}
}

// cpusAllowed is the number of CPUs the calling thread may run on, 0 if
// that can't be told.
func cpusAllowed() int {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return 0
	}
	return set.Count()
}

// defaultStopTimeout bounds a mount's exit after SIGTERM. Closing the
// workspace writes to the backing store (the quota share is folded into
// the ledger, the change journal and the audit log are ended): on a shared
// filesystem each of those can wait for another node's client to give up
// its caches, seconds on CephFS when both nodes are busy.
const defaultStopTimeout = 5 * time.Second

// mountTimes are the intervals of a loomfs mount.
type mountTimes struct {
	selfCheck, reconcile time.Duration // 0: off
	stop                 time.Duration // --stop-timeout
}

func runMount(ctx context.Context, g *globals, scope, mountpoint string, opts fusefs.Options, times mountTimes) error {
	if ctx == nil {
		ctx = context.Background()
	}
	fail := func(format string, args ...any) error {
		fmt.Fprintf(os.Stderr, "loomfs mount: "+format+"\n", args...)
		return exitError{exitRefused}
	}
	ws, closeWS, err := g.openWorkspace(ctx, scope)
	if err != nil {
		var ue usageError
		if errors.As(err, &ue) {
			return err
		}
		return fail("%v", err)
	}
	// What the mount used is closed at the end: here if it never served,
	// by stopMount, within --stop-timeout, if it did.
	served := false
	defer func() {
		if !served {
			closeWS()
		}
	}()

	// Nothing is served unaudited. A mount is a long-lived writer on the
	// requests' path: its records are queued and written by the log's own
	// goroutine (audit.Options.Queue); Close, at unmount, writes them all.
	auditLog, err := audit.Open(ws.Volume().Path(), audit.Options{Queue: audit.DefaultQueue})
	if err != nil {
		return fail("open the audit log: %v", err)
	}
	defer func() {
		if !served {
			auditLog.Close()
		}
	}()
	opts.Audit = g.obs.sink(auditLog)
	opts.Requests = g.obs.requests()
	reportCheck, unwatch := g.obs.watchMount(ws)
	defer unwatch()

	if recovered, err := fusefs.RecoverStale(mountpoint); err != nil {
		return fail("%v", err)
	} else if recovered {
		fmt.Fprintf(os.Stderr, "recovered a stale mount at %s\n", mountpoint)
	}

	// Signals are caught before the mount exists, so none is lost.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)

	m, err := fusefs.Mount(ctx, ws, mountpoint, opts)
	if err != nil {
		return fail("%v", err)
	}
	// The first probe makes policy.ReadyFile appear; a mount that fails
	// it is not served.
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	probed := time.Now()
	err = m.Probe(pctx)
	cancel()
	if err != nil {
		m.Unmount()
		return fail("health probe failed, unmounted: %v", err)
	}
	ws.RecordSelfCheck(nil)
	reportCheck(nil, time.Since(probed))
	g.obs.watchFollow(m)
	fmt.Fprintf(os.Stderr, "mounted %s at %s\n", ws.Scope(), m.Dir())
	// The checks end before the workspace is closed.
	var checks sync.WaitGroup
	cctx, endChecks := context.WithCancel(ctx)
	defer endChecks()
	if times.selfCheck > 0 {
		checks.Add(1)
		go func() {
			defer checks.Done()
			m.SelfCheck(cctx, times.selfCheck, func(err error, took time.Duration) {
				reportCheck(err, took)
				if err != nil {
					g.log.Error("self-check through the mount failed; .workspace_ready is hidden until it passes", zap.String("mountpoint", m.Dir()), zap.Error(err))
				}
				if rerr := ws.RecordSelfCheck(err); rerr != nil {
					g.log.Warn("record self-check", zap.Error(rerr))
				}
			})
		}()
	}
	if times.reconcile > 0 {
		checks.Add(1)
		go func() {
			defer checks.Done()
			reconcileEvery(cctx, ws, times.reconcile, g.log)
		}()
	}

	// A node fenced from the volume serves nothing more from it.
	fenced := make(chan error, 1)
	obs := g.obs
	go func() {
		cfg := g.storeConfig()
		watch := func(ctx context.Context) error { return store.WatchFence(ctx, cfg, store.FenceCheckEvery) }
		if err := obs.watchFence(cctx, cfg, watch); err != nil {
			fenced <- err
		}
	}()

	ended := make(chan struct{})
	go func() { m.Wait(); close(ended) }()
	outside := false
	select {
	case <-ended:
		fmt.Fprintf(os.Stderr, "%s was unmounted from outside\n", m.Dir())
		outside = true
	case sig := <-sigs:
		g.log.Info("unmounting", zap.String("signal", sig.String()), zap.String("mountpoint", m.Dir()))
	case err := <-fenced:
		endChecks()
		served = true // and never closed: a fenced node writes nothing more
		return stopFenced(m, err)
	}
	endChecks()
	served = true
	return stopMount(m, sigs, times.stop, outside, func() {
		checks.Wait()
		// Records the log could not write are lost with the process: say so.
		if err := auditLog.Close(); err != nil {
			g.log.Error("close the audit log", zap.Error(err))
		}
		closeWS()
	})
}

// stopFenced takes down the mount of a node the volume fenced: detached if
// busy, its users cut off, and the workspace left as after a crash (the
// node that takes over settles it), for closing it would write to the
// volume.
func stopFenced(m *fusefs.Mounted, fence error) error {
	fmt.Fprintf(os.Stderr, "loomfs mount: FENCED: %v; unmounting %s and leaving the workspace to the node that takes over\n", fence, m.Dir())
	done := make(chan error, 1)
	go func() { done <- m.Unmount() }()
	select {
	case err := <-done:
		if err != nil && !errors.Is(err, fusefs.ErrDetached) {
			fmt.Fprintf(os.Stderr, "loomfs mount: %v\n", err)
		}
	case <-time.After(defaultStopTimeout):
		fmt.Fprintf(os.Stderr, "loomfs mount: unmounting %s took more than %v; exiting\n", m.Dir(), defaultStopTimeout)
	}
	return exitError{exitRefused}
}

// stopMount unmounts m and then runs closeAll, and returns once both are
// done, or at the latest after timeout, or at a second signal: then the
// mount is detached (its users cut off) and what is still closing is left
// as it stands, to be taken over by the next user of the scope as after a
// crash: the quota ledger folds a dead holder's share, a reader of a
// change journal without its end drops its caches once, the audit log
// seals an entry left open. A request the kernel already handed to the
// backing store's own daemon is still waited for by the kernel when the
// process exits.
func stopMount(m *fusefs.Mounted, sigs <-chan os.Signal, timeout time.Duration, outside bool, closeAll func()) error {
	unmounted := make(chan error, 1)
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		err := m.Unmount()
		unmounted <- err
		if err == nil || errors.Is(err, fusefs.ErrDetached) {
			closeAll()
		}
	}()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	const left = "the workspace is left open, as after a crash, for the next user of the scope"
	select {
	case err := <-unmounted:
		switch {
		case outside:
		case errors.Is(err, fusefs.ErrDetached):
			fmt.Fprintf(os.Stderr, "unmounted %s (it was busy: its users were cut off)\n", m.Dir())
		case err != nil:
			fmt.Fprintf(os.Stderr, "loomfs mount: %v\n", err)
			return exitError{exitRefused}
		default:
			fmt.Fprintf(os.Stderr, "unmounted %s\n", m.Dir())
		}
		select {
		case <-closed:
		case <-deadline.C:
			fmt.Fprintf(os.Stderr, "loomfs mount: closing the workspace took more than %v (the backing store is slow to answer): %s\n", timeout, left)
		case sig := <-sigs:
			fmt.Fprintf(os.Stderr, "loomfs mount: closing the workspace was cut short by %v: %s\n", sig, left)
		}
		return nil
	case <-deadline.C:
		fmt.Fprintf(os.Stderr, "loomfs mount: unmounting took more than %v (the backing store is slow to answer)\n", timeout)
	case sig := <-sigs:
		fmt.Fprintf(os.Stderr, "loomfs mount: unmounting was cut short by %v\n", sig)
	}
	if err := m.Detach(); err != nil {
		fmt.Fprintf(os.Stderr, "loomfs mount: detach %s: %v\n", m.Dir(), err)
		return exitError{exitRefused}
	}
	fmt.Fprintf(os.Stderr, "detached %s (its users were cut off): %s\n", m.Dir(), left)
	return nil
}
