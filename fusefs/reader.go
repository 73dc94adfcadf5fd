package fusefs

import (
	"context"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/policy"
)

// Files keep their OPEN: each open(2) comes to the daemon, which asks the
// policy, checks the object and counts what is read. What it need not do
// again is find the file. The first read-only open of a node that finds
// the node's own file keeps that descriptor with the node (a kept reader),
// and the node's next read-only opens share it: the policy is asked as
// before, and the object is described again from the descriptor and
// checked by the same rules as an open of its path (store.RecheckFD), one
// fstat where a walk of the path, two stats, an open, an fcntl and a close
// were seven system calls. A warm rg, a build reading its headers again,
// git reading the objects it just read: every open but the first of each
// file.
//
// A kept reader holds only while the node's file is known to be at its
// path, unchanged in kind: the follower drops it with whatever else it
// drops of the node for another writer's line (a replace, a removal, a
// change in place), the mount drops it when it opens the node for writing,
// removes it or renames another file over it, and the kernel's FORGET
// drops it. A change behind loomfs's back (no journal line) is seen as the
// kernel's entries are: after the cache timeout, which bounds a kept
// reader's life too; a change of the file's contents, size or mode in
// place is seen at once, since every open describes the descriptor again.
// Only plain reads share one: an open for writing, of a mount with
// passthrough (the kernel binds a backing file to each open), or that
// reads a file which replaced the node's, opens the path as before. A
// flock needs an open file description of its own, and a shared open gets
// one at its first flock (handle.ownFD).
//
// Kept readers are open files in the daemon: at most maxKeptReaders per
// mount, a quarter of the process's descriptor limit across all its mounts
// (a worker serves many scopes in one process), and none on a volume on a
// network or FUSE filesystem, where an open file holds capabilities the
// server would have to recall from this client for another client's write
// (CephFS) or a delegation (NFS).
type keptReader struct {
	fd    int
	since time.Time
	// refs counts the node's hold (until dropped) and every handle
	// sharing fd; the last one closes it.
	refs atomic.Int32
}

// maxKeptReaders bounds the descriptors a mount keeps for reading: Go's
// source tree is 11,500 files, a node_modules often more.
const maxKeptReaders = 1 << 16

// keptReaders counts a mount's kept readers and closes them at unmount.
type keptReaders struct {
	mu    sync.Mutex
	nodes map[*node]struct{} // nil when the mount keeps none
}

// keptInProcess counts the kept readers of every mount of the process,
// which may hold a quarter of its descriptor limit.
var (
	keptInProcess     atomic.Int64
	keptProcessLimit  int64
	keptProcessLimits sync.Once
)

func processKeepLimit() int64 {
	keptProcessLimits.Do(func() {
		var rl unix.Rlimit
		if unix.Getrlimit(unix.RLIMIT_NOFILE, &rl) == nil {
			keptProcessLimit = int64(rl.Cur / 4)
		}
	})
	return keptProcessLimit
}

// newKeptReaders returns the mount's account of kept readers: none for a
// scope whose directory, fd, is on a network or FUSE filesystem.
func newKeptReaders(dirfd int) *keptReaders {
	k := &keptReaders{}
	var st unix.Statfs_t
	if unix.Fstatfs(dirfd, &st) != nil || remoteFS(&st) {
		return k
	}
	k.nodes = map[*node]struct{}{}
	return k
}

// remoteFS reports whether st is of a filesystem whose every call is a
// request to another process or machine: a FUSE client such as ceph-fuse
// or glusterfs, NFS, CephFS's or SMB's kernel client.
func remoteFS(st *unix.Statfs_t) bool {
	switch uint32(st.Type) {
	case unix.FUSE_SUPER_MAGIC, unix.NFS_SUPER_MAGIC, unix.CEPH_SUPER_MAGIC,
		unix.SMB2_SUPER_MAGIC, unix.CIFS_SUPER_MAGIC:
		return true
	}
	return false
}

// keep makes fd, the node's own file opened read-only, n's kept reader,
// shared by the handle that opened it, if the mount keeps readers and n
// has none. It returns the reader the handle then shares, or nil when the
// handle keeps fd to itself.
func (k *keptReaders) keep(n *node, fd int) *keptReader {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.nodes == nil || len(k.nodes) >= maxKeptReaders || n.reader.Load() != nil ||
		keptInProcess.Load() >= processKeepLimit() {
		return nil
	}
	keptInProcess.Add(1)
	r := &keptReader{fd: fd, since: time.Now()}
	r.refs.Store(2) // the node's and the handle's
	n.reader.Store(r)
	k.nodes[n] = struct{}{}
	return r
}

// closeAll drops every kept reader (the mount is going); handles still
// sharing one close it at their release.
func (k *keptReaders) closeAll() {
	k.mu.Lock()
	nodes := k.nodes
	k.nodes = nil
	k.mu.Unlock()
	for n := range nodes {
		if r := n.reader.Swap(nil); r != nil {
			r.release()
		}
	}
}

// release gives back one reference; the last closes the file.
func (r *keptReader) release() {
	if r.refs.Add(-1) == 0 {
		unix.Close(r.fd)
		keptInProcess.Add(-1)
	}
}

// acquire takes a reference for a new open, unless the reader was
// released for good meanwhile.
func (r *keptReader) acquire() bool {
	for {
		c := r.refs.Load()
		if c <= 0 {
			return false
		}
		if r.refs.CompareAndSwap(c, c+1) {
			return true
		}
	}
}

// dropReader ends n's kept reader, if it has one: the handles that share
// it keep it until their release.
func (n *node) dropReader() {
	r := n.reader.Swap(nil)
	if r == nil {
		return
	}
	k := n.fsys.readers
	k.mu.Lock()
	if k.nodes != nil {
		delete(k.nodes, n)
	}
	k.mu.Unlock()
	r.release()
}

// keptReader returns n's kept reader with a reference for the caller, nil
// when it has none or it outlived the cache timeout (then dropped).
func (n *node) keptReader() *keptReader {
	r := n.reader.Load()
	if r == nil {
		return nil
	}
	if time.Since(r.since) > n.fsys.timeout {
		n.dropReader()
		return nil
	}
	if !r.acquire() {
		return nil
	}
	return r
}

// OnForget drops the kept reader of a node the kernel forgot.
func (n *node) OnForget() { n.dropReader() }

// openKept serves a read-only open of n from its kept reader; ok is false
// when n has none that still holds, and the path must be opened.
func (n *node) openKept(ctx context.Context, ev audit.Event, rel string, flags uint32, want policy.Access) (h *handle, fuseFlags uint32, e syscall.Errno, ok bool) {
	r := n.keptReader()
	if r == nil {
		return nil, 0, 0, false
	}
	f := n.fsys
	sx, err := f.ws.RecheckFD(policy.OpRead, rel, r.fd)
	if err != nil {
		// Changed behind loomfs's back: the open of the path answers.
		r.release()
		n.dropReader()
		return nil, 0, 0, false
	}
	n.perm.Store(uint32(sx.Mode) & 0o7777)
	if err := f.access(ctx, rel, objectOf(&sx), want); err != nil {
		r.release()
		return nil, 0, f.refused(ctx, ev, err), true
	}
	h, fuseFlags = newSharedHandle(n, r.fd, r, rel, flags, false, false)
	keep := n.keepCache(&sx, flags)
	h.keptPages = keep != 0
	f.readerOpens.Add(1)
	return h, fuseFlags | keep, 0, true
}
