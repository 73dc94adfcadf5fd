package store_test

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// plantedTestCases are objects someone other than loomfs put into the
// backing store (SPEC §3.2). Each is shown for what it is and refused on
// use, by every operation of storeOps.
var plantedTestCases = []struct {
	name string
	rel  string
	// kind is what a listing shows for rel; middle cases (a symlinked
	// directory in the middle of rel) have nothing to list.
	kind   policy.Kind
	middle bool
	want   policy.Code
}{
	{name: "symlink leaving the scope", rel: "link-out", kind: policy.KindSymlink, want: policy.SymlinkRefused},
	{name: "symlink leaving the scope by a relative target", rel: "link-out-rel", kind: policy.KindSymlink, want: policy.SymlinkRefused},
	{name: "symlink staying inside the scope", rel: "link-in", kind: policy.KindSymlink, want: policy.SymlinkRefused},
	{name: "symlink to a directory inside the scope", rel: "link-dir", kind: policy.KindSymlink, want: policy.SymlinkRefused},
	{name: "symlink to a directory outside the scope", rel: "link-dir-out", kind: policy.KindSymlink, want: policy.SymlinkRefused},
	{name: "symlinked middle directory", rel: "link-dir/inner", middle: true, want: policy.SymlinkRefused},
	{name: "symlinked middle directory leaving the scope", rel: "link-dir-out/inner", middle: true, want: policy.SymlinkRefused},
	{name: "symlinked middle directory deeper", rel: "realdir/link-up/realdir/inner", middle: true, want: policy.SymlinkRefused},
	{name: "hardlink to a file outside the scope", rel: "hardlink-out", kind: policy.KindRegular, want: policy.HardlinkRefused},
	{name: "hardlinked pair inside the scope", rel: "pair-a", kind: policy.KindRegular, want: policy.HardlinkRefused},
	{name: "FIFO", rel: "fifo", kind: policy.KindFIFO, want: policy.SpecialFileRefused},
	{name: "Unix socket", rel: "socket", kind: policy.KindSocket, want: policy.SpecialFileRefused},
	{name: "device node", rel: "device", kind: policy.KindDevice, want: policy.SpecialFileRefused},
	{name: "setuid file", rel: "setuid", kind: policy.KindRegular, want: policy.PermissionDenied},
}

// storeOps are the workspace operations that take a path.
var storeOps = []struct {
	name string
	run  func(ctx context.Context, ws *store.Workspace, rel string) error
}{
	{"ReadFile", func(ctx context.Context, ws *store.Workspace, rel string) error {
		_, _, err := ws.ReadFile(ctx, rel)
		return err
	}},
	{"WriteFile", func(ctx context.Context, ws *store.Workspace, rel string) error {
		_, err := ws.WriteFile(ctx, rel, []byte("overwritten"), nil)
		return err
	}},
	{"WriteFile must not exist", func(ctx context.Context, ws *store.Workspace, rel string) error {
		_, err := ws.WriteFile(ctx, rel, []byte("overwritten"), ptr(""))
		return err
	}},
	{"WriteFile expected sha256", func(ctx context.Context, ws *store.Workspace, rel string) error {
		_, err := ws.WriteFile(ctx, rel, []byte("overwritten"), ptr(sha([]byte("outside secret"))))
		return err
	}},
	{"Remove", func(ctx context.Context, ws *store.Workspace, rel string) error {
		return ws.Remove(ctx, rel, nil)
	}},
	{"Remove expected sha256", func(ctx context.Context, ws *store.Workspace, rel string) error {
		return ws.Remove(ctx, rel, ptr(sha([]byte("outside secret"))))
	}},
	{"HashFile", func(ctx context.Context, ws *store.Workspace, rel string) error {
		_, err := ws.HashFile(rel)
		return err
	}},
	{"Open for read", func(ctx context.Context, ws *store.Workspace, rel string) error {
		f, _, err := ws.Open(policy.OpRead, rel, unix.O_RDONLY)
		if err == nil {
			f.Close()
		}
		return err
	}},
	{"Open for write", func(ctx context.Context, ws *store.Workspace, rel string) error {
		f, _, err := ws.Open(policy.OpWrite, rel, unix.O_WRONLY)
		if err == nil {
			f.Close()
		}
		return err
	}},
	{"OpenPath for setattr", func(ctx context.Context, ws *store.Workspace, rel string) error {
		fd, _, err := ws.OpenPath(policy.OpSetattr, rel)
		if err == nil {
			unix.Close(fd)
		}
		return err
	}},
	{"ReadDir", func(ctx context.Context, ws *store.Workspace, rel string) error {
		_, err := ws.ReadDir(ctx, rel)
		return err
	}},
	{"Walk", func(ctx context.Context, ws *store.Workspace, rel string) error {
		return ws.Walk(ctx, rel, func(string, store.Info) error { return nil })
	}},
}

