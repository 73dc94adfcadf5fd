package fusefs

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
)

// Programs run unchanged in the projection wherever policy does not refuse
// on purpose (SPEC §3.2): the tests below do what toolchains do.

// TestModesKept: the owner bits a program asks for are kept on create,
// mkdir and chmod, and no group, other or special bit ever reaches the
// backing store (SPEC §2.1); executables copied, written and built in the
// workspace run.
func TestModesKept(t *testing.T) {
	e := newEnv(t, withOptions(func(o *Options) { o.AllowOther = true }))
	mustWrite(t, e.host("planted"), "x")
	if err := os.Chmod(e.host("planted"), 0o644); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, e.path("hello.c"), "#include <stdio.h>\nint main(void) { puts(\"built ran\"); return 0; }\n")
	gcc, gccErr := exec.LookPath("gcc")
	build := "echo built ran"
	if gccErr == nil {
		build = gcc + " -o app hello.c && ./app && stat -c '%n %a' app"
	} else {
		t.Log("no gcc: the built binary is not tried")
	}
	out, err := asUser(t, e.mnt, DefaultUID, `umask 022; cd $W || exit 99
/usr/bin/python3 -c 'import os; os.close(os.open("created", os.O_CREAT|os.O_WRONLY, 0o755))'
/usr/bin/python3 -c 'import os; os.close(os.open("readonly", os.O_CREAT|os.O_WRONLY, 0o444))'
echo x > f && chmod 755 f && stat -c '%n %a' created readonly f
echo x > g && chmod 777 g && stat -c '%n %a' g
mkdir -m 755 d && mkdir -m 500 r && stat -c '%n %a' d r planted
cp /bin/true copied && ./copied && echo copied ran
printf '#!/bin/sh\necho script ran\n' > s && chmod +x s && ./s
mkdir x && tar -cf x.tar s && tar -xf x.tar -C x && x/s | sed 's/script/extracted/'
`+build)
	if err != nil {
		t.Fatalf("as the sandbox user: %v\n%s", err, out)
	}
	for _, want := range []string{"created 700", "readonly 400", "f 700", "g 700", "d 700", "r 500", "planted 600", "copied ran", "script ran", "extracted ran", "built ran", "app 700"} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for rel, want := range map[string]os.FileMode{"created": 0o700, "readonly": 0o400, "f": 0o700, "g": 0o700, "d": 0o700, "r": 0o500, "copied": 0o700, "s": 0o700} {
		fi, err := os.Lstat(e.host(rel))
		if err != nil {
			t.Errorf("backing %s: %v", rel, err)
			continue
		}
		if got := fi.Mode() & (os.ModePerm | os.ModeSetuid | os.ModeSetgid | os.ModeSticky); got != want {
			t.Errorf("backing %s has mode %v, want %v", rel, got, want)
		}
	}
}

