package fusefs

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fs"
	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// follower keeps the kernel's caches of one mount coherent with the
// scope's change journals (store/journal.go): every line another writer
// (the tool door, another mount, another node) adds names a path whose
// entry, attributes, listing and pages the kernel then drops, so the next
// access comes to the mount. It reads through the store's own reader, woken
// by inotify on the journal directory when a writer on this node appends
// (the line is written before the change returns), and every poll interval
// otherwise: another node's lines raise no event here.
//
// A drop can wait in the kernel: invalidating a file's pages takes each
// page's lock, which a read or write of the file that this mount is
// serving holds until it is answered (on a slow backing store, seconds).
// So the mount never waits for the follower while its session is live
// (Mounted.Unmount halts it, ends the session, then waits), and a pass
// that finds the follower halted drops nothing more.
type follower struct {
	f    *fsys
	poll time.Duration

	// mu serialises the passes (catchUp): the loop's and a caller's.
	mu sync.Mutex

	// from is how far each journal file was read.
	from map[string]int64
	// size is each file's size at the last pass.
	size map[string]int64
	// doubted holds the files whose writer died without ending them: a
	// change it made may have no line, so everything was dropped once.
	doubted map[string]bool

	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once

	// passes counts the journal reads made; tests use it. The paths
	// dropped are counted in fsys.drops.
	passes int

	// others is the Workspace's JournalLinesExcept(mineSources...) when
	// the watch last woke the follower for its own file.
	others atomic.Uint64
	// read is when a pass last read the journals (Unix ns), for
	// Mounted.JournalRead.
	read atomic.Int64
}

// wakeGap is how long the follower waits after an inotify event before it
// reads, so the lines of a burst are read in one pass: the most a change
// made on this node waits to be seen, besides the pass itself.
const wakeGap = time.Millisecond

// passGap is the least time between two passes woken by inotify.
const passGap = 25 * time.Millisecond

func newFollower(f *fsys, poll time.Duration) *follower {
	return &follower{
		f:       f,
		poll:    poll,
		from:    map[string]int64{},
		size:    map[string]int64{},
		doubted: map[string]bool{},
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
}

// start reads where the journals end now (the kernel knows nothing yet)
// and follows them from there until close.
func (fl *follower) start() {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	if files, err := fl.f.ws.JournalOffsets(); err == nil {
		for _, jf := range files {
			fl.from[jf.Name] = jf.End
			if !jf.Trusted() {
				fl.doubted[jf.Name] = true
			}
		}
	}
	go fl.run(fl.watch())
}

// halt ends the follower's passes: one under way stops before its next
// drop. It does not wait.
func (fl *follower) halt() {
	fl.stopOnce.Do(func() { close(fl.stop) })
}

// halted reports whether halt was called.
func (fl *follower) halted() bool {
	select {
	case <-fl.stop:
		return true
	default:
		return false
	}
}

// close halts the follower and waits for it. A drop under way may wait
// for a request the mount serves (see follower): the session must be able
// to answer it, or be gone.
func (fl *follower) close() {
	fl.halt()
	<-fl.done
}

func (fl *follower) run(wake <-chan struct{}) {
	defer close(fl.done)
	t := time.NewTicker(fl.poll)
	defer t.Stop()
	var last time.Time
	for {
		select {
		case <-fl.stop:
			return
		case <-wake:
			// A writer appending line after line (tar -x here or in
			// another mount) makes a pass every passGap, not one per
			// line; a lone change is read after wakeGap.
			time.Sleep(max(wakeGap, passGap-time.Since(last)))
		case <-t.C:
		}
		last = time.Now()
		fl.catchUp()
	}
}

// watch returns a channel that receives when a journal file of the scope
// was written on this node, or nil where inotify is not to be had (then
// only the poll wakes the follower).
func (fl *follower) watch() <-chan struct{} {
	dir, err := fl.f.ws.OpenJournalDir()
	if err != nil {
		return nil
	}
	defer dir.Close()
	in, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil
	}
	// The directory is named by the fd this process holds, never by a
	// host path.
	if _, err := unix.InotifyAddWatch(in, "/proc/self/fd/"+strconv.Itoa(int(dir.Fd())), unix.IN_MODIFY|unix.IN_MOVED_TO|unix.IN_CLOSE_WRITE|unix.IN_ONLYDIR); err != nil {
		unix.Close(in)
		return nil
	}
	// A pipe ends the reader's poll(2) when the follower stops.
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		unix.Close(in)
		return nil
	}
	wake := make(chan struct{}, 1)
	go func() {
		<-fl.stop
		unix.Write(p[1], []byte{0})
	}()
	go func() {
		defer unix.Close(in)
		defer unix.Close(p[0])
		defer unix.Close(p[1])
		buf := make([]byte, 64<<10)
		fds := []unix.PollFd{{Fd: int32(in), Events: unix.POLLIN}, {Fd: int32(p[0]), Events: unix.POLLIN}}
		for {
			if _, err := unix.Poll(fds, -1); err != nil && err != unix.EINTR {
				return
			}
			if fds[1].Revents != 0 {
				return
			}
			others := false
			for {
				n, err := unix.Read(in, buf)
				if err != nil || n <= 0 {
					break
				}
				others = fl.othersWrote(buf[:n]) || others
			}
			if !others {
				continue
			}
			select {
			case wake <- struct{}{}:
			default:
			}
		}
	}()
	return wake
}

