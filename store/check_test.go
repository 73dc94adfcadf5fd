package store_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/store"
)

func checkNames(r *store.CheckReport) []string {
	var out []string
	for _, c := range r.Checks {
		out = append(out, c.Name)
	}
	return out
}

func failed(r *store.CheckReport) []string {
	var out []string
	for _, c := range r.Checks {
		if !c.OK {
			out = append(out, c.Name+": "+c.Detail)
		}
	}
	return out
}

// TestCheck: the deployment check (SPEC §7.1) on good and bad roots. It
// never creates a missing root or marker; the probe leaves nothing behind;
// single_node is always claimed and advisory_lock_local only when the probe
// showed it.
func TestCheck(t *testing.T) {
	probeChecks := []string{"root", "marker", "writable", "audit", "probe_namespace", "probe_file_ops", "probe_atomic_replace", "probe_lock", "probe_cleanup"}
	tests := []struct {
		name       string
		setup      func(t *testing.T, root string) // nil: root missing
		opts       store.CheckOptions              // Root is filled in
		ok         bool
		shared     bool
		lock       bool
		checks     []string // names, in order
		failing    string   // the check that fails, if !ok
		mentioning string
	}{
		{name: "good shared root", setup: goodShared, opts: store.CheckOptions{Backend: store.BackendSharedPOSIX, VolumeID: volID},
			ok: true, shared: true, checks: []string{"root", "marker", "writable", "audit"}},
		{name: "good shared root with probe", setup: goodShared, opts: store.CheckOptions{Backend: store.BackendSharedPOSIX, VolumeID: volID, Probe: true},
			ok: true, shared: true, lock: true, checks: probeChecks},
		{name: "probe where .agentloom-locks exists", setup: func(t *testing.T, root string) {
			goodShared(t, root)
			mkfile(t, filepath.Join(root, store.LocksDir, "0123", store.LockFile), "")
		}, opts: store.CheckOptions{Backend: store.BackendSharedPOSIX, VolumeID: volID, Probe: true}, ok: true, shared: true, lock: true, checks: probeChecks},
		{name: "root missing", opts: store.CheckOptions{Backend: store.BackendSharedPOSIX, VolumeID: volID, Probe: true},
			checks: []string{"root"}, failing: "root", mentioning: "never creates"},
		{name: "root is a file", setup: func(t *testing.T, root string) { mkfile(t, root, volID) },
			opts: store.CheckOptions{Backend: store.BackendSharedPOSIX, VolumeID: volID, Probe: true}, checks: []string{"root"}, failing: "root"},
		{name: "marker missing", setup: func(t *testing.T, root string) { mkdir(t, root) },
			opts: store.CheckOptions{Backend: store.BackendSharedPOSIX, VolumeID: volID, Probe: true}, checks: []string{"root", "marker"}, failing: "marker"},
		{name: "marker empty", setup: func(t *testing.T, root string) { mkfile(t, filepath.Join(root, store.VolumeMarker), "") },
			opts: store.CheckOptions{Backend: store.BackendSharedPOSIX, VolumeID: volID, Probe: true}, checks: []string{"root", "marker"}, failing: "marker"},
		{name: "wrong marker", setup: func(t *testing.T, root string) { mkfile(t, filepath.Join(root, store.VolumeMarker), "vol-other") },
			opts: store.CheckOptions{Backend: store.BackendSharedPOSIX, VolumeID: volID, Probe: true}, checks: []string{"root", "marker"}, failing: "marker", mentioning: "vol-other"},
		{name: "no volume id configured", setup: goodShared,
			opts: store.CheckOptions{Backend: store.BackendSharedPOSIX}, checks: []string{"root", "marker"}, failing: "marker"},
		{name: "local root, not claimed shared", setup: func(t *testing.T, root string) { mkdir(t, root) },
			opts: store.CheckOptions{Backend: store.BackendLocal, Probe: true}, ok: true, lock: true,
			checks: []string{"root", "writable", "audit", "probe_namespace", "probe_file_ops", "probe_atomic_replace", "probe_lock", "probe_cleanup"}},
		{name: "local root missing", opts: store.CheckOptions{Backend: store.BackendLocal}, checks: []string{"root"}, failing: "root"},
		{name: "unknown backend", setup: goodShared, opts: store.CheckOptions{Backend: "nfs"}, checks: []string{"backend"}, failing: "backend"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			parent := t.TempDir()
			root := filepath.Join(parent, "root")
			if tc.setup != nil {
				tc.setup(t, root)
			}
			before := treeOf(t, parent)
			opts := tc.opts
			opts.Root = root
			r := store.Check(context.Background(), opts)
			if r.OK != tc.ok || r.Shared != tc.shared || r.AdvisoryLockLocal != tc.lock || !r.SingleNode {
				t.Errorf("ok %v shared %v advisory_lock_local %v single_node %v; want %v %v %v true (failed: %v)",
					r.OK, r.Shared, r.AdvisoryLockLocal, r.SingleNode, tc.ok, tc.shared, tc.lock, failed(r))
			}
			if got := checkNames(r); !slices.Equal(got, tc.checks) {
				t.Errorf("checks %v; want %v", got, tc.checks)
			}
			if f := failed(r); tc.failing != "" && (len(f) != 1 || !strings.HasPrefix(f[0], tc.failing+":") || !strings.Contains(f[0], tc.mentioning)) {
				t.Errorf("failed checks %v; want only %s, mentioning %q", f, tc.failing, tc.mentioning)
			}
			if got := treeOf(t, parent); got != before {
				t.Errorf("check changed the tree:\nbefore\n%s\nafter\n%s", before, got)
			}
			for _, k := range []string{"single_node", "advisory_lock_local"} {
				if r.Meaning[k] == "" {
					t.Errorf("the report does not say what %s means", k)
				}
			}
		})
	}
	t.Run("no root given", func(t *testing.T) {
		wd, _ := os.Getwd()
		before := treeOf(t, wd)
		r := store.Check(context.Background(), store.CheckOptions{Backend: store.BackendLocal, Probe: true})
		if r.OK || !slices.Equal(checkNames(r), []string{"root"}) {
			t.Errorf("check without a root: ok %v, checks %v; it never picks a default", r.OK, checkNames(r))
		}
		if got := treeOf(t, wd); got != before {
			t.Errorf("check without a root created something in the working directory")
		}
	})
}