// TestToolDoorKeepsMode: the tool door's atomic replace keeps the mode of
// the file it replaces; a new file is 0600.
func TestToolDoorKeepsMode(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	mustWrite(t, e.path("run.sh"), "#!/bin/sh\necho one\n")
	if err := os.Chmod(e.path("run.sh"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := e.ws.WriteFile(ctx, "run.sh", []byte("#!/bin/sh\necho two\n"), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := e.ws.WriteFile(ctx, "new.txt", []byte("new\n"), nil); err != nil {
		t.Fatal(err)
	}
	for rel, want := range map[string]os.FileMode{"run.sh": 0o700, "new.txt": 0o600} {
		fi, err := os.Stat(e.host(rel))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s after a tool write: mode %v, want %v", rel, fi.Mode().Perm(), want)
		}
	}
	e.m.Invalidate("run.sh")
	// Through a shell, never exec'd from this process: a child vforked
	// here would fault on the mount while the parent, which serves it,
	// waits with signals blocked for the child's exec, and a garbage
	// collection stopping the world then stops the server too.
	if out, err := runIn(t, e.mnt, "./run.sh"); err != nil || out != "two\n" {
		t.Errorf("run.sh after a tool write: %q %v", out, err)
	}
}

// TestLinkCrossDevice: link(2) answers EXDEV, so programs copy instead;
// a hard link planted in the backing store stays refused.
func TestLinkCrossDevice(t *testing.T) {
	e := newEnv(t)
	mustWrite(t, e.path("f"), "x")
	wantErrno(t, os.Link(e.path("f"), e.path("g")), syscall.EXDEV)
	if len(e.sink.find("link", "refused", "g")) == 0 {
		t.Error("link refusal not recorded")
	}
	// cp -l would fail; cp --reflink=auto and tools that fall back copy.
	if out, err := runIn(t, e.mnt, `/usr/bin/python3 -c '
import os, shutil
try:
    os.link("f", "g")
except OSError as e:
    import errno
    assert e.errno == errno.EXDEV, e
    shutil.copyfile("f", "g")
'`); err != nil {
		t.Fatalf("fallback on EXDEV: %v\n%s", err, out)
	}
	if fi, err := os.Stat(e.host("g")); err != nil || fi.Sys().(*syscall.Stat_t).Nlink != 1 {
		t.Errorf("the copy: %v", err)
	}
	plantHardlink(t, e)
	_, err := os.ReadFile(e.path("h1"))
	wantErrno(t, err, syscall.EPERM)
}

// TestReadyNotListed: the sentinel and a health probe's file answer lookup
// and stat but readdir never lists them, so git add -A, tar and cp -r
// leave them alone; the generated README stays listed.
func TestReadyNotListed(t *testing.T) {
	e := newEnv(t)
	if err := e.m.Probe(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(e.path(policy.ReadyFile)); err != nil {
		t.Fatalf("stat of the sentinel: %v", err)
	}
	mustWrite(t, e.path("src/main.go"), "package main\n")
	// A health probe under way: its file is loomfs's too.
	probe := policy.ProbePrefix + "0123456789abcdef"
	e.m.fsys.probing.Store(&probe)
	mustWrite(t, e.path(probe), "loomfs probe\n")
	if _, err := os.Stat(e.path(probe)); err != nil {
		t.Fatalf("stat of the probe's file: %v", err)
	}
	out, err := runIn(t, e.mnt, `ls -a; tar -cf ../listed.tar . && tar -tf ../listed.tar; cp -r . ../copy && ls -a ../copy`)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if strings.Contains(out, policy.ReadyFile) || strings.Contains(out, probe) {
		t.Errorf("the sentinel or the probe's file was listed, archived or copied:\n%s", out)
	}
	if !strings.Contains(out, "main.go") {
		t.Errorf("the tree was not listed:\n%s", out)
	}
	git, err := exec.LookPath("git")
	if err != nil {
		t.Skip("no git")
	}
	// The test runs as root; the mount shows the sandbox user as owner.
	git += " -c safe.directory=* -c user.name=t -c user.email=t@t"
	script := git + ` init -q && ` + git + ` add -A && ` + git + ` commit -qm one &&
echo change >> src/main.go && ` + git + ` stash -q && ` + git + ` checkout -q -b other && ` + git + ` stash pop -q &&
` + git + ` ls-files && ` + git + ` status --porcelain`
	out, err = runIn(t, e.mnt, script)
	if err != nil {
		t.Fatalf("git in the workspace: %v\n%s", err, out)
	}
	if strings.Contains(out, policy.ReadyFile) {
		t.Errorf("git picked up the sentinel:\n%s", out)
	}
	if !strings.Contains(out, "src/main.go") {
		t.Errorf("git lost the tree:\n%s", out)
	}
}

// TestNameErrnos: names and paths over the bounds answer ENAMETOOLONG on
// lookup and create, and refused names EPERM, never EINVAL (with EINVAL
// "rm -f" exits 0 and leaves the file there).
func TestNameErrnos(t *testing.T) {
	e := newEnv(t)
	if err := e.m.Probe(context.Background()); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("n", policy.MaxNameBytes+1)
	t.Run("create a 256-byte name", func(t *testing.T) {
		wantErrno(t, os.WriteFile(e.path(long), nil, 0o600), syscall.ENAMETOOLONG)
		wantErrno(t, os.Mkdir(e.path(long), 0o700), syscall.ENAMETOOLONG)
	})
	t.Run("look up a 256-byte name", func(t *testing.T) {
		_, err := os.Lstat(e.path(long))
		wantErrno(t, err, syscall.ENAMETOOLONG)
	})
	t.Run("a 255-byte name works", func(t *testing.T) {
		mustWrite(t, e.path(long[1:]), "x")
	})
	t.Run("a path the tools could not address", func(t *testing.T) {
		// 20 directories of 200 bytes make a path of 4,019 bytes; a name
		// of 255 more is past 4,096.
		dir, err := unix.Open(e.mnt, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { unix.Close(dir) }()
		comp := strings.Repeat("d", 200)
		for range 20 {
			if err := unix.Mkdirat(dir, comp, 0o700); err != nil {
				t.Fatal(err)
			}
			next, err := unix.Openat(dir, comp, unix.O_RDONLY|unix.O_DIRECTORY, 0)
			if err != nil {
				t.Fatal(err)
			}
			unix.Close(dir)
			dir = next
		}
		fd, err := unix.Openat(dir, long[1:], unix.O_CREAT|unix.O_WRONLY, 0o600)
		if err == nil {
			unix.Close(fd)
		}
		wantErrno(t, err, syscall.ENAMETOOLONG)
		wantErrno(t, unix.Mkdirat(dir, long[1:], 0o700), syscall.ENAMETOOLONG)
	})
	for _, c := range []struct{ name, cmd string }{
		{"rm -f the sentinel", "rm -f " + policy.ReadyFile},
		{"create a loomfs name", "touch .agentloom-x"},
		{"mkdir subagents at the top", "mkdir subagents"},
		{"a backslash", `touch 'a\b'`},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, err := runIn(t, e.mnt, c.cmd)
			if err == nil {
				t.Fatalf("%q exited 0:\n%s", c.cmd, out)
			}
			if !strings.Contains(strings.ToLower(out), syscall.EPERM.Error()) {
				t.Errorf("%q: want %q, got:\n%s", c.cmd, syscall.EPERM.Error(), out)
			}
		})
	}
}

// TestReplaceRace: a reader opening a file while the tool door replaces it
// gets the old file or the new one, whole: never ENOENT, never ESTALE (the
// kernel retries an open that got ESTALE only once), never a torn read.
func TestReplaceRace(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	version := func(i int) string { return "v" + strings.Repeat("x", i%7*100) + "\n" }
	if _, err := e.ws.WriteFile(ctx, "f", []byte(version(0)), nil); err != nil {
		t.Fatal(err)
	}
	valid := map[string]bool{}
	for i := range 7 {
		valid[version(i)] = true
	}
	stop := make(chan struct{})
	var writes atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 1; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := e.ws.WriteFile(ctx, "f", []byte(version(i)), nil); err != nil {
				t.Error(err)
				return
			}
			writes.Add(1)
		}
	}()
	var opens, enoent, estale, other, torn atomic.Int64
	var firstErr atomic.Value
	readersDone := make(chan struct{})
	var readers sync.WaitGroup
	for range 3 {
		readers.Add(1)
		go func() {
			defer readers.Done()
			for {
				select {
				case <-readersDone:
					return
				default:
				}
				b, err := os.ReadFile(e.path("f"))
				opens.Add(1)
				switch {
				case err == nil:
					if !valid[string(b)] {
						torn.Add(1)
					}
				case errors.Is(err, syscall.ENOENT):
					enoent.Add(1)
				case errors.Is(err, syscall.ESTALE):
					estale.Add(1)
				default:
					other.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				}
			}
		}()
	}
	// Run for at least 3 s and 300 replaces, however loaded the machine
	// (a count, not a time, says the race was run), and at most a minute.
	start := time.Now()
	for (time.Since(start) < 3*time.Second || writes.Load() < 300) && time.Since(start) < time.Minute {
		time.Sleep(50 * time.Millisecond)
	}
	close(readersDone)
	readers.Wait()
	close(stop)
	wg.Wait()
	t.Logf("%d reads during %d replaces: %d ENOENT, %d ESTALE, %d torn, %d other errors (%v)",
		opens.Load(), writes.Load(), enoent.Load(), estale.Load(), torn.Load(), other.Load(), firstErr.Load())
	if enoent.Load()+estale.Load()+torn.Load()+other.Load() != 0 {
		t.Errorf("of %d reads while the file was being replaced: %d ENOENT, %d ESTALE, %d torn, %d other errors",
			opens.Load(), enoent.Load(), estale.Load(), torn.Load(), other.Load())
	}
	if writes.Load() < 300 {
		t.Errorf("only %d replaces: the race was hardly run", writes.Load())
	}
}

