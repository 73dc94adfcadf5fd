package store_test

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// stall is a loopback FUSE filesystem whose lookups of one name don't
// answer until released: the kernel's wait for a metadata server that is
// waiting out a dead client, as on CephFS, made on demand.
type stall struct {
	mu      sync.Mutex
	name    string        // the name whose lookups stall; "" for none
	release chan struct{} // closed to answer them
}

func (s *stall) hold(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.name, s.release = name, make(chan struct{})
}

func (s *stall) let() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.release != nil {
		close(s.release)
	}
	s.name, s.release = "", nil
}

func (s *stall) wait(name string) {
	s.mu.Lock()
	held, release := s.name == name, s.release
	s.mu.Unlock()
	if held {
		<-release
	}
}

type stallNode struct {
	*fs.LoopbackNode
	s *stall
}

var (
	_ = (fs.NodeWrapChilder)((*stallNode)(nil))
	_ = (fs.NodeLookuper)((*stallNode)(nil))
)

func (n *stallNode) WrapChild(ctx context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	return &stallNode{LoopbackNode: ops.(*fs.LoopbackNode), s: n.s}
}

func (n *stallNode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	n.s.wait(name)
	return n.LoopbackNode.Lookup(ctx, name, out)
}

// mountStall serves dir at a new mountpoint through a stall, with no entry
// or attribute caching, so every resolution asks the filesystem.
func mountStall(t *testing.T, dir string) (string, *stall) {
	t.Helper()
	s := &stall{}
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	root := &fs.LoopbackRoot{Path: dir, Dev: uint64(st.Dev)}
	root.RootNode = &stallNode{LoopbackNode: &fs.LoopbackNode{RootData: root}, s: s}
	mnt := t.TempDir()
	zero := time.Duration(0)
	srv, err := fs.Mount(mnt, root.RootNode, &fs.Options{
		EntryTimeout: &zero, AttrTimeout: &zero, NegativeTimeout: &zero,
		MountOptions: fuse.MountOptions{FsName: "loomfs-stall-test"},
	})
	if err != nil {
		t.Skipf("no FUSE here: %v", err)
	}
	t.Cleanup(func() {
		s.let()
		// An unmount refused as busy for long means a file on it is
		// still open: something a call took was not given back. It is
		// tried again for a while, as a file's last close may still be
		// on its way.
		err := srv.Unmount()
		for end := time.Now().Add(2 * time.Second); err != nil && time.Now().Before(end); {
			time.Sleep(50 * time.Millisecond)
			err = srv.Unmount()
		}
		if err != nil {
			t.Errorf("unmount the stalling filesystem: %v", err)
			syscall.Unmount(mnt, syscall.MNT_DETACH) // leave no mount behind
		}
	})
	return mnt, s
}

// Every entry point that reaches the volume answers within its caller's
// budget even when a system call on the way waits in the kernel, and what
// it takes after answering is given back (SPEC §4: a blocked filesystem
// call is bounded by the caller's budget).
func TestStalledStorageBoundedByBudget(t *testing.T) {
	const budget = 300 * time.Millisecond
	sc := store.Scope{Space: "sp", Agent: "ag", Session: "se"}
	// Each call returns what it opened, closed by the test once the
	// storage answers again: a Close waits for a call stuck in the kernel.
	cases := []struct {
		name  string
		stall string // the name whose lookups stall
		call  func(ctx context.Context, root string) (closers, error)
	}{
		{"opening the volume (its marker)", store.VolumeMarker, func(ctx context.Context, root string) (closers, error) {
			v, err := store.OpenVolume(ctx, store.Config{Backend: store.BackendSharedPOSIX, Root: root, VolumeID: "v1"})
			if err != nil {
				return nil, err
			}
			return closers{v.Close}, nil
		}},
		{"opening the scope (its directory)", "main", func(ctx context.Context, root string) (closers, error) {
			v, err := store.OpenVolume(context.Background(), store.Config{Root: root})
			if err != nil {
				return nil, err
			}
			c := closers{v.Close}
			ws, err := v.Open(ctx, sc, nil)
			if err != nil {
				return c, err
			}
			return append(closers{ws.Close}, c...), nil
		}},
		{"the scope lock (its file)", store.LockFile, func(ctx context.Context, root string) (closers, error) {
			v, err := store.OpenVolume(context.Background(), store.Config{Root: root})
			if err != nil {
				return nil, err
			}
			c := closers{v.Close}
			ws, err := v.Open(context.Background(), sc, nil)
			if err != nil {
				return c, err
			}
			c = append(closers{ws.Close}, c...)
			unlock, err := ws.Lock(ctx)
			if err != nil {
				return c, err
			}
			unlock()
			return c, nil
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, store.VolumeMarker), []byte("v1\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			mnt, s := mountStall(t, dir)
			// Once through with nothing stalled: the directories and the
			// lock file exist, so what stalls next is a lookup of them.
			c, err := tc.call(context.Background(), mnt)
			if err != nil {
				t.Fatalf("unstalled: %v", err)
			}
			c.close()

			s.hold(tc.stall)
			ctx, cancel := context.WithTimeout(context.Background(), budget)
			defer cancel()
			start := time.Now()
			type answer struct {
				c   closers
				err error
			}
			got := make(chan answer, 1)
			go func() {
				c, err := tc.call(ctx, mnt)
				got <- answer{c, err}
			}()
			var a answer
			select {
			case a = <-got:
			case <-time.After(budget + 2*time.Second):
				s.let() // so the stuck call returns and the test ends
				t.Fatalf("stalled: no answer %v after a budget of %v", time.Since(start), budget)
			}
			took, stalled, err := time.Since(start), a.c, a.err
			if policy.CodeOf(err) != policy.Timeout {
				t.Fatalf("stalled: err = %v (code %q), want timeout", err, policy.CodeOf(err))
			}
			t.Logf("stalled: %v after %v: %v", policy.CodeOf(err), took.Round(time.Millisecond), err)

			// The stalled call completes once the storage answers; whatever
			// it took is given back, so the next caller is not held off.
			s.let()
			stalled.close()
			ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel2()
			c, err = tc.call(ctx2, mnt)
			if err != nil {
				t.Fatalf("after the stall: %v", err)
			}
			c.close()
		})
	}
}

type closers []func() error

func (c closers) close() {
	for _, f := range c {
		f()
	}
}
