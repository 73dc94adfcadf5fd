package fusefs

import (
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
)

// TestKeptReader: a file's second read-only open is served from the
// descriptor its first kept (no walk of its path), and still sees every
// change: made in the mount, by the tool door (a replace, as its atomic
// writes do), in place behind loomfs's back, a mode the agent took away,
// a removal. Under "cache: strict" nothing is kept.
func TestKeptReader(t *testing.T) {
	e := newEnv(t, withOptions(func(o *Options) { o.AllowOther = true }))
	f := e.m.fsys
	ctx := t.Context()
	mustWrite(t, e.path("k.txt"), "one")
	read := func(want string) {
		t.Helper()
		if err := wantContent(e.path("k.txt"), want); err != nil {
			t.Fatal(err)
		}
	}
	read("one")
	before := f.readerOpens.Load()
	read("one")
	if f.readerOpens.Load() == before {
		t.Fatal("the second read-only open did not use the kept reader")
	}

	// A write through the mount drops the reader; the next read opens
	// the path again and keeps the new open.
	mustWrite(t, e.path("k.txt"), "two")
	read("two")
	read("two")

	// The tool door replaces the file: the follower drops the reader
	// with the entry.
	if _, err := e.ws.WriteFile(ctx, "k.txt", []byte("three"), nil); err != nil {
		t.Fatal(err)
	}
	followed(t, e)
	seen(t, "the tool door's replace", func() error { return wantContent(e.path("k.txt"), "three") })
	read("three")

	// Changed in place behind loomfs's back, in no journal: every open
	// describes the kept descriptor again, so the new size is seen and
	// the pages the kernel kept are not used.
	if err := os.WriteFile(e.host("k.txt"), []byte("four!"), 0o600); err != nil {
		t.Fatal(err)
	}
	read("four!")

	// The agent takes its own read permission away: refused (by the
	// kernel under default_permissions, or here from the kept reader's
	// fresh description), never served from what was kept.
	if err := os.Chmod(e.path("k.txt"), 0o200); err != nil {
		t.Fatal(err)
	}
	if out, err := asUser(t, e.mnt, DefaultUID, "cat $W/k.txt"); err == nil {
		t.Errorf("read a file made write-only: %s", out)
	}
	if err := os.Chmod(e.path("k.txt"), 0o600); err != nil {
		t.Fatal(err)
	}

	// Hard-linked behind loomfs's back: the same rules as an open of the
	// path refuse it.
	if err := os.Link(e.host("k.txt"), e.host("second-name")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.ReadFile(e.path("k.txt")); err == nil {
		t.Error("read a file hard-linked behind loomfs's back")
	}
	if err := os.Remove(e.host("second-name")); err != nil {
		t.Fatal(err)
	}

	// Removed through the mount: the reader goes with it, so the file's
	// space is not held by the daemon.
	read("four!")
	var st unix.Stat_t
	if err := unix.Stat(e.host("k.txt"), &st); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(e.path("k.txt")); err != nil {
		t.Fatal(err)
	}
	// The last read's open holds the descriptor until the kernel's
	// release of it, which comes after close(2) returned.
	seen(t, "the removed file's descriptors closed", func() error {
		if fds := openInodes(t, st.Ino); fds != 0 {
			return fmt.Errorf("the daemon holds %d descriptors of the removed file", fds)
		}
		return nil
	})

	// Counted on this mount and by the descriptors of its files, not by
	// the process's count: the mount above may still get the kernel's
	// last releases meanwhile (a release is sent after close returns).
	t.Run("unmount closes them", func(t *testing.T) {
		e := newEnv(t)
		var inos []uint64
		for _, name := range []string{"a", "b", "c"} {
			mustWrite(t, e.path(name), name)
			for range 2 {
				if err := wantContent(e.path(name), name); err != nil {
					t.Fatal(err)
				}
			}
			var st unix.Stat_t
			if err := unix.Stat(e.host(name), &st); err != nil {
				t.Fatal(err)
			}
			inos = append(inos, st.Ino)
		}
		e.m.fsys.readers.mu.Lock()
		n := len(e.m.fsys.readers.nodes)
		e.m.fsys.readers.mu.Unlock()
		if n == 0 {
			t.Fatal("no kept reader for three files read twice each")
		}
		if err := e.m.Unmount(); err != nil {
			t.Fatal(err)
		}
		for i, ino := range inos {
			if fds := openInodes(t, ino); fds != 0 {
				t.Errorf("%d descriptors of file %d of 3 left open after the unmount (%d kept before it)", fds, i+1, n)
			}
		}
	})

	t.Run("strict", func(t *testing.T) {
		e := newEnv(t, withCache(policy.CacheStrict))
		mustWrite(t, e.path("s.txt"), "s")
		for range 3 {
			if err := wantContent(e.path("s.txt"), "s"); err != nil {
				t.Fatal(err)
			}
		}
		if n := e.m.fsys.readerOpens.Load(); n != 0 {
			t.Errorf("%d opens served from kept readers under cache: strict", n)
		}
	})
}

// TestKeptReaderFlock: two opens of one file that share its kept reader
// still hold flock locks of their own: the second can't take the first's
// exclusive lock, and takes it once the first closes.
func TestKeptReaderFlock(t *testing.T) {
	e := newEnv(t)
	mustWrite(t, e.path("l"), "x")
	for range 2 {
		if err := wantContent(e.path("l"), "x"); err != nil {
			t.Fatal(err)
		}
	}
	before := e.m.fsys.readerOpens.Load()
	a, err := os.Open(e.path("l"))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := os.Open(e.path("l"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if e.m.fsys.readerOpens.Load()-before != 2 {
		t.Fatal("the two opens did not share the kept reader")
	}
	if err := unix.Flock(int(a.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(b.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != unix.EWOULDBLOCK {
		t.Fatalf("a second open took the first's exclusive flock: %v", err)
	}
	a.Close()
	// The kernel releases the first open shortly after close(2).
	seen(t, "the lock after the first open closed", func() error {
		return unix.Flock(int(b.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	})
}

// openInodes counts the descriptors of this process open on inode ino.
func openInodes(t *testing.T, ino uint64) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, ent := range ents {
		var st unix.Stat_t
		if unix.Stat("/proc/self/fd/"+ent.Name(), &st) == nil && st.Ino == ino {
			n++
		}
	}
	return n
}