// plant lays out the scope of TestPlantedObjects and returns the outside
// directory every escape would reach.
func plant(t *testing.T, e *testEnv, sc store.Scope) (outside string) {
	t.Helper()
	s := e.dir(sc)
	outside = filepath.Join(e.root, "outside")
	mkfile(t, filepath.Join(outside, "secret"), "outside secret")
	mkfile(t, filepath.Join(outside, "dir", "inner"), "outside secret")

	mkfile(t, filepath.Join(s, "file"), "inside")
	mkfile(t, filepath.Join(s, "realdir", "inner"), "inner")
	symlink(t, filepath.Join(outside, "secret"), filepath.Join(s, "link-out"))
	up, err := filepath.Rel(s, filepath.Join(outside, "secret"))
	if err != nil {
		t.Fatal(err)
	}
	symlink(t, up, filepath.Join(s, "link-out-rel"))
	symlink(t, "file", filepath.Join(s, "link-in"))
	symlink(t, "realdir", filepath.Join(s, "link-dir"))
	symlink(t, filepath.Join(outside, "dir"), filepath.Join(s, "link-dir-out"))
	symlink(t, "..", filepath.Join(s, "realdir", "link-up"))
	hardlink(t, filepath.Join(outside, "secret"), filepath.Join(s, "hardlink-out"))
	mkfile(t, filepath.Join(s, "pair-a"), "pair")
	hardlink(t, filepath.Join(s, "pair-a"), filepath.Join(s, "pair-b"))
	mkfifo(t, filepath.Join(s, "fifo"))
	mksocket(t, filepath.Join(s, "socket"))
	mkdev(t, filepath.Join(s, "device"))
	mkfile(t, filepath.Join(s, "setuid"), "#!/bin/sh\n")
	if err := unix.Chmod(filepath.Join(s, "setuid"), 0o4700); err != nil {
		t.Fatal(err)
	}
	return outside
}

