package faults

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// mountTmpfs mounts a tmpfs with opts on dir, unmounted at cleanup.
func mountTmpfs(t *testing.T, dir, opts string) {
	t.Helper()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", opts, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs (root is needed): %v: %s", err, out)
	}
	t.Cleanup(func() {
		if err := exec.Command("umount", dir).Run(); err != nil {
			exec.Command("umount", "-l", dir).Run()
		}
	})
}

// fillBytes writes a file outside every scope until the volume is full,
// and returns a function that frees the space again.
func fillBytes(t *testing.T, root string) (free func()) {
	t.Helper()
	p := filepath.Join(root, "filler")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64<<10)
	for {
		if _, err = f.Write(buf); err != nil {
			break
		}
	}
	f.Close()
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("filling the volume: %v", err)
	}
	return func() { os.Remove(p) }
}

// fillInodes creates empty files outside every scope until the volume has
// no inode left, and returns a function that frees them.
func fillInodes(t *testing.T, root string) (free func()) {
	t.Helper()
	dir := filepath.Join(root, "inodes")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		f, err := os.Create(filepath.Join(dir, fmt.Sprint(i)))
		if err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("using up the inodes: %v", err)
			}
			break
		}
		f.Close()
	}
	return func() { os.RemoveAll(dir) }
}

// errCode is a tool answer's error code, "" for a result.
func errCode(o outcome) string {
	var m struct{ Error struct{ Code string } }
	json.Unmarshal([]byte(o.stdout), &m)
	return m.Error.Code
}

// refusedClearly checks a tool's answer on a volume that can't take the
// change: exit 1, JSON, and the code a full volume has (no_space).
func refusedClearly(t *testing.T, what string, o outcome) {
	t.Helper()
	if s := crashed(o, false); s != "" {
		t.Errorf("%s on a full volume: %s: %s", what, s, o)
		return
	}
	if _, p := answer(o); p != "" {
		t.Errorf("%s on a full volume: %s", what, p)
		return
	}
	if code := errCode(o); code != "no_space" {
		t.Errorf("%s on a full volume answers code %q, want no_space: %s", what, code, o)
	}
}

