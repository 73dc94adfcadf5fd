package quota_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/quota"
)

// smallTmpfs mounts a tmpfs of size bytes for the test, or skips without
// privilege.
func smallTmpfs(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+size+",mode=0700"); err != nil {
		t.Skipf("cannot mount tmpfs (needs root): %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// fill writes into a file at path until the volume refuses.
func fill(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, unix.ENOSPC) {
				t.Fatalf("filling the volume: %v", err)
			}
			return
		}
	}
}

// A holder joining an account on a full volume is refused with ENOSPC; it
// used to map its record sparse and die of SIGBUS at the first store into
// it. Once space comes back, it joins.
func TestOpenOnFullVolume(t *testing.T) {
	root := smallTmpfs(t, "256k")
	dir := openDir(t, root)
	sc := &scope{}
	opts := quota.Options{Limits: limits(1<<20, 100), Walk: sc.walk, Idle: time.Hour}
	// The ledger exists before the volume fills, as on a running node.
	first := open(t, dir, opts)
	if err := first.Reserve(context.Background(), 10, 1); err != nil {
		t.Fatal(err)
	}
	filler := filepath.Join(root, "filler")
	fill(t, filler)

	a, err := quota.Open(dir, opts)
	if err == nil {
		a.Close()
		t.Fatal("Open on a full volume succeeded")
	}
	if !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("Open on a full volume: %v, want ENOSPC", err)
	}
	// Nothing of the refused holder is left behind.
	ents, _ := os.ReadDir(root)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "t-") {
			t.Errorf("left behind: %s", e.Name())
		}
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	a = open(t, dir, opts)
	if err := a.Reserve(context.Background(), 10, 1); err != nil {
		t.Fatalf("Reserve once space came back: %v", err)
	}
}

// A holder's mapped record that loses its page (truncated under it, as
// another node or an I/O error can do) makes the next change an error in
// the record's write, never a SIGBUS; the account goes on counting.
func TestMappedRecordTruncated(t *testing.T) {
	root := t.TempDir()
	dir := openDir(t, root)
	sc := &scope{}
	a := open(t, dir, quota.Options{Limits: limits(1<<20, 100), Walk: sc.walk, Idle: time.Hour})
	lives, err := filepath.Glob(filepath.Join(root, "h-*.lock"))
	if err != nil || len(lives) != 1 {
		t.Fatalf("live records: %v %v", lives, err)
	}
	if err := os.Truncate(lives[0], 0); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := a.Reserve(context.Background(), 10, 1); err != nil {
			t.Fatalf("Reserve %d after the record was truncated: %v", i, err)
		}
	}
	u, err := a.Usage(context.Background())
	if err != nil || u.Bytes != 30 || u.Files != 3 {
		t.Fatalf("Usage = %+v, %v; want 30 bytes, 3 files", u, err)
	}
}