// othersWrote reports whether the inotify events in buf can mean a change
// this mount did not make: a journal file other than its Workspace's own
// was written, or its own file gained a line that is not the mount's
// (the tool door in the same process). The mount's own lines need no
// pass: on a shared filesystem a pass is a listing and a read of every
// journal file, round trips that a tar -x through the mount would
// otherwise pay for every few files it writes.
func (fl *follower) othersWrote(buf []byte) bool {
	ws := fl.f.ws
	own := true
	for len(buf) >= unix.SizeofInotifyEvent {
		ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[0]))
		end := unix.SizeofInotifyEvent + int(ev.Len)
		if end > len(buf) {
			return true
		}
		name := strings.TrimRight(string(buf[unix.SizeofInotifyEvent:end]), "\x00")
		if name == "" || !ws.OwnJournal(strings.TrimPrefix(name, store.TempJournalPrefix)) {
			own = false
		}
		buf = buf[end:]
	}
	if !own {
		return true
	}
	n := ws.JournalLinesExcept(mineSources...)
	if n == fl.others.Load() {
		return false
	}
	fl.others.Store(n)
	return true
}

// catchUp reads what the journals gained and drops what it names. Each
// line is read once (from JournalFile.End): the lines of an open still
// going need no second look, since its end has a line of its own.
func (fl *follower) catchUp() {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	if fl.halted() {
		return
	}
	fl.passes++
	ws := fl.f.ws
	// The sizes first: a pass that finds no file grown reads nothing.
	sizes, err := ws.JournalFiles()
	if err != nil {
		return
	}
	fl.read.Store(time.Now().UnixNano())
	grown := len(sizes) != len(fl.size)
	for _, jf := range sizes {
		if fl.size[jf.Name] != jf.Size {
			grown = true
		}
	}
	if !grown {
		return
	}
	files, err := ws.ReadJournal(fl.from)
	// trees are the trees other writers moved, removed or restored, and
	// foreign whether any line was theirs (newdir.go, echoTrees).
	var trees []string
	foreign := false
	defer func() {
		if foreign {
			fl.f.echoTrees(trees)
		}
	}()
	if errors.Is(err, store.ErrJournalGone) {
		// A file was removed (a snapshot reader is done with it) before
		// this mount read its last lines, which are lost to it: drop
		// everything once and go on from what is there now.
		fl.dropAll()
		foreign, trees = true, []string{"."}
		fl.forgetGone()
		if files == nil {
			return
		}
	} else if err != nil {
		return
	}
	for _, jf := range sizes {
		fl.size[jf.Name] = jf.Size
	}
	for _, jf := range files {
		own := ws.OwnJournal(jf.Name)
		for _, c := range jf.Changes {
			if fl.halted() {
				return
			}
			if own && mine(c) {
				continue
			}
			foreign = true
			if c.Subtree && !echoed(c) && !slices.Contains(trees, c.Path) {
				trees = append(trees, c.Path)
			}
			fl.drop(c.Path, c.Subtree)
		}
		fl.from[jf.Name] = jf.End
		if !jf.Trusted() && !fl.doubted[jf.Name] {
			fl.doubted[jf.Name] = true
			fl.dropAll()
			foreign, trees = true, []string{"."}
		}
	}
}