func goodShared(t *testing.T, root string) {
	mkfile(t, filepath.Join(root, store.VolumeMarker), volID+"\n")
}

// TestCheckReadOnlyRoot: a root this node can't write fails "writable",
// and the probe is not attempted.
func TestCheckReadOnlyRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a read-only bind mount needs root")
	}
	src := filepath.Join(t.TempDir(), "src")
	goodShared(t, src)
	ro := filepath.Join(t.TempDir(), "ro")
	mkdir(t, ro)
	if err := unix.Mount(src, ro, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind mount: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(ro, unix.MNT_DETACH) })
	if err := unix.Mount("", ro, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
		t.Fatalf("remount read-only: %v", err)
	}
	r := store.Check(context.Background(), store.CheckOptions{Backend: store.BackendSharedPOSIX, Root: ro, VolumeID: volID, Probe: true})
	if r.OK || r.Writable || r.AdvisoryLockLocal {
		t.Errorf("read-only root: ok %v writable %v advisory_lock_local %v", r.OK, r.Writable, r.AdvisoryLockLocal)
	}
	if got := checkNames(r); !slices.Equal(got, []string{"root", "marker", "writable"}) {
		t.Errorf("checks %v", got)
	}
}

// TestProbesInParallel: probes from several processes of a node (or
// several nodes) at once each work in their own namespace.
func TestProbesInParallel(t *testing.T) {
	root := filepath.Join(t.TempDir(), "root")
	goodShared(t, root)
	mkdir(t, filepath.Join(root, store.LocksDir))
	before := treeOf(t, root)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := store.Check(context.Background(), store.CheckOptions{Backend: store.BackendSharedPOSIX, Root: root, VolumeID: volID, Probe: true})
			if !r.OK || !r.AdvisoryLockLocal {
				t.Errorf("parallel probe failed: %v", failed(r))
			}
		}()
	}
	wg.Wait()
	if got := treeOf(t, root); got != before {
		t.Errorf("probes left something:\nbefore\n%s\nafter\n%s", before, got)
	}
}

