package fusefs

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/policy"
)

// benchDirs runs fn against the mount and against the backing directory
// itself, so the FUSE overhead can be read off side by side.
func benchDirs(b *testing.B, fn func(b *testing.B, dir string), options ...envOption) {
	e := newEnv(b, options...)
	b.Run("loomfs", func(b *testing.B) { fn(b, e.mnt) })
	b.Run("native", func(b *testing.B) { fn(b, e.backing) })
}

// BenchmarkCreateStatDelete: the small-file cycle of builds and VCS
// checkouts — create and write 100 bytes, stat, delete. loomfs-journal
// is the mount under "cache: journal" (every opendir and owner-bit check
// in the daemon, the default before issue 44), to compare with
// revisions from before that.
func BenchmarkCreateStatDelete(b *testing.B) {
	data := make([]byte, 100)
	cycle := func(b *testing.B, dir string) {
		for i := 0; b.Loop(); i++ {
			smallFileCycle(b, filepath.Join(dir, fmt.Sprintf("f%d", i)), data)
		}
	}
	benchDirs(b, cycle)
	e := newEnv(b, withCache(policy.CacheJournal))
	b.Run("loomfs-journal", func(b *testing.B) { cycle(b, e.mnt) })
}

// BenchmarkStatTree: stat of every file of a 3-level tree, warm, as
// "git status" does.
func BenchmarkStatTree(b *testing.B) {
	benchDirs(b, func(b *testing.B, dir string) {
		var paths []string
		for i := 0; i < 10; i++ {
			for j := 0; j < 10; j++ {
				p := filepath.Join(dir, fmt.Sprintf("src%d/pkg%d/file.go", i, j))
				mustWrite(b, p, "package x\n")
				paths = append(paths, p)
			}
		}
		var st unix.Stat_t
		for b.Loop() {
			for _, p := range paths {
				if err := unix.Lstat(p, &st); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(paths)), "ns/stat")
	})
}

