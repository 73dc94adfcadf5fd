package fusefs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// secondMount mounts the scope of e a second time, over a Workspace of its
// own (as another process, or another node, would), and returns its
// mountpoint.
func secondMount(t *testing.T, e *env) string {
	t.Helper()
	return mountAt(t, secondWorkspace(t, e, nil), filepath.Join(filepath.Dir(e.mnt), "mnt2"), Options{}, nil)
}

// secondWorkspace opens the scope of e again under pol (nil: the default
// policy), over a Volume of its own, as another process would.
func secondWorkspace(t *testing.T, e *env, pol *policy.Policy) *store.Workspace {
	t.Helper()
	return workspaceOn(t, e.vol.Config(), pol)
}

// workspaceOn opens the test scope under pol over a Volume of its own with
// configuration cfg (another process, or another node's client of the
// same shared filesystem); both are closed at cleanup.
func workspaceOn(t *testing.T, cfg store.Config, pol *policy.Policy) *store.Workspace {
	t.Helper()
	ctx := context.Background()
	vol, err := store.OpenVolume(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vol.Close() })
	ws, err := vol.Open(ctx, testScope, pol)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	return ws
}

// seen waits until check passes: the follower drops what a journal line
// names shortly after the line is written. Without it the kernel would go
// on answering from what it cached, for DefaultCacheTimeout, and check
// would fail at the deadline.
func seen(t *testing.T, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still not seen through the mount after 5 s: %v", what, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// followed waits until the mount's follower has made a pass that began
// after the call: every journal line written before it is applied. A
// change another door made is seen by the mount's reads at once (each
// open resolves the path again), but a chmod or utimes by name reaches
// the node the kernel had for the path until that pass, as the coherence
// window of "cache: journal" allows.
func followed(t *testing.T, e *env) {
	t.Helper()
	fl := e.m.follower
	fl.mu.Lock()
	from := fl.passes
	fl.mu.Unlock()
	seen(t, "a journal pass after the change", func() error {
		fl.mu.Lock()
		defer fl.mu.Unlock()
		if fl.passes == from {
			return errors.New("no journal pass yet")
		}
		return nil
	})
}

// TestInvalidation: with long kernel caching, each kind of change made by
// another door (the tool door, or a second mount of the scope) is seen by
// a process that had the old entry, attributes, listing or pages cached.
func TestInvalidation(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name   string
		setup  func(t *testing.T, e *env)            // made through the mount
		cache  func(t *testing.T, e *env) error      // what the process caches
		change func(t *testing.T, e *env, m2 string) // made by the other door
		check  func(e *env) error                    // what it must see then
	}{
		{
			name:  "create after a failed lookup",
			cache: func(t *testing.T, e *env) error { _, err := os.Stat(e.path("new")); return wantMissing(err) },
			change: func(t *testing.T, e *env, _ string) {
				if _, err := e.ws.WriteFile(ctx, "new", []byte("made by the tools"), nil); err != nil {
					t.Fatal(err)
				}
			},
			check: func(e *env) error { return wantContent(e.path("new"), "made by the tools") },
		},
		{
			name:  "create in a listed directory",
			setup: func(t *testing.T, e *env) { mustMkdir(t, e.path("d")) },
			cache: func(t *testing.T, e *env) error { return wantEntries(e.path("d"), 0) },
			change: func(t *testing.T, e *env, _ string) {
				if _, err := e.ws.WriteFile(ctx, "d/x", []byte("x"), nil); err != nil {
					t.Fatal(err)
				}
			},
			check: func(e *env) error { return wantEntries(e.path("d"), 1) },
		},
		{
			name:  "unlink",
			setup: func(t *testing.T, e *env) { mustWrite(t, e.path("gone"), "here") },
			cache: func(t *testing.T, e *env) error { return wantContent(e.path("gone"), "here") },
			change: func(t *testing.T, e *env, _ string) {
				if err := e.ws.Remove(ctx, "gone", nil); err != nil {
					t.Fatal(err)
				}
			},
			check: func(e *env) error { _, err := os.Stat(e.path("gone")); return wantMissing(err) },
		},
		{
			name: "rename of a directory",
			setup: func(t *testing.T, e *env) {
				mustMkdir(t, e.path("old"))
				mustWrite(t, e.path("old/f"), "inside")
			},
			cache: func(t *testing.T, e *env) error {
				if _, err := os.Stat(e.path("new/f")); wantMissing(err) != nil {
					return err
				}
				return wantContent(e.path("old/f"), "inside")
			},
			change: func(t *testing.T, e *env, m2 string) {
				if err := os.Rename(filepath.Join(m2, "old"), filepath.Join(m2, "new")); err != nil {
					t.Fatal(err)
				}
			},
			check: func(e *env) error {
				if _, err := os.Stat(e.path("old/f")); wantMissing(err) != nil {
					return fmt.Errorf("old path: %v", err)
				}
				return wantContent(e.path("new/f"), "inside")
			},
		},
		{
			name:  "truncate",
			setup: func(t *testing.T, e *env) { mustWrite(t, e.path("t"), "twelve bytes") },
			cache: func(t *testing.T, e *env) error { return wantContent(e.path("t"), "twelve bytes") },
			change: func(t *testing.T, e *env, m2 string) {
				if err := os.Truncate(filepath.Join(m2, "t"), 3); err != nil {
					t.Fatal(err)
				}
			},
			check: func(e *env) error { return wantContent(e.path("t"), "twe") },
		},
		{
			name:  "chmod",
			setup: func(t *testing.T, e *env) { mustWrite(t, e.path("x"), "#!/bin/sh\n") },
			cache: func(t *testing.T, e *env) error { return wantMode(e.path("x"), 0o600) },
			change: func(t *testing.T, e *env, m2 string) {
				if err := os.Chmod(filepath.Join(m2, "x"), 0o700); err != nil {
					t.Fatal(err)
				}
			},
			check: func(e *env) error { return wantMode(e.path("x"), 0o700) },
		},
		{
			name:  "content change without size change",
			setup: func(t *testing.T, e *env) { mustWrite(t, e.path("same"), "aaaa") },
			cache: func(t *testing.T, e *env) error {
				// Twice: the second open keeps the pages of the first.
				if err := wantContent(e.path("same"), "aaaa"); err != nil {
					return err
				}
				return wantContent(e.path("same"), "aaaa")
			},
			change: func(t *testing.T, e *env, m2 string) {
				f, err := os.OpenFile(filepath.Join(m2, "same"), os.O_WRONLY, 0)
				if err != nil {
					t.Fatal(err)
				}
				// The mtime stays as it was, so only the journal tells.
				fi, _ := f.Stat()
				if _, err := f.WriteAt([]byte("bb"), 1); err != nil {
					t.Fatal(err)
				}
				f.Close()
				os.Chtimes(filepath.Join(m2, "same"), fi.ModTime(), fi.ModTime())
			},
			check: func(e *env) error { return wantContent(e.path("same"), "abba") },
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			m2 := secondMount(t, e)
			if c.setup != nil {
				c.setup(t, e)
			}
			if err := c.cache(t, e); err != nil {
				t.Fatalf("before the change: %v", err)
			}
			c.change(t, e, m2)
			seen(t, c.name, func() error { return c.check(e) })
		})
	}
}