// TestChownShownOwner: changing the owner to the one the projection shows
// is a no-op that succeeds (cp -p, install, shutil.copy2); any other owner
// is refused.
func TestChownShownOwner(t *testing.T) {
	e := newEnv(t, withOptions(func(o *Options) { o.AllowOther = true }))
	out, err := asUser(t, e.mnt, DefaultUID, `cd $W || exit 99
echo x > f && chmod 700 f
chown 1000:1000 f && chown 1000 f && chown :1000 f && echo chown ok
cp -p f copy && echo cp-p ok
install -m 755 f installed && stat -c '%n %a' installed
/usr/bin/python3 -c 'import os, shutil; shutil.copy2("f", "py"); os.chown("py", 1000, 1000); os.lchown("py", -1, 1000); fd = os.open("py", os.O_RDONLY); os.fchown(fd, 1000, 1000); print("python ok")'
chown 0:0 f 2>&1; chown :0 f 2>&1; true`)
	// Root, as in tar -x or rsync -a run as root, gets the same answers.
	if o, err := runIn(t, e.mnt, "chown 1000:1000 f && chown -h 1000 f && chown -R 1000:1000 . && echo root chown ok; chown 0 f"); !strings.Contains(o, "root chown ok") || err == nil {
		t.Errorf("chown as root: %v\n%s", err, o)
	} else {
		out += o
	}
	if err != nil {
		t.Fatalf("as the sandbox user: %v\n%s", err, out)
	}
	for _, want := range []string{"chown ok", "cp-p ok", "installed 700", "python ok", "root chown ok"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Count(out, "Operation not permitted") != 3 {
		t.Errorf("chown to another owner not refused three times with EPERM:\n%s", out)
	}
	var st unix.Stat_t
	if err := unix.Stat(e.host("f"), &st); err != nil || st.Uid != 0 {
		t.Errorf("backing owner changed: uid %d, %v", st.Uid, err)
	}
}

// TestOpenUnlinked: fstat, fchmod, fchown, futimens and ftruncate on a
// file unlinked while open use the open file. Nothing is cached, so each
// call reaches the mount.
func TestOpenUnlinked(t *testing.T) {
	e := newEnv(t, withOptions(func(o *Options) { o.CacheTimeout = -1 }))
	mustWrite(t, e.path("f"), "content")
	f, err := os.OpenFile(e.path("f"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := os.Remove(e.path("f")); err != nil {
		t.Fatal(err)
	}
	fd := int(f.Fd())
	if err := unix.Fchmod(fd, 0o700); err != nil {
		t.Errorf("fchmod: %v", err)
	}
	if err := unix.Ftruncate(fd, 3); err != nil {
		t.Errorf("ftruncate: %v", err)
	}
	if err := unix.Fchown(fd, DefaultUID, DefaultGID); err != nil {
		t.Errorf("fchown to the owner shown: %v", err)
	}
	when := time.Unix(1_600_000_000, 0)
	ts := []unix.Timespec{unix.NsecToTimespec(when.UnixNano()), unix.NsecToTimespec(when.UnixNano())}
	// futimens(3) is utimensat with a NULL path.
	if _, _, e := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(fd), 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0); e != 0 {
		t.Errorf("futimens: %v", e)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&0o7777 != 0o700 || st.Size != 3 || st.Mtim.Sec != when.Unix() {
		t.Errorf("after the changes: mode %o size %d mtime %d", st.Mode&0o7777, st.Size, st.Mtim.Sec)
	}
}

// TestFallocateKeepSize: a reservation past the end of a file, which the
// quota (apparent size) can't see, is refused with EOPNOTSUPP, never
// granted short in silence; one within the file is served.
func TestFallocateKeepSize(t *testing.T) {
	e := newEnv(t, withLimits(testLimits))
	mustWrite(t, e.path("f"), strings.Repeat("x", 8192))
	f, err := os.OpenFile(e.path("f"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fd := int(f.Fd())
	wantErrno(t, unix.Fallocate(fd, unix.FALLOC_FL_KEEP_SIZE, 0, 512<<20), syscall.EOPNOTSUPP)
	if err := unix.Fallocate(fd, unix.FALLOC_FL_KEEP_SIZE, 0, 4096); err != nil {
		t.Errorf("KEEP_SIZE within the file: %v", err)
	}
	if err := unix.Fallocate(fd, unix.FALLOC_FL_KEEP_SIZE|unix.FALLOC_FL_PUNCH_HOLE, 4096, 1<<20); err != nil {
		t.Errorf("punching a hole past the end: %v", err)
	}
	var st unix.Stat_t
	if err := unix.Stat(e.host("f"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != 8192 || st.Blocks*512 > 64<<10 {
		t.Errorf("backing file: size %d, %d bytes allocated", st.Size, st.Blocks*512)
	}
	if len(e.sink.find("fallocate", "refused", "f")) == 0 {
		t.Error("the refused fallocate was not recorded")
	}
}

// TestGitCloneKeepsModes: a repository holding executables clones into the
// workspace with a clean status, and its scripts run.
func TestGitCloneKeepsModes(t *testing.T) {
	git, err := exec.LookPath("git")
	if err != nil {
		t.Skip("no git")
	}
	e := newEnv(t)
	// The test runs as root; the mount shows the sandbox user as owner.
	git += " -c safe.directory=* -c user.name=t -c user.email=t@t -c init.defaultBranch=main"
	src := e.outside + "/src"
	if out, err := runIn(t, e.outside, `mkdir src && cd src && `+git+` init -q &&
printf '#!/bin/sh\necho tool ran\n' > tool.sh && chmod 755 tool.sh && echo data > data.txt &&
`+git+` add -A && `+git+` commit -qm one`); err != nil {
		t.Fatalf("source repository: %v\n%s", err, out)
	}
	out, err := runIn(t, e.mnt, git+` clone -q `+src+` repo && cd repo && ./tool.sh && `+git+` status --porcelain && echo status done`)
	if err != nil {
		t.Fatalf("clone: %v\n%s", err, out)
	}
	if out != "tool ran\nstatus done\n" {
		t.Errorf("clone, run and status printed:\n%s", out)
	}
}