// mine reports whether a line of the mount's own Workspace is the mount's
// change (its projection's, or its health probe's), not the tool door's
// in the same process. A Workspace is projected by one mount at a time
// (sandbox.Pool keeps one), so every projection line there is this one's.
// A change the tool door makes to a file the mount holds open for writing
// has no line of its own (the open covers it), so it is seen when the
// name is next looked up, as a replaced file is (the open answers ESTALE).
func mine(c store.JournalChange) bool {
	return slices.Contains(mineSources, c.Source)
}

// echoed reports whether c is another mount's echo of a tree (echoTrees):
// it moved nothing, and echoing it again would only bounce it back.
func echoed(c store.JournalChange) bool {
	return c.Op == store.OpTree && c.Source == store.SourceProjection
}

// mineSources are the sources of the changes mine reports as the mount's.
var mineSources = []string{store.SourceProjection, store.SourceLoomfs}

// forgetGone forgets the files that are no longer there.
func (fl *follower) forgetGone() {
	files, err := fl.f.ws.JournalFiles()
	if err != nil {
		return
	}
	present := map[string]bool{}
	for _, jf := range files {
		present[jf.Name] = true
	}
	for name := range fl.from {
		if !present[name] {
			delete(fl.from, name)
			delete(fl.size, name)
			delete(fl.doubted, name)
		}
	}
}

// drop makes the kernel forget what it knows of rel (and, for a subtree,
// of everything beneath it): the entry and, negative or not, its name in
// the parent, the attributes and pages of the object, the parent's
// attributes and listing. A path the kernel never looked up costs a walk
// of the mount's inode tree and nothing more.
func (fl *follower) drop(rel string, subtree bool) {
	fl.f.drops.Add(1)
	root := fl.f.root.EmbeddedInode()
	if rel == "." {
		dropInode(root)
		if subtree {
			fl.dropBeneath(root)
		}
		return
	}
	parent := root
	names := strings.Split(rel, "/")
	for _, name := range names[:len(names)-1] {
		if parent = parent.GetChild(name); parent == nil {
			return
		}
	}
	name := names[len(names)-1]
	child := parent.GetChild(name)
	if child == nil {
		// Unknown to the kernel, or known as missing (a negative entry).
		parent.NotifyEntry(name)
		dropInode(parent)
		return
	}
	if n, ok := child.Operations().(*node); ok {
		// Whatever changed, the node's next open finds its file again
		// (reader.go).
		n.dropReader()
	}
	sx, err := fl.stat(rel)
	switch {
	case err == unix.ENOENT:
		parent.NotifyDelete(name, child)
	case err != nil || !sameObject(child.StableAttr(), &sx):
		// Replaced (the tool door's atomic writes) or unreadable: the name
		// is looked up again. The old node keeps what the kernel knows of
		// its own object, which did not change: readers that still have
		// it open read it whole.
		parent.NotifyEntry(name)
	default:
		// The same object, changed in place.
		parent.NotifyEntry(name)
		dropInode(child)
		if subtree {
			fl.dropBeneath(child)
		}
	}
	dropInode(parent)
}

// stat describes what the backing store holds at rel now.
func (fl *follower) stat(rel string) (unix.Statx_t, error) {
	parent, name, err := fl.f.ws.Parent(rel)
	if err != nil {
		if policy.CodeOf(err) == policy.NotFound {
			return unix.Statx_t{}, unix.ENOENT
		}
		return unix.Statx_t{}, err
	}
	defer parent.Close()
	return statAt(int(parent.Fd()), name)
}

// dropAll makes the kernel forget everything it knows of the mount.
func (fl *follower) dropAll() {
	fl.f.drops.Add(1)
	root := fl.f.root.EmbeddedInode()
	dropInode(root)
	fl.dropBeneath(root)
}

func dropInode(in *fs.Inode) {
	if n, ok := in.Operations().(*node); ok {
		n.stamp.Store(nil)
		n.listed.Store(false)
		n.dropReader()
	}
	in.NotifyContent(0, 0)
}

func (fl *follower) dropBeneath(dir *fs.Inode) {
	for name, child := range dir.Children() {
		if fl.halted() {
			return
		}
		dir.NotifyEntry(name)
		dropInode(child)
		if child.IsDir() {
			fl.dropBeneath(child)
		}
	}
}
