package fusefs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// TestNewDirLookups: in a directory the mount made, the lookup before each
// create is answered from memory; a name made there, or moved in, is still
// found after the kernel forgot it; and once another door changes the
// scope, lookups there go to the backing store again and see its change.
func TestNewDirLookups(t *testing.T) {
	e := newEnv(t)
	f := e.m.fsys
	mustMkdir(t, e.path("d"))
	before := f.absentLookups.Load()
	for i := range 20 {
		mustWrite(t, e.path(fmt.Sprintf("d/f%d", i)), "x")
	}
	if n := f.absentLookups.Load() - before; n < 20 {
		t.Fatalf("%d of the lookups before 20 creates answered from memory, want all", n)
	}

	d := f.root.EmbeddedInode().GetChild("d")
	if d == nil {
		t.Fatal("no node for d")
	}
	mustWrite(t, e.path("top"), "moved")
	if err := os.Rename(e.path("top"), e.path("d/moved")); err != nil {
		t.Fatal(err)
	}
	mustMkdir(t, e.path("d/sub"))
	for _, name := range []string{"f0", "f19", "moved", "sub"} {
		// The kernel forgets the entry and looks the name up again.
		if errno := d.NotifyEntry(name); errno != 0 {
			t.Fatalf("forget %s: %v", name, errno)
		}
		if _, err := os.Lstat(e.path("d/" + name)); err != nil {
			t.Errorf("d/%s, made through the mount, after the kernel forgot it: %v", name, err)
		}
	}
	if _, err := os.Lstat(e.path("d/never")); !os.IsNotExist(err) {
		t.Errorf("d/never: %v, want it missing", err)
	}

	if _, err := e.ws.WriteFile(context.Background(), "d/tool", []byte("tools"), nil); err != nil {
		t.Fatal(err)
	}
	seen(t, "the tool door's file in a directory the mount made", func() error {
		return wantContent(e.path("d/tool"), "tools")
	})
	before = f.absentLookups.Load()
	mustWrite(t, e.path("d/after"), "x")
	if n := f.absentLookups.Load() - before; n != 0 {
		t.Errorf("%d lookups answered from memory after another door changed the scope, want 0", n)
	}
}

// TestNewDirLookupsSecondMount: an entry made by a second mount of the scope
// in a directory the first made is seen by the first.
func TestNewDirLookupsSecondMount(t *testing.T) {
	e := newEnv(t)
	mnt2 := secondMount(t, e)
	mustMkdir(t, e.path("d"))
	mustWrite(t, e.path("d/mine"), "1")
	mustWrite(t, mnt2+"/d/theirs", "2")
	seen(t, "the second mount's file", func() error {
		return wantContent(e.path("d/theirs"), "2")
	})
}

// TestNewDirLookupsStrict: under "cache: strict" every lookup goes to the
// backing store.
func TestNewDirLookupsStrict(t *testing.T) {
	e := newEnv(t, withCache(policy.CacheStrict))
	mustMkdir(t, e.path("d"))
	mustWrite(t, e.path("d/a"), "x")
	if n := e.m.fsys.absentLookups.Load(); n != 0 {
		t.Errorf("%d lookups answered from memory under cache: strict", n)
	}
}

// TestKeptDirs: requests naming entries of a directory the mount made use
// the directory it kept open, and land where the directory is: after a
// rename through the mount, at its new place. Once another door changes
// the scope they resolve the path again. The kept directories are bounded
// and closed at unmount.
func TestKeptDirs(t *testing.T) {
	e := newEnv(t)
	f := e.m.fsys
	mustMkdir(t, e.path("d"))
	before := f.kept.opens.Load()
	for i := range 10 {
		mustWrite(t, e.path(fmt.Sprintf("d/f%d", i)), "x")
	}
	if err := os.Rename(e.path("d/f0"), e.path("d/g0")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(e.path("d/f1")); err != nil {
		t.Fatal(err)
	}
	if n := f.kept.opens.Load() - before; n < 12 {
		t.Errorf("%d requests in a directory the mount made used its kept descriptor, want at least 12", n)
	}
	if err := os.Rename(e.path("d"), e.path("e")); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, e.path("e/after-move"), "moved")
	if err := wantContent(e.host("e/after-move"), "moved"); err != nil {
		t.Errorf("a create in a made directory after the mount moved it: %v", err)
	}
	if _, err := os.Lstat(e.host("d")); !os.IsNotExist(err) {
		t.Errorf("the old place of the moved directory: %v, want it gone", err)
	}

	drops := f.drops.Load()
	if _, err := e.ws.WriteFile(context.Background(), "elsewhere", []byte("tools"), nil); err != nil {
		t.Fatal(err)
	}
	seen(t, "the tool door's line read by the follower", func() error {
		if f.drops.Load() == drops {
			return errors.New("no drop yet")
		}
		return nil
	})
	before = f.kept.opens.Load()
	mustWrite(t, e.path("e/late"), "x")
	if n := f.kept.opens.Load() - before; n != 0 {
		t.Errorf("%d requests used a kept descriptor after another door changed the scope, want 0", n)
	}
	if err := wantContent(e.host("e/late"), "x"); err != nil {
		t.Error(err)
	}

	mustMkdir(t, e.path("many"))
	for i := range maxKeptDirs + 10 {
		mustMkdir(t, e.path(fmt.Sprintf("many/%d", i)))
	}
	f.kept.mu.Lock()
	kept := slices.Clone(f.kept.dirs)
	f.kept.mu.Unlock()
	if len(kept) > maxKeptDirs {
		t.Errorf("%d directories kept open, want at most %d", len(kept), maxKeptDirs)
	}
	if err := e.m.Unmount(); err != nil {
		t.Fatal(err)
	}
	for _, m := range kept {
		if m.fd >= 0 {
			t.Fatal("a kept directory still open after unmount")
		}
	}
}