// TestProbeRenameNoReplace: the probe tries RENAME_NOREPLACE onto a new
// name (onto an existing one the kernel answers from its own cache) and
// says which way exclusive creates go; both ways pass.
func TestProbeRenameNoReplace(t *testing.T) {
	for _, tc := range []struct {
		name    string
		refused bool
		detail  string
	}{
		{"renameat2 works", false, "RENAME_NOREPLACE works"},
		{"renameat2 refused", true, "no RENAME_NOREPLACE here"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.refused {
				store.RefuseRenameNoReplace(t)
			}
			root := filepath.Join(t.TempDir(), "root")
			goodShared(t, root)
			r := store.Check(context.Background(), store.CheckOptions{Root: root, Backend: store.BackendSharedPOSIX, VolumeID: volID, Probe: true})
			if !r.OK {
				t.Fatalf("check failed: %v", failed(r))
			}
			for _, c := range r.Checks {
				if c.Name == "probe_atomic_replace" && !strings.Contains(c.Detail, tc.detail) {
					t.Errorf("probe_atomic_replace says %q; want it to mention %q", c.Detail, tc.detail)
				}
			}
		})
	}
}

// TestMountType: the filesystem type comes from the mount table, which
// names a FUSE filesystem ("fuse.ceph-fuse") where statfs says only "fuse".
func TestMountType(t *testing.T) {
	const mountinfo = `22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
90 22 0:52 / /mnt/a rw,nosuid,nodev,relatime shared:50 - fuse.ceph-fuse ceph-fuse rw,user_id=0
91 22 0:53 / /mnt/b rw,relatime - nfs4 srv:/export rw,vers=4.1
92 22 8:1 /srv /mnt/bind rw,relatime shared:1 - ext4 /dev/sda1 rw
`
	for _, tc := range []struct {
		major, minor uint32
		want         string
	}{
		{0, 52, "fuse.ceph-fuse"},
		{0, 53, "nfs4"},
		{8, 1, "ext4"},
		{0, 99, ""},
	} {
		if got := store.MountTypeOf(mountinfo, tc.major, tc.minor); got != tc.want {
			t.Errorf("device %d:%d: type %q, want %q", tc.major, tc.minor, got, tc.want)
		}
	}
	for _, tc := range []struct {
		major, minor uint32
		want         []string
	}{
		{0, 52, []string{"/mnt/a"}},
		{8, 1, []string{"/", "/mnt/bind"}},
		{0, 54, []string{"/mnt/with space"}},
		{0, 99, nil},
	} {
		info := mountinfo + `93 22 0:54 / /mnt/with\040space rw - fuse.ceph-fuse ceph-fuse rw` + "\n"
		if got := store.MountPointsOf(info, tc.major, tc.minor); !slices.Equal(got, tc.want) {
			t.Errorf("device %d:%d: mount points %q, want %q", tc.major, tc.minor, got, tc.want)
		}
	}
	root := filepath.Join(t.TempDir(), "root")
	goodShared(t, root)
	r := store.Check(context.Background(), store.CheckOptions{Root: root, Backend: store.BackendSharedPOSIX, VolumeID: volID})
	if r.Filesystem == "" || strings.HasPrefix(r.Filesystem, "unknown") {
		t.Errorf("filesystem of a temporary directory: %q", r.Filesystem)
	}
}

// TestProbePeer: --peer probes the volume through a second path too. A
// second mount of the same directory passes; a path that holds another
// copy of the volume fails, since it never sees the probe's files.
func TestProbePeer(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a second mount needs root")
	}
	base := t.TempDir()
	root, bind, other := filepath.Join(base, "root"), filepath.Join(base, "bind"), filepath.Join(base, "other")
	goodShared(t, root)
	goodShared(t, other)
	mkdir(t, bind)
	if err := unix.Mount(root, bind, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(bind, unix.MNT_DETACH) })
	for _, tc := range []struct {
		name, peer string
		ok         bool
		mentioning string
	}{
		{"the same volume at a second mount", bind, true, "lost nothing"},
		{"another directory with the same marker", other, false, "does not see"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := store.Check(context.Background(), store.CheckOptions{Root: root, Backend: store.BackendSharedPOSIX, VolumeID: volID, Probe: true, Peer: tc.peer})
			var peer *store.CheckItem
			for i := range r.Checks {
				if r.Checks[i].Name == "probe_peer" {
					peer = &r.Checks[i]
				}
			}
			if peer == nil || peer.OK != tc.ok || r.OK != tc.ok || !strings.Contains(peer.Detail, tc.mentioning) {
				t.Fatalf("probe_peer %+v, ok %v; want ok %v mentioning %q (failed: %v)", peer, r.OK, tc.ok, tc.mentioning, failed(r))
			}
			if names := checkNames(r); names[len(names)-1] != "probe_cleanup" {
				t.Errorf("checks %v: the probe did not clean up last", names)
			}
		})
	}
	if ents, _ := os.ReadDir(filepath.Join(root, store.LocksDir)); len(ents) != 0 {
		t.Errorf("the probe left %v", ents)
	}
}