// TestFullVolume fills a small tmpfs under the workspace root and uses
// every door: the tool door refuses with no_space and keeps the old
// content, reads go on, a mount answers ENOSPC and stays up, and once
// space comes back everything works without a restart.
func TestFullVolume(t *testing.T) {
	for _, tc := range []struct {
		name string
		fill func(*testing.T, string) func()
		opts string
	}{
		{"bytes", fillBytes, "size=8m,nr_inodes=4096,mode=0700"},
		{"inodes", fillInodes, "size=64m,nr_inodes=400,mode=0700"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCell(t)
			mountTmpfs(t, c.root, tc.opts)
			seed(c, map[string]string{"x.txt": oldText, "z.txt": "to be deleted\n"})
			mnt := filepath.Join(c.dir, "mnt")
			os.Mkdir(mnt, 0o755)
			// A mount started before the volume filled up.
			early, ready := startMount(c.plain("mount", "--scope", scope, mnt), mnt)
			if !ready {
				early.stop(10 * time.Second)
				t.Fatalf("mount: %s", early.stderr.String())
			}
			free := tc.fill(t, c.root)
			for _, call := range []struct {
				tool  string
				input map[string]any
			}{
				{"workspace_write", map[string]any{"path": "x.txt", "content": strings.Repeat(newText, 2000)}},
				{"workspace_write", map[string]any{"path": "new.txt", "content": strings.Repeat(newText, 2000)}},
				{"workspace_edit", map[string]any{"path": "x.txt", "old_text": "beta", "new_text": strings.Repeat("BETA", 30000)}},
				{"workspace_apply_patch", map[string]any{"patch": patch}},
			} {
				refusedClearly(t, call.tool, c.tool(call.tool, call.input))
			}
			if o := c.tool("workspace_read", map[string]any{"path": "x.txt"}); o.exit != 0 {
				t.Errorf("a read on a full volume: %s", o)
			}
			if got := c.tree()["x.txt"]; got != oldText {
				t.Errorf("x.txt after refused changes: %q", got)
			}
			// Through the mount: ENOSPC, and the mount stays up.
			err, hung := within(20*time.Second, func() error {
				return os.WriteFile(filepath.Join(mnt, "big.bin"), make([]byte, 1<<20), 0o600)
			})
			switch {
			case hung:
				t.Errorf("a write through the mount on a full volume hung")
			case !errors.Is(err, syscall.ENOSPC) && !errors.Is(err, syscall.EDQUOT):
				t.Errorf("a write through the mount on a full volume: %v, want ENOSPC", err)
			}
			if b, err := os.ReadFile(filepath.Join(mnt, "x.txt")); err != nil || string(b) != oldText {
				t.Errorf("a read through the mount on a full volume: %q, %v", b, err)
			}
			// A mount started on the full volume serves too.
			mnt2 := filepath.Join(c.dir, "mnt2")
			os.Mkdir(mnt2, 0o755)
			late, ready := startMount(c.plain("mount", "--scope", scope, mnt2), mnt2)
			if !ready {
				t.Errorf("a mount started on a full volume: %s", late.stderr.String())
			} else {
				err, hung := within(20*time.Second, func() error {
					return os.WriteFile(filepath.Join(mnt2, "late.bin"), make([]byte, 1<<20), 0o600)
				})
				if hung || (!errors.Is(err, syscall.ENOSPC) && !errors.Is(err, syscall.EDQUOT)) {
					t.Errorf("a create through a mount started on a full volume: %v (hung %v), want ENOSPC", err, hung)
				}
			}
			// Space comes back: the same mounts and the tools work again.
			free()
			for _, p := range []string{"big.bin", "late.bin"} {
				c.tool("workspace_delete", map[string]any{"path": p})
			}
			if o := c.tool("workspace_write", map[string]any{"path": "x.txt", "content": newText}); o.exit != 0 {
				t.Errorf("a write once space is back: %s", o)
			}
			for _, d := range []*daemon{early, late} {
				if !ready && d == late {
					continue
				}
				// A mount may go on reading the volume as full for a moment
				// (it keeps a reading of its free space): 5 s to see it back.
				var err error
				var hung bool
				for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(200 * time.Millisecond) {
					err, hung = within(20*time.Second, func() error {
						return os.WriteFile(filepath.Join(d.mnt, "back.txt"), []byte("back\n"), 0o600)
					})
					if hung || err == nil || time.Now().After(deadline) {
						break
					}
				}
				if hung || err != nil {
					t.Errorf("a write through the mount at %s 5 s after space is back: %v (hung %v)", filepath.Base(d.mnt), err, hung)
				}
			}
			for _, d := range []*daemon{early, late} {
				if o := d.stop(30 * time.Second); o.exit != 0 || crashed(o, false) != "" {
					t.Errorf("the mount at %s: %s", filepath.Base(d.mnt), o)
				}
				if mounted(d.mnt) {
					t.Errorf("a mount is left at %s", filepath.Base(d.mnt))
					detach(d.mnt)
				}
			}
			for _, p := range c.scopeHeld() {
				t.Error(p)
			}
		})
	}
}

// TestDescriptorExhaustion runs a tool write with every descriptor limit
// from the fewest a loomfs process can start with (9: below it the Go
// runtime's own epoll and eventfd, or go-fuse's pipe made at init, fail
// before loomfs runs, see RELIABILITY.md) to enough: each answers, none
// crashes, and the file is old or new.
func TestDescriptorExhaustion(t *testing.T) {
	c := newCell(t)
	before := seed(c, map[string]string{"x.txt": oldText})
	limits := []int{9, 10, 12, 14, 16, 20, 24, 32}
	if full {
		limits = nil
		for n := 9; n <= 40; n++ {
			limits = append(limits, n)
		}
	}
	for _, n := range limits {
		x := exec.Command("prlimit", fmt.Sprintf("--nofile=%d:%d", n, n), loomfsBin)
		x.Args = append(x.Args, c.args("tool", "workspace_write", "--scope", scope, "--input",
			fmt.Sprintf(`{"path":"x.txt","content":%q}`, newText), "--timeout", "20s")...)
		x.Env = env()
		o := run(x, "", time.Minute)
		var bad []string
		if s := crashed(o, false); s != "" {
			bad = append(bad, s+": "+o.String())
		} else if _, p := answer(o); p != "" {
			bad = append(bad, p)
		}
		got := c.tree()["x.txt"]
		if got != oldText && got != newText {
			bad = append(bad, fmt.Sprintf("x.txt is torn: %q", got))
		}
		if o.exit == 0 && got != newText {
			bad = append(bad, fmt.Sprintf("acknowledged, yet x.txt holds %q", got))
		}
		for _, b := range bad {
			t.Errorf("ulimit -n %d: %s", n, b)
		}
		tally.add("ulimit -n", "tool", len(bad) == 0)
		// Put the old content back for the next limit.
		c.tool("workspace_write", map[string]any{"path": "x.txt", "content": before["x.txt"]})
	}
	for _, p := range c.scopeHeld() {
		t.Error(p)
	}
}

