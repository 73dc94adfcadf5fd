package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/fusefs"
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
container, whose processes resolve links against the container's view.`,

		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if opts.UID == 0 || opts.GID == 0 {
				return usagef("--uid and --gid name the sandbox user, which is never root")
			}
			opts.NoFollowLinks = !follow
			setProcs(procs, cmd.Flags().Changed("procs"))
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
			return runMount(cmd.Context(), g, scope, args[0], opts, selfCheck, reconcile)
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
	f.DurationVar(&reconcile, "reconcile", 5*time.Minute, "compare the scope's quota account with a walk this often and correct it when nothing is changing (each correction is logged with its size); 0 turns it off")
	f.DurationVar(&selfCheck, "self-check", 30*time.Second, "probe the mount (write, read back, delete) this often; failures are logged and shown by loomfs check; 0 turns it off")
	return cmd
}

// addProcsFlag adds --procs to a command that serves a mount in process.
func addProcsFlag(f *pflag.FlagSet, procs *int) {
	f.IntVar(procs, "procs", servingProcs(cpusAllowed()), "CPUs the process runs Go code on at once (GOMAXPROCS; 0: one per CPU); the default is 1, or 3 for a process allowed on one CPU only; the GOMAXPROCS variable wins unless this is given")
}

// setProcs sets GOMAXPROCS for a process whose work is serving a FUSE
// mount. procs comes from --procs, given says whether it was given;
// without it a GOMAXPROCS variable wins.
func setProcs(procs int, given bool) {
	if !given && os.Getenv("GOMAXPROCS") != "" {
		return
	}
	if procs > 0 {
		runtime.GOMAXPROCS(procs)
	}
}

// servingProcs is the number of Ps (GOMAXPROCS) a process serving a FUSE
// mount runs best with when it may run on cpus CPUs.
//
// go-fuse keeps two readers waiting in read(2) on the FUSE device. With a
// P per CPU, the runtime keeps handing the P of a waiting reader to another
// thread, woken on another CPU, and each request pays for the trip: on a
// 2-CPU machine one P made creating, statting and deleting small files
// twice as fast, tar -x 15% faster, and slowed no parallel workload
// (BENCHMARKS.md); the daemon's system calls still run in parallel.
//
// A process allowed on one CPU only has no other CPU to wake, but with one
// P there is never an idle P either, so the runtime's monitor takes the P
// of every reader blocked in read(2) at its next tick and wakes for the
// next request. One P per waiting reader and one spare leave it asleep:
// pinned to one CPU, that cut the daemon's CPU time per small file by a
// fifth.
func servingProcs(cpus int) int {
	if cpus == 1 {
		return 3
	}
	return 1
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

func runMount(ctx context.Context, g *globals, scope, mountpoint string, opts fusefs.Options, selfCheck, reconcile time.Duration) error {
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
	defer closeWS()

	// Nothing is served unaudited. A mount is a long-lived writer on the
	// requests' path: its records are queued and written by the log's own
	// goroutine (audit.Options.Queue); Close, at unmount, writes them all.
	auditLog, err := audit.Open(ws.Volume().Path(), audit.Options{Queue: audit.DefaultQueue})
	if err != nil {
		return fail("open the audit log: %v", err)
	}
	defer func() {
		// Records it could not write are lost with the process: say so.
		if err := auditLog.Close(); err != nil {
			g.log.Error("close the audit log", zap.Error(err))
		}
	}()
	opts.Audit = auditLog

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
	err = m.Probe(pctx)
	cancel()
	if err != nil {
		m.Unmount()
		return fail("health probe failed, unmounted: %v", err)
	}
	ws.RecordSelfCheck(nil)
	fmt.Fprintf(os.Stderr, "mounted %s at %s\n", ws.Scope(), m.Dir())
	if selfCheck > 0 {
		sctx, stop := context.WithCancel(ctx)
		defer stop()
		go m.SelfCheck(sctx, selfCheck, func(err error) {
			if err != nil {
				g.log.Error("self-check through the mount failed; .workspace_ready is hidden until it passes", zap.String("mountpoint", m.Dir()), zap.Error(err))
			}
			if rerr := ws.RecordSelfCheck(err); rerr != nil {
				g.log.Warn("record self-check", zap.Error(rerr))
			}
		})
	}

	if reconcile > 0 {
		rctx, stop := context.WithCancel(ctx)
		defer stop()
		go reconcileEvery(rctx, ws, reconcile, g.log)
	}

	ended := make(chan struct{})
	go func() { m.Wait(); close(ended) }()
	select {
	case <-ended:
		fmt.Fprintf(os.Stderr, "%s was unmounted from outside\n", m.Dir())
		return nil
	case sig := <-sigs:
		g.log.Info("unmounting", zap.String("signal", sig.String()), zap.String("mountpoint", m.Dir()))
	}
	switch err := m.Unmount(); {
	case errors.Is(err, fusefs.ErrDetached):
		fmt.Fprintf(os.Stderr, "unmounted %s (it was busy: its users were cut off)\n", m.Dir())
	case err != nil:
		return fail("%v", err)
	default:
		fmt.Fprintf(os.Stderr, "unmounted %s\n", m.Dir())
	}
	return nil
}