// TestInvalidationStrict: under "cache: strict" the mount follows no
// journal and keeps entries one second, as before journals were followed.
func TestInvalidationStrict(t *testing.T) {
	e := newEnv(t, withCache(policy.CacheStrict))
	if e.m.follower != nil || e.m.fsys.timeout != StrictCacheTimeout || e.m.fsys.coherent {
		t.Fatalf("strict mount: follower %v, timeout %v, coherent %v", e.m.follower != nil, e.m.fsys.timeout, e.m.fsys.coherent)
	}
	if _, err := e.ws.WriteFile(context.Background(), "late", []byte("x"), nil); err != nil {
		t.Fatal(err)
	}
	if err := wantContent(e.path("late"), "x"); err != nil {
		t.Fatal(err)
	}
}

// TestOwnChangesNotDropped: the journal lines of the mount's own changes
// are not handed to the kernel as invalidations; the tool door's, in the
// same process and the same journal file, are.
func TestOwnChangesNotDropped(t *testing.T) {
	e := newEnv(t)
	for i := range 20 {
		mustWrite(t, e.path(fmt.Sprintf("f%d", i)), "x")
	}
	mustMkdir(t, e.path("d"))
	if err := os.Rename(e.path("d"), e.path("d2")); err != nil {
		t.Fatal(err)
	}
	waitReleased(t, e.m)
	fl := e.m.follower
	fl.catchUp()
	own := fl.f.drops.Load()
	if own != 0 {
		t.Fatalf("%d of the mount's own changes dropped from the kernel", own)
	}
	if _, err := e.ws.WriteFile(context.Background(), "f0", []byte("tools"), nil); err != nil {
		t.Fatal(err)
	}
	fl.catchUp()
	tools := fl.f.drops.Load()
	if tools != 1 {
		t.Fatalf("%d paths dropped for one tool write, want 1", tools)
	}
}

func wantContent(path, want string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if string(b) != want {
		return fmt.Errorf("%s holds %q, want %q", filepath.Base(path), b, want)
	}
	return nil
}

func wantMissing(err error) error {
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return fmt.Errorf("want ENOENT, got %v", err)
}

func wantEntries(dir string, n int) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	if len(ents) != n {
		return fmt.Errorf("%d entries, want %d", len(ents), n)
	}
	return nil
}