// memoryCgroup makes a memory cgroup (v1 or v2) limited to limit bytes and
// returns the file a process writes its pid into to join it.
func memoryCgroup(t *testing.T, limit int64) string {
	t.Helper()
	b := make([]byte, 4)
	rand.Read(b)
	name := "loomfs-faults-" + hex.EncodeToString(b)
	var dir, limitFile string
	if _, err := os.Stat("/sys/fs/cgroup/memory/memory.limit_in_bytes"); err == nil {
		dir, limitFile = filepath.Join("/sys/fs/cgroup/memory", name), "memory.limit_in_bytes"
	} else if c, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers"); err == nil && strings.Contains(string(c), "memory") {
		dir, limitFile = filepath.Join("/sys/fs/cgroup", name), "memory.max"
	} else {
		t.Fatal("no memory cgroup controller (v1 or v2) to limit the daemon with")
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for range 50 {
			if os.Remove(dir) == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Errorf("cgroup %s is still busy", name)
	})
	if err := os.WriteFile(filepath.Join(dir, limitFile), []byte(fmt.Sprint(limit)), 0o644); err != nil {
		t.Fatal(err)
	}
	// No swap to escape to, where v1 lets us say so.
	os.WriteFile(filepath.Join(dir, "memory.memsw.limit_in_bytes"), []byte(fmt.Sprint(limit)), 0o644)
	os.WriteFile(filepath.Join(dir, "memory.swap.max"), []byte("0"), 0o644)
	return filepath.Join(dir, "cgroup.procs")
}

// inCgroup runs x inside the cgroup whose procs file is procs.
func inCgroup(x *exec.Cmd, procs string) *exec.Cmd {
	y := exec.Command("sh", append([]string{"-c", `echo $$ > "$0" && exec "$@"`, procs, x.Path}, x.Args[1:]...)...)
	y.Env = x.Env
	return y
}

// TestOutOfMemory runs the tool door and a mount in a memory cgroup that
// leaves the process little room: a text write at its limit and a stream
// through the mount answer or refuse, and the kernel's OOM killer never
// has to end loomfs.
func TestOutOfMemory(t *testing.T) {
	c := newCell(t)
	seed(c, map[string]string{"x.txt": oldText})
	procs := memoryCgroup(t, 48<<20)
	big := strings.Repeat("0123456789abcdef", (2<<20)/16-64)
	in := fmt.Sprintf(`{"path":"big.txt","content":%q}`, big)
	o := run(inCgroup(c.plain("tool", "workspace_write", "--scope", scope, "--input", "-", "--timeout", "30s"), procs), in, time.Minute)
	toolHeld := true
	if s := crashed(o, false); s != "" {
		t.Errorf("a 2 MiB tool write in 48 MiB: %s: %s", s, o)
		toolHeld = false
	} else if _, p := answer(o); p != "" {
		t.Errorf("a 2 MiB tool write in 48 MiB: %s", p)
		toolHeld = false
	}
	tally.add("memory cgroup", "tool", toolHeld)
	mnt := filepath.Join(c.dir, "mnt")
	os.Mkdir(mnt, 0o755)
	d, ready := startMount(inCgroup(c.plain("mount", "--scope", scope, mnt), procs), mnt)
	if !ready {
		d.stop(10 * time.Second)
		t.Fatalf("a mount in 48 MiB did not start: %s", d.stderr.String())
	}
	err, hung := within(2*time.Minute, func() error {
		f, err := os.Create(filepath.Join(mnt, "stream.bin"))
		if err != nil {
			return err
		}
		buf := make([]byte, 1<<20)
		for range 256 {
			if _, err := f.Write(buf); err != nil {
				f.Close()
				return err
			}
		}
		return errors.Join(f.Sync(), f.Close())
	})
	mountHeld := !hung && err == nil
	if !mountHeld {
		t.Errorf("256 MiB through a mount in 48 MiB: %v (hung %v)", err, hung)
	}
	if o := d.stop(30 * time.Second); o.exit != 0 || crashed(o, false) != "" {
		t.Errorf("the mount in 48 MiB: %s", o)
		mountHeld = false
	}
	tally.add("memory cgroup", "fuse", mountHeld)
	if mounted(mnt) {
		t.Error("a mount is left")
		detach(mnt)
	}
	c.tool("workspace_delete", map[string]any{"path": "stream.bin"})
	for _, p := range c.scopeHeld() {
		t.Error(p)
	}
}
