package fusefs

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/agentloom/loomfs/policy"
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