func wantMode(path string, mode os.FileMode) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if fi.Mode().Perm() != mode {
		return fmt.Errorf("mode %v, want %v", fi.Mode().Perm(), mode)
	}
	return nil
}

func mustMkdir(t *testing.T, p string) {
	t.Helper()
	if err := os.Mkdir(p, 0o700); err != nil {
		t.Fatal(err)
	}
}

// TestOwnChangesNoPass: the mount's own changes wake no pass over the
// journals (on a shared filesystem a pass is a listing and reads, round
// trips its writer would pay for); a change by the tool door in the same
// process, written to the same journal file, and one by another
// Workspace, each do, well before the poll.
func TestOwnChangesNoPass(t *testing.T) {
	e := newEnv(t, withOptions(func(o *Options) { o.JournalPoll = time.Hour }))
	fl := e.m.follower
	passes := func() int {
		fl.mu.Lock()
		defer fl.mu.Unlock()
		return fl.passes
	}
	before := passes()
	for i := range 50 {
		mustWrite(t, e.path(fmt.Sprintf("f%d", i)), "x")
	}
	waitReleased(t, e.m)
	time.Sleep(200 * time.Millisecond) // well past wakeGap and passGap
	if n := passes() - before; n != 0 {
		t.Fatalf("%d journal passes for the mount's own 50 writes, want 0", n)
	}

	before = passes()
	if _, err := e.ws.WriteFile(context.Background(), "f0", []byte("tools"), nil); err != nil {
		t.Fatal(err)
	}
	seen(t, "the tool door's write in the same process", func() error {
		if passes() == before {
			return errors.New("no pass")
		}
		return wantContent(e.path("f0"), "tools")
	})

	ws2 := secondWorkspace(t, e, nil)
	before = passes()
	if _, err := ws2.WriteFile(context.Background(), "f1", []byte("other"), nil); err != nil {
		t.Fatal(err)
	}
	seen(t, "another Workspace's write", func() error {
		if passes() == before {
			return errors.New("no pass")
		}
		return wantContent(e.path("f1"), "other")
	})
}

// TestWarmOpendir: once the mount has served a directory's listing, which
// the kernel keeps, an opendir and readdir of it open nothing on the
// backing store; a change made by another door drops the listing, and
// the next opendir opens the directory again and lists the change.
func TestWarmOpendir(t *testing.T) {
	e := newEnv(t)
	mustMkdir(t, e.path("d"))
	for i := range 5 {
		mustWrite(t, e.path(fmt.Sprintf("d/f%d", i)), "x")
	}
	f := e.m.fsys
	if err := wantEntries(e.path("d"), 5); err != nil {
		t.Fatal(err)
	}
	before := f.dirOpens.Load()
	for range 3 {
		if err := wantEntries(e.path("d"), 5); err != nil {
			t.Fatal(err)
		}
	}
	if n := f.dirOpens.Load() - before; n != 0 {
		t.Fatalf("%d backing directories opened for three warm listings, want 0", n)
	}
	if _, err := e.ws.WriteFile(context.Background(), "d/new", []byte("tools"), nil); err != nil {
		t.Fatal(err)
	}
	seen(t, "the tool door's new file in a listed directory", func() error {
		return wantEntries(e.path("d"), 6)
	})
	if f.dirOpens.Load() == before {
		t.Fatal("the listing after the tool door's change opened no backing directory")
	}
}

// TestEndedWriterTrusted: a writer of the scope that ends (a loomfs tool
// call, a session's process) drops what its lines name and nothing else,
// on the pass that reads its end line and on every pass after, when its
// file is read at its end: the pages the mount's kernel keeps of another
// file stay kept.
func TestEndedWriterTrusted(t *testing.T) {
	e := newEnv(t)
	mustWrite(t, e.path("kept"), "kept pages")
	waitReleased(t, e.m)
	fl := e.m.follower
	fl.catchUp()
	reads := func() int64 {
		if err := wantContent(e.path("kept"), "kept pages"); err != nil {
			t.Fatal(err)
		}
		return e.m.fsys.daemonReads.Load()
	}
	reads() // the first read fills the kernel's pages, which it keeps after

	// Another process's writer makes a change and ends.
	ws2 := secondWorkspace(t, e, nil)
	if _, err := ws2.WriteFile(context.Background(), "other", []byte("x"), nil); err != nil {
		t.Fatal(err)
	}
	if err := ws2.Close(); err != nil {
		t.Fatal(err)
	}
	fl.catchUp()
	before := reads()
	// Another change, so that the next pass reads the journals again,
	// the ended file at its end.
	if _, err := e.ws.WriteFile(context.Background(), "more", []byte("y"), nil); err != nil {
		t.Fatal(err)
	}
	fl.catchUp()
	if n := reads() - before; n != 0 {
		t.Errorf("%d reads of an unchanged file reached the daemon after an ended writer's journal was read again: the mount dropped its whole cache", n)
	}
}