func TestPlantedObjects(t *testing.T) {
	e := newEnv(t)
	ws := e.open(t, mainScope, nil)
	outside := plant(t, e, mainScope)
	s := e.dir(mainScope)
	outsideTree := treeOf(t, outside)
	secretHash := fileHash(t, filepath.Join(outside, "secret"))

	forEachResolver(t, func(t *testing.T) {
		ctx := context.Background()
		for _, tc := range plantedTestCases {
			t.Run(tc.name, func(t *testing.T) {
				var before unix.Stat_t
				if err := unix.Lstat(filepath.Join(s, tc.rel), &before); err != nil && !tc.middle {
					t.Fatal(err)
				}
				for _, op := range storeOps {
					within(t, 5*time.Second, op.name+" "+tc.rel, func() {
						codeIs(t, op.name+"("+tc.rel+")", op.run(ctx, ws, tc.rel), tc.want)
					})
					// Refused means untouched: still the same object.
					var after unix.Stat_t
					if err := unix.Lstat(filepath.Join(s, tc.rel), &after); !tc.middle && (err != nil || after.Ino != before.Ino || after.Mode != before.Mode || after.Size != before.Size) {
						t.Errorf("after %s the object at %s changed: %v", op.name, tc.rel, err)
					}
				}
				// Stat shows it for what it is.
				info, err := ws.Lstat(tc.rel)
				if tc.middle {
					codeIs(t, "Lstat("+tc.rel+")", err, tc.want)
				} else if err != nil || info.Kind != tc.kind {
					t.Errorf("Lstat(%s) = %v kind %s; want kind %s", tc.rel, err, info.Kind, tc.kind)
				}
			})
		}

		t.Run("ReadDir lists them for what they are", func(t *testing.T) {
			var entries []store.Info
			within(t, 5*time.Second, "ReadDir", func() {
				var err error
				entries, err = ws.ReadDir(ctx, ".")
				if err != nil {
					t.Error(err)
				}
			})
			got := map[string]store.Info{}
			for _, in := range entries {
				got[in.Name] = in
			}
			for _, tc := range plantedTestCases {
				if tc.middle {
					continue
				}
				in, ok := got[tc.rel]
				if !ok {
					t.Errorf("ReadDir(.) does not list %s", tc.rel)
					continue
				}
				if in.Kind != tc.kind {
					t.Errorf("ReadDir(.) lists %s as %s, want %s", tc.rel, in.Kind, tc.kind)
				}
			}
			if in := got["hardlink-out"]; in.Nlink != 2 {
				t.Errorf("hardlink-out listed with nlink %d, want 2", in.Nlink)
			}
			if in := got["realdir"]; in.Kind != policy.KindDir {
				t.Errorf("realdir listed as %s", in.Kind)
			}
		})

		t.Run("Walk never descends a symlinked directory", func(t *testing.T) {
			var seen []string
			within(t, 5*time.Second, "Walk", func() {
				err := ws.Walk(ctx, ".", func(rel string, info store.Info) error {
					seen = append(seen, rel)
					return nil
				})
				if err != nil {
					t.Error(err)
				}
			})
			if !slices.Contains(seen, "realdir/inner") || !slices.Contains(seen, "realdir/link-up") {
				t.Errorf("Walk missed the real directory's entries: %q", seen)
			}
			for _, p := range seen {
				if strings.HasPrefix(p, "link-dir/") || strings.HasPrefix(p, "link-dir-out/") || strings.HasPrefix(p, "realdir/link-up/") {
					t.Errorf("Walk descended a symlinked directory: %s", p)
				}
			}
		})
	})

	if got := treeOf(t, outside); got != outsideTree {
		t.Errorf("the outside tree changed:\nbefore\n%s\nafter\n%s", outsideTree, got)
	}
	if got := fileHash(t, filepath.Join(outside, "secret")); got != secretHash {
		t.Errorf("the outside secret changed")
	}
}

// escapeTestCases are paths that leave the scope. The store takes paths
// already cleaned by policy, but it is the last line: it must refuse these
// on its own too, with every operation.
var escapeTestCases = []struct {
	name string
	rel  string
}{
	{"dot-dot component alone", ".."},
	{"dot-dot component at the start", "../outside"},
	{"dot-dot component leading to the secret", "../../../../../../../outside/secret"},
	{"dot-dot component after a real directory", "realdir/../.."},
	{"dot-dot component at the end", "realdir/../../x"},
	{"absolute path", "/etc/passwd"},
	{"absolute path to the outside", "/outside/secret"},
}

func TestStoreRefusesEscapes(t *testing.T) {
	e := newEnv(t)
	ws := e.open(t, mainScope, nil)
	s := e.dir(mainScope)
	mkfile(t, filepath.Join(s, "realdir", "inner"), "inner")
	outside := filepath.Join(e.root, "outside")
	mkfile(t, filepath.Join(outside, "secret"), "outside secret")
	rootTree := treeOf(t, e.root)

	forEachResolver(t, func(t *testing.T) {
		ctx := context.Background()
		for _, tc := range escapeTestCases {
			t.Run(tc.name, func(t *testing.T) {
				for _, op := range storeOps {
					err := op.run(ctx, ws, tc.rel)
					if err == nil {
						t.Errorf("%s(%q) succeeded; a path leaving the scope must be refused", op.name, tc.rel)
					}
				}
				if _, err := ws.Lstat(tc.rel); err == nil {
					t.Errorf("Lstat(%q) succeeded; a path leaving the scope must be refused", tc.rel)
				}
				if _, err := ws.Mkdir(ctx, tc.rel, true); err == nil {
					t.Errorf("Mkdir(%q) succeeded", tc.rel)
				}
			})
		}
	})
	if got := treeOf(t, e.root); got != rootTree {
		t.Errorf("the volume changed:\nbefore\n%s\nafter\n%s", rootTree, got)
	}
}