// BenchmarkReadSmall: open, read and close a 4 KiB file.
func BenchmarkReadSmall(b *testing.B) {
	benchDirs(b, func(b *testing.B, dir string) {
		p := filepath.Join(dir, "small")
		mustWrite(b, p, string(make([]byte, 4096)))
		b.SetBytes(4096)
		for b.Loop() {
			if _, err := os.ReadFile(p); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkWriteLarge: write 8 MiB in 128 KiB chunks to a new file.
func BenchmarkWriteLarge(b *testing.B) {
	chunk := make([]byte, 128<<10)
	benchDirs(b, func(b *testing.B, dir string) {
		b.SetBytes(8 << 20)
		for i := 0; b.Loop(); i++ {
			p := filepath.Join(dir, "large")
			f, err := os.Create(p)
			if err != nil {
				b.Fatal(err)
			}
			for n := 0; n < 64; n++ {
				if _, err := f.Write(chunk); err != nil {
					b.Fatal(err)
				}
			}
			f.Close()
			os.Remove(p)
		}
	})
}

// auditVariant is one way the audit benchmarks audit a mount: off
// (Discard), or a real hash-chained log on the same disk, synchronous or
// queued (Queue places).
type auditVariant struct {
	name  string
	on    bool
	queue int
}

var (
	auditOff    = auditVariant{"off", false, 0}
	auditOn     = auditVariant{"on", true, 0}
	auditQueued = auditVariant{"queued", true, audit.DefaultQueue}
)

// sink opens the variant's log, closed when the benchmark ends.
func (v auditVariant) sink(b *testing.B) audit.Sink {
	if !v.on {
		return audit.Discard
	}
	log, err := audit.Open(b.TempDir(), audit.Options{Node: "bench", Queue: v.queue})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { log.Close() })
	return log
}

// BenchmarkAudit: the small-file cycle with the audit log off (Discard)
// and on (a real hash-chained log on the same disk), synchronous and
// queued as a mount opens it (audit.DefaultQueue), side by side.
func BenchmarkAudit(b *testing.B) {
	data := make([]byte, 100)
	for _, v := range []auditVariant{auditOff, auditOn, auditQueued} {
		sink := v.sink(b)
		b.Run("audit="+v.name, func(b *testing.B) {
			e := newEnv(b, withOptions(func(o *Options) { o.Audit = sink }))
			cpu := cpuTime(b)
			for i := 0; b.Loop(); i++ {
				smallFileCycle(b, filepath.Join(e.mnt, fmt.Sprintf("f%d", i)), data)
			}
			// The mount is served in this process: its CPU is the cycle's,
			// client system calls, server and audit writer together.
			b.ReportMetric(float64(cpuTime(b)-cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}

// BenchmarkAuditClient: the cycle of BenchmarkAudit made by a client
// process of its own, as tar or git in a sandbox are, against a mount
// served by this process with the audit off, synchronous (on) and
// queued. In BenchmarkAudit the client's system calls and the server
// share one Go scheduler, and pinned to one core (GOMAXPROCS 1) a
// request's reply often waits for the runtime to take the only P back
// from the client's blocked thread; every goroutine the server adds, such
// as the audit writer, makes that wait more frequent, so there the
// audit's cost is partly the benchmark's.
// ns/op is the client's loop per cycle (its start left out), cpu-ns/op the
// server's and the client's CPU together.
func BenchmarkAuditClient(b *testing.B) {
	for _, v := range []auditVariant{auditOff, auditOn, auditQueued} {
		sink := v.sink(b)
		b.Run("audit="+v.name, func(b *testing.B) {
			e := newEnv(b, withOptions(func(o *Options) { o.Audit = sink }))
			dir := filepath.Join(e.mnt, fmt.Sprintf("n%d", b.N))
			if err := os.Mkdir(dir, 0o700); err != nil {
				b.Fatal(err)
			}
			cmd := exec.Command(os.Args[0], "-test.run", "^$")
			cmd.Env = append(os.Environ(), cycleClientEnv+"="+strconv.Itoa(b.N)+":"+dir)
			cmd.Stderr = os.Stderr
			cpu := cpuTime(b)
			out, err := cmd.Output()
			if err != nil {
				b.Fatalf("cycle client: %v", err)
			}
			server := cpuTime(b) - cpu
			loop, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
			if err != nil {
				b.Fatalf("cycle client said %q", out)
			}
			client := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
			b.ReportMetric(float64(loop)/float64(b.N), "ns/op")
			b.ReportMetric(float64(server+client)/float64(b.N), "cpu-ns/op")
		})
	}
}

// cycleClientEnv, set to "N:DIR", makes the test binary a cycle client
// (cycleClient) instead of running tests; "N:DIR:DIR2" an interleaving
// one.
const cycleClientEnv = "LOOMFS_BENCH_CYCLE_CLIENT"

// clientBlock is how many cycles an interleaving client makes in one
// directory before it turns to the other.
const clientBlock = 50

// cycleClient runs spec's N small-file cycles in its DIR and prints how
// long they took, in nanoseconds. Given two directories it runs N pairs
// of blocks of clientBlock cycles, one block in each, the first of each
// pair turning every pair, and prints the time spent in each directory.
func cycleClient(spec string) error {
	n, rest, ok := strings.Cut(spec, ":")
	count, err := strconv.Atoi(n)
	dirs := strings.Split(rest, ":")
	if !ok || err != nil || len(dirs) > 2 {
		return fmt.Errorf("%s=%q: want N:DIR or N:DIR:DIR2", cycleClientEnv, spec)
	}
	data := make([]byte, 100)
	var st unix.Stat_t
	next := 0
	cycles := func(dir string, k int) (time.Duration, error) {
		start := time.Now()
		for range k {
			p := filepath.Join(dir, fmt.Sprintf("f%d", next))
			next++
			if err := os.WriteFile(p, data, 0o600); err != nil {
				return 0, err
			}
			if err := unix.Stat(p, &st); err != nil {
				return 0, err
			}
			if err := os.Remove(p); err != nil {
				return 0, err
			}
		}
		return time.Since(start), nil
	}
	if len(dirs) == 1 {
		d, err := cycles(dirs[0], count)
		if err != nil {
			return err
		}
		fmt.Println(d.Nanoseconds())
		return nil
	}
	var spent [2]time.Duration
	for i := range count {
		for j := range 2 {
			which := (i + j) % 2
			d, err := cycles(dirs[which], clientBlock)
			if err != nil {
				return err
			}
			spent[which] += d
		}
	}
	fmt.Println(spent[0].Nanoseconds(), spent[1].Nanoseconds())
	return nil
}

// BenchmarkAuditClientInterleaved: the cycle of BenchmarkAuditClient made
// by one client process on two mounts served by this process, one with
// the audit off and one with a queued log as a mount opens it, in
// alternating blocks of clientBlock cycles, so that what drifts over a
// run (the machine's other load, ext4 skipping freed inodes) weighs on
// both alike, as in BenchmarkAuditInterleaved, with the client a process
// of its own. One b.N is a pair of blocks. The writer's turns that fall
// after an "on" block ends (it looks at its queue every half millisecond)
// count against the "off" block that follows, so the ratio understates
// the audit's cost by at most about that much.
func BenchmarkAuditClientInterleaved(b *testing.B) {
	log := auditQueued.sink(b)
	var dirs []string
	for i, sink := range []audit.Sink{audit.Discard, log} {
		e := newEnv(b, withOptions(func(o *Options) { o.Audit = sink }))
		dir := filepath.Join(e.mnt, fmt.Sprintf("n%d-%d", b.N, i))
		if err := os.Mkdir(dir, 0o700); err != nil {
			b.Fatal(err)
		}
		dirs = append(dirs, dir)
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), cycleClientEnv+"="+strconv.Itoa(b.N)+":"+dirs[0]+":"+dirs[1])
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		b.Fatalf("cycle client: %v", err)
	}
	var off, on int64
	if _, err := fmt.Sscan(string(out), &off, &on); err != nil {
		b.Fatalf("cycle client said %q", out)
	}
	per := float64(b.N * clientBlock)
	b.ReportMetric(float64(off)/per, "off-ns/cycle")
	b.ReportMetric(float64(on)/per, "on-ns/cycle")
	b.ReportMetric(100*(float64(on)/float64(off)-1), "on-vs-off-%")
}

// BenchmarkAuditInterleaved: the small-file cycle on two mounts served by
// this process, one with the audit off (Discard) and one with a queued
// log as a mount opens it, in alternating blocks of cycles (the first of
// each pair turning every block), so what drifts over a run (the ext4
// inode allocator skipping more and more freed inodes, the machine's
// other load) weighs on both alike. One b.N is a pair of blocks. It
// reports each mount's wall time per cycle and the on ÷ off ratio; the
// queued writer's own CPU runs in its goroutine, mostly during the "on"
// blocks, and counts in the process's CPU (cpu-ns/op: per cycle of both).
func BenchmarkAuditInterleaved(b *testing.B) {
	const block = 50
	data := make([]byte, 100)
	log := auditQueued.sink(b)
	off := newEnv(b, withOptions(func(o *Options) { o.Audit = audit.Discard }))
	on := newEnv(b, withOptions(func(o *Options) { o.Audit = log }))
	n := 0
	cycles := func(mnt string) time.Duration {
		start := time.Now()
		for range block {
			smallFileCycle(b, filepath.Join(mnt, fmt.Sprintf("f%d", n)), data)
			n++
		}
		return time.Since(start)
	}
	var tOff, tOn time.Duration
	cpu := cpuTime(b)
	for i := 0; b.Loop(); i++ {
		if i%2 == 0 {
			tOff += cycles(off.mnt)
			tOn += cycles(on.mnt)
		} else {
			tOn += cycles(on.mnt)
			tOff += cycles(off.mnt)
		}
	}
	per := float64(b.N * block)
	b.ReportMetric(float64(tOff.Nanoseconds())/per, "off-ns/cycle")
	b.ReportMetric(float64(tOn.Nanoseconds())/per, "on-ns/cycle")
	b.ReportMetric(100*(float64(tOn)/float64(tOff)-1), "on-vs-off-%")
	b.ReportMetric(float64(cpuTime(b)-cpu)/(2*per), "cpu-ns/op")
}

// smallFileCycle creates p holding data, stats it and removes it.
func smallFileCycle(b *testing.B, p string, data []byte) {
	var st unix.Stat_t
	if err := os.WriteFile(p, data, 0o600); err != nil {
		b.Fatal(err)
	}
	if err := unix.Stat(p, &st); err != nil {
		b.Fatal(err)
	}
	if err := os.Remove(p); err != nil {
		b.Fatal(err)
	}
}

// cpuTime is the CPU (user + system) this process has used so far.
func cpuTime(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