// TestKeptDirMovedElsewhere: a create through a kept directory that another
// node has moved, made before this mount read the move's lines, lands in
// the directory at its new place; the mount then notes the moved tree
// again, so the other node's mount, which had listed the new place, lists
// the new entry too. On one disk the other node is a second mount of its
// own Workspace; with LOOMFS_DFS_ROOTS=A,B (CI: two ceph-fuse clients of
// one CephFS) it is a mount through the second client.
func TestKeptDirMovedElsewhere(t *testing.T) {
	t.Run("one disk", func(t *testing.T) {
		e := newEnv(t)
		keptDirMovedElsewhere(t, e, secondMount(t, e), e.host)
	})
	ra, rb, ok := strings.Cut(os.Getenv("LOOMFS_DFS_ROOTS"), ",")
	if !ok {
		return
	}
	t.Run("two ceph-fuse clients", func(t *testing.T) {
		name := "kept-dir-" + strconv.FormatInt(time.Now().UnixNano(), 36)
		// Removed last, through the client that moved the tree.
		t.Cleanup(func() { os.RemoveAll(filepath.Join(rb, name)) })
		e := newEnv(t, withRoot(filepath.Join(ra, name)))
		ws2 := workspaceOn(t, store.Config{Root: filepath.Join(rb, name)}, nil)
		mnt2 := mountAt(t, ws2, filepath.Join(t.TempDir(), "mnt2"), Options{}, nil)
		keptDirMovedElsewhere(t, e, mnt2, e.host)
	})
}

// keptDirMovedElsewhere is TestKeptDirMovedElsewhere with e's mount as this
// node, mnt2 the other node's mount of the same scope, and host the path
// of an entry in the backing store as this node sees it.
func keptDirMovedElsewhere(t *testing.T, e *env, mnt2 string, host func(string) string) {
	f := e.m.fsys
	quiet(t, e)
	mustMkdir(t, e.path("d"))
	mustWrite(t, e.path("d/first"), "1")
	seen(t, "the first file through the second mount", func() error { return wantContent(mnt2+"/d/first", "1") })

	// This mount reads no journal until the test lets it: the window
	// between another node's change and the poll that reads it.
	fl := e.m.follower
	fl.mu.Lock()
	locked := true
	defer func() {
		if locked {
			fl.mu.Unlock()
		}
	}()
	if err := os.Rename(mnt2+"/d", mnt2+"/e"); err != nil {
		t.Fatal(err)
	}
	if names, err := readNames(mnt2 + "/e"); err != nil || !slices.Equal(names, []string{"first"}) {
		t.Fatalf("the moved directory through the second mount: %v, %v", names, err)
	}
	// The other mount's kernel keeps this failed lookup too.
	if _, err := os.Lstat(mnt2 + "/e/late"); !os.IsNotExist(err) {
		t.Fatalf("e/late through the second mount before it is made: %v", err)
	}
	before := f.kept.opens.Load()
	// After the create of d/first the kernel asks for d's attributes
	// again before this create (default_permissions): they come from the
	// kept descriptor too, not from d's path, which holds nothing now.
	if err := os.WriteFile(e.path("d/late"), []byte("2"), 0o600); err != nil {
		t.Fatal(err)
	}
	if f.kept.opens.Load() == before {
		t.Fatal("the create after the other node's move did not use the kept directory")
	}
	if err := wantContent(host("e/late"), "2"); err != nil {
		t.Fatalf("a create through the kept directory after another node moved it: %v", err)
	}
	fl.mu.Unlock()
	locked = false

	seen(t, "the entry made in the moved directory, through the other mount", func() error {
		if err := wantContent(mnt2+"/e/late", "2"); err != nil {
			return err
		}
		names, err := readNames(mnt2 + "/e")
		if err != nil {
			return err
		}
		if !slices.Contains(names, "late") {
			return fmt.Errorf("e lists %v", names)
		}
		return nil
	})
}

// quiet waits until the mount's follower has read every line the other
// writers have written and no more come.
func quiet(t *testing.T, e *env) {
	t.Helper()
	f := e.m.fsys
	for range 100 {
		e.m.follower.catchUp()
		drops := f.drops.Load()
		time.Sleep(50 * time.Millisecond)
		e.m.follower.catchUp()
		if f.drops.Load() == drops {
			return
		}
	}
	t.Fatal("the other writers never went quiet")
}

func readNames(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	var names []string
	for _, de := range entries {
		names = append(names, de.Name())
	}
	return names, err
}

// TestEchoed: a mount echoes the trees other writers moved, removed or
// restored, not another mount's echo of one.
func TestEchoed(t *testing.T) {
	for _, tc := range []struct {
		op, src string
		want    bool
	}{
		{store.OpTree, store.SourceProjection, true},
		{store.OpRename, store.SourceProjection, false},
		{store.OpTree, store.SourceTool, false},
		{store.OpTree, store.SourcePlatform, false},
	} {
		c := store.JournalChange{Path: "d", Subtree: true, Change: store.Change{Op: tc.op, Source: tc.src}}
		if got := echoed(c); got != tc.want {
			t.Errorf("echoed(%s from %s) = %v, want %v", tc.op, tc.src, got, tc.want)
		}
	}
}
