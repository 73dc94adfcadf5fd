package fusefs

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/agentloom/loomfs/policy"
)

// TestOpenlessDirs: under "cache: journal-dirs" the kernel is told once
// that it may open directories itself, and a warm listing of any
// directory then reaches the daemon not at all.
func TestOpenlessDirs(t *testing.T) {
	e := newEnv(t, withCache(policy.CacheKernelDirs))
	for _, d := range []string{"a", "b", "b/c"} {
		mustMkdir(t, e.path(d))
		mustWrite(t, e.path(d+"/f"), "x")
	}
	f := e.m.fsys
	for range 3 {
		for _, d := range []string{".", "a", "b", "b/c"} {
			if _, err := os.ReadDir(e.path(d)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := f.opendirs.Load(); n != 1 {
		t.Errorf("the kernel sent %d OPENDIRs for 12 listings of 4 directories, want 1 (answered ENOSYS)", n)
	}
	before := f.dirOpens.Load()
	for _, d := range []string{".", "a", "b", "b/c"} {
		if _, err := os.ReadDir(e.path(d)); err != nil {
			t.Fatal(err)
		}
	}
	if n := f.dirOpens.Load() - before; n != 0 {
		t.Errorf("warm listings of 4 directories opened %d backing directories, want 0", n)
	}
}

// TestOpendirKept: under "cache: journal" (the default) and "cache:
// strict" every opendir is the daemon's, and under strict each opens the
// backing directory.
func TestOpendirKept(t *testing.T) {
	for _, cache := range []policy.Cache{policy.CacheJournal, policy.CacheStrict} {
		t.Run(string(cache), func(t *testing.T) {
			e := newEnv(t, withCache(cache))
			mustMkdir(t, e.path("a"))
			for range 3 {
				if _, err := os.ReadDir(e.path("a")); err != nil {
					t.Fatal(err)
				}
			}
			if n := e.m.fsys.opendirs.Load(); n != 0 {
				t.Errorf("openlessDirs served a %s mount (%d OPENDIRs)", cache, n)
			}
			if n := e.m.fsys.dirOpens.Load(); cache == policy.CacheStrict && n < 3 {
				t.Errorf("%d backing opens for 3 listings under cache: strict, want 3 or more", n)
			}
		})
	}
}

// TestUnreadableDirOpen: an open of a directory its owner can't read is
// refused at the open, as on any disk (Python's os.fwalk counts on it):
// by the daemon under "cache: journal", by the kernel (default_permissions)
// by default, where no OPENDIR comes to the daemon. Without
// default_permissions a kernel-opened directory would open and only the
// read of its entries would fail.
func TestUnreadableDirOpen(t *testing.T) {
	for _, tc := range []struct {
		cache policy.Cache
		want  string
	}{
		{policy.CacheJournal, "open refused: 13"},
		{"", "open refused: 13"},
		{policy.CacheKernelDirs, "open refused: 13"},
	} {
		t.Run("cache="+string(tc.cache), func(t *testing.T) {
			e := newEnv(t, withCache(tc.cache), withOptions(func(o *Options) { o.AllowOther = true }))
			out, err := asUser(t, e.mnt, DefaultUID, `cd $W || exit 99
mkdir d && touch d/f && ls d >/dev/null && chmod 0300 d && python3 -c '
import os
try:
    fd = os.open("d", os.O_RDONLY | os.O_DIRECTORY)
except OSError as e:
    print("open refused:", e.errno)
else:
    try:
        os.listdir(fd)
        print("opened and read")
    except OSError as e:
        print("opened; read refused:", e.errno)
'`)
			if err != nil {
				t.Fatalf("as the sandbox user: %v\n%s", err, out)
			}
			if !strings.Contains(out, tc.want) {
				t.Errorf("want %q, got:\n%s", tc.want, out)
			}
		})
	}
}

// TestListWhileRemoving: a program that reads a large directory a batch
// at a time and removes each batch before it reads the next (rm -r,
// shutil.rmtree, a build's clean) sees every entry exactly once and
// leaves the directory empty: each read the kernel can't answer itself
// is served by a handle of its own, which goes on from the backing
// directory's own offset, not from a position the removals moved.
func TestListWhileRemoving(t *testing.T) {
	for _, tc := range []struct {
		cache policy.Cache
		warm  bool
	}{{policy.CacheJournal, false}, {policy.CacheJournal, true}, {policy.CacheKernelDirs, false}, {policy.CacheKernelDirs, true}} {
		warm := tc.warm
		t.Run(fmt.Sprintf("%s/warm=%v", tc.cache, warm), func(t *testing.T) {
			e := newEnv(t, withCache(tc.cache))
			const files = 3000
			if err := os.Mkdir(e.host("d"), 0o700); err != nil {
				t.Fatal(err)
			}
			for i := range files {
				if err := os.WriteFile(e.host(fmt.Sprintf("d/file-with-a-longish-name-%04d", i)), nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if warm {
				if err := wantEntries(e.path("d"), files); err != nil {
					t.Fatal(err)
				}
			}
			dir, err := os.Open(e.path("d"))
			if err != nil {
				t.Fatal(err)
			}
			defer dir.Close()
			seenNames := map[string]bool{}
			for {
				names, err := dir.Readdirnames(100)
				if len(names) == 0 {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				for _, name := range names {
					if seenNames[name] {
						t.Fatalf("%s listed twice", name)
					}
					seenNames[name] = true
					if err := os.Remove(e.path("d/" + name)); err != nil {
						t.Fatal(err)
					}
				}
			}
			if len(seenNames) != files {
				t.Errorf("listed %d of %d files while removing them", len(seenNames), files)
			}
			if err := os.Remove(e.path("d")); err != nil {
				t.Errorf("the directory is not empty after the listing: %v", err)
			}
		})
	}
}

// TestChmodDropsListing: a listing the kernel keeps is not served past a
// chmod that takes the read bit away, nor kept from the owner once it is
// given back, whether or not the kernel opens directories itself.
func TestChmodDropsListing(t *testing.T) {
	for _, cache := range []policy.Cache{policy.CacheJournal, policy.CacheKernelDirs} {
		t.Run(string(cache), func(t *testing.T) { testChmodDropsListing(t, cache) })
	}
}

func testChmodDropsListing(t *testing.T, cache policy.Cache) {
	e := newEnv(t, withCache(cache), withOptions(func(o *Options) { o.AllowOther = true }))
	out, err := asUser(t, e.mnt, DefaultUID, `cd $W || exit 99
mkdir d && touch d/f && ls d && chmod 0300 d && if ls d; then echo LISTED; fi
chmod 0700 d && ls d`)
	if err != nil {
		t.Fatalf("as the sandbox user: %v\n%s", err, out)
	}
	if strings.Contains(out, "LISTED") || !strings.Contains(out, "Permission denied") {
		t.Errorf("a directory without its read bit was listed:\n%s", out)
	}
	if strings.Count(out, "f\n") != 2 {
		t.Errorf("want the file listed before and after:\n%s", out)
	}
}

// TestFsyncDir: fsync of a directory reaches the backing directory, also
// where nothing opened it before the fsync: a listed directory's OPENDIR
// opens nothing on the backing store, and under journal-dirs there is no
// OPENDIR at all.
func TestFsyncDir(t *testing.T) {
	for _, cache := range []policy.Cache{policy.CacheJournal, policy.CacheKernelDirs} {
		t.Run(string(cache), func(t *testing.T) { testFsyncDir(t, cache) })
	}
}

func testFsyncDir(t *testing.T, cache policy.Cache) {
	e := newEnv(t, withCache(cache))
	mustMkdir(t, e.path("d"))
	mustWrite(t, e.path("d/f"), "x")
	if err := wantEntries(e.path("d"), 1); err != nil {
		t.Fatal(err)
	}
	before := e.m.fsys.dirOpens.Load()
	dir, err := os.Open(e.path("d"))
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	if e.m.fsys.dirOpens.Load() != before {
		t.Fatal("opening a listed directory opened the backing directory")
	}
	if err := dir.Sync(); err != nil {
		t.Fatalf("fsync of a directory: %v", err)
	}
	if e.m.fsys.dirOpens.Load() == before {
		t.Error("fsync of a directory opened no backing directory")
	}
}
