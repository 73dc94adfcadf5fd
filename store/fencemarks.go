package store

import (
	"fmt"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/callrec"
	"github.com/agentloom/loomfs/fence"
	"github.com/agentloom/loomfs/nodeid"
)

// A fenced node's records in the scopes' state directories are marked at
// its fence as its audit files are (fence.Marks): the length of each of
// its change journal files and of every call log, and the scopes where it
// had an execution marker, a session marker or a quarantine. A reader
// here treats what a fenced node wrote past its marks as written after
// its fence:
//   - a journal file with late lines is not trusted (a snapshot walks the
//     scope, as for a writer that died), and its late lines are not
//     reported as changes;
//   - a late call record line is ignored: the call's outcome stays what
//     the lines before the fence say (unknown_outcome for a call only
//     started);
//   - a late marker or quarantine is set aside (renamed with LateSuffix)
//     by the next lock holder instead of quarantining the scope: the node
//     can't write any more, and its own loomfs removes its containers.
//
// Only lines and files of another node than this one are looked at, so a
// volume no node was ever fenced from costs a reader nothing more.

// LateSuffix is added to the name of a marker or quarantine a fenced node
// wrote after its fence, set aside by the next lock holder.
const LateSuffix = ".fenced-late"

// fencedMarks caches the marks of the volume's fenced nodes, read again
// whenever their directory changed (a fence or a re-admission renames a
// node's marks into it).
type fencedMarks struct {
	mu     sync.Mutex
	dir    stamp
	byNode map[string]*fence.Marks
	// bySafe indexes them by the node's name as journal file names
	// carry it (safeNode).
	bySafe map[string][]*fence.Marks
}

// fenced returns the marks of every node ever fenced from the volume, by
// name and by journal-file name; none when no node was.
func (v *Volume) fenced() (byNode map[string]*fence.Marks, bySafe map[string][]*fence.Marks, err error) {
	var st unix.Stat_t
	err = unix.Fstatat(int(v.root.Fd()), fence.Dir+"/"+fence.MarksDir, &st, unix.AT_SYMLINK_NOFOLLOW)
	if err == unix.ENOENT {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("fence marks: %w", err)
	}
	c := &v.fencedMarks
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := stampOf(&st); now != c.dir || c.byNode == nil {
		all, err := fence.AllMarks(v.path)
		if err != nil {
			return nil, nil, err
		}
		c.byNode, c.bySafe, c.dir = all, map[string][]*fence.Marks{}, now
		for node, m := range all {
			c.bySafe[safeNode(node)] = append(c.bySafe[safeNode(node)], m)
		}
	}
	return c.byNode, c.bySafe, nil
}

// lateCallLine tells a call log's reader (callrec.Log.Late) whether the
// line [off, end) of log name, which names node, was written after a
// fence of node. A line of this node never is: a fenced node serves
// nothing.
func (w *Workspace) lateCallLine(node, name string, off, end int64) (bool, error) {
	if self, _ := nodeid.Name(); node == self {
		return false, nil
	}
	byNode, _, err := w.vol.fenced()
	if err != nil || byNode[node] == nil {
		return false, err
	}
	return byNode[node].LateCall(fence.ScopeFile(w.scope.Hash(), name), off, end), nil
}

// lateRecord tells whether m, a marker or quarantine of the scope, was
// written by a node after its fence (fence.Marks.LateMarker).
func (w *Workspace) lateRecord(m *Marker) (bool, error) {
	if m == nil || m.Node == "" || w.vol == nil {
		return false, nil // no volume: a bare view of a state directory
	}
	if self, _ := nodeid.Name(); m.Node == self {
		return false, nil
	}
	byNode, _, err := w.vol.fenced()
	if err != nil {
		return false, err
	}
	return byNode[m.Node].LateMarker(w.scope.Hash()), nil
}

// setAsideLate renames the state record name, written by a fenced node
// after its fence, out of every reader's way, keeping it for an
// administrator to read.
func (w *Workspace) setAsideLate(name string) error {
	sfd := int(w.state.Fd())
	if err := unix.Renameat(sfd, name, sfd, name+LateSuffix); err != nil && err != unix.ENOENT {
		return fmt.Errorf("set aside %s, written after its node's fence: %w", name, err)
	}
	return syncDir(sfd)
}

// FenceLengths measures node's records in every scope's state directory
// for the marks of its fence (fence.Lengths; the audit files are package
// audit's): the length of each of its change journal files and of every
// call log, and the scopes where it has an execution marker, a session
// marker or a quarantine. It reads the storage as it is now: the fence
// calls it once the fence holds. The scopes are measured fenceWorkers at
// a time.
func (v *Volume) FenceLengths(node string) (fence.Lengths, error) {
	l := fence.Lengths{Journals: map[string]int64{}, Calls: map[string]int64{}}
	var mu sync.Mutex
	journalPrefix := safeNode(node) + "."
	err := v.eachState(fenceWorkers, func(h string, state *os.File) error {
		var sl fence.Lengths
		if err := measureState(state, h, node, journalPrefix, &sl); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		maps.Copy(l.Journals, sl.Journals)
		maps.Copy(l.Calls, sl.Calls)
		l.Markers = append(l.Markers, sl.Markers...)
		return nil
	})
	sort.Strings(l.Markers)
	return l, err
}

// fenceWorkers is how many scopes a fence measures at once: on CephFS
// each scope is about a dozen round trips to the MDS, which overlap
// (BENCHMARKS.md, "Fencing a node").
var fenceWorkers = 16

// measureState adds what scope h's state directory holds of node to l:
// one listing of it says which of the records and directories are there.
func measureState(state *os.File, h, node, journalPrefix string, l *fence.Lengths) error {
	sfd := int(state.Fd())
	names, err := state.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("state of %s: %w", h, err)
	}
	w := &Workspace{state: state}
	for _, name := range []string{ExecMarker, SessionMarker, QuarantineFile} {
		if !slices.Contains(names, name) {
			continue
		}
		m, err := w.readState(name)
		if err != nil {
			return fmt.Errorf("state of %s: %w", h, err)
		}
		if m != nil && m.Node == node {
			l.Markers = append(l.Markers, h)
			break
		}
	}
	for _, d := range []struct {
		sub     string
		keep    func(name string) bool
		lengths *map[string]int64
	}{
		{JournalDir, func(n string) bool { return strings.HasPrefix(n, journalPrefix) && strings.HasSuffix(n, journalSuffix) }, &l.Journals},
		{callrec.Dir, callrec.IsLog, &l.Calls},
	} {
		if !slices.Contains(names, d.sub) {
			continue
		}
		dfd, err := unix.Openat(sfd, d.sub, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err == unix.ENOENT {
			continue
		}
		if err != nil {
			return fmt.Errorf("open %s of %s: %w", d.sub, h, err)
		}
		if *d.lengths == nil {
			*d.lengths = map[string]int64{}
		}
		dir := os.NewFile(uintptr(dfd), d.sub)
		err = measureFiles(dir, h, d.keep, *d.lengths)
		dir.Close()
		if err != nil {
			return fmt.Errorf("measure %s of %s: %w", d.sub, h, err)
		}
	}
	return nil
}

// measureFiles puts the size of each file of dir that keep wants into
// lengths, by fence.ScopeFile.
func measureFiles(dir *os.File, h string, keep func(string) bool, lengths map[string]int64) error {
	names, err := dir.Readdirnames(-1)
	if err != nil {
		return err
	}
	for _, name := range names {
		if !keep(name) {
			continue
		}
		var st unix.Stat_t
		if err := unix.Fstatat(int(dir.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW); err == unix.ENOENT {
			continue // removed by its reader meanwhile
		} else if err != nil {
			return err
		}
		lengths[fence.ScopeFile(h, name)] = st.Size
	}
	return nil
}

// lateJournals judges the journal files of one read of a scope's
// journals, asking for the fenced nodes' marks at most once.
type lateJournals struct {
	looked bool
	bySafe map[string][]*fence.Marks
}

// of returns what tells the late lines of journal file name, nil when its
// node was never fenced (or is this node).
func (l *lateJournals) of(w *Workspace, name string) (func(off, end int64) bool, error) {
	node, _ := JournalWriter(name)
	if self, _ := nodeid.Name(); node == "" || node == safeNode(self) {
		return nil, nil
	}
	if !l.looked {
		_, bySafe, err := w.vol.fenced()
		if err != nil {
			return nil, err
		}
		l.looked, l.bySafe = true, bySafe
	}
	marks := l.bySafe[node]
	if len(marks) == 0 {
		return nil, nil
	}
	key := fence.ScopeFile(w.scope.Hash(), name)
	return func(off, end int64) bool {
		for _, m := range marks {
			if m.LateJournal(key, off, end) {
				return true
			}
		}
		return false
	}, nil
}

// quarantineInForce reads the scope's quarantine, which is flagged, and
// sets it aside if a fenced node wrote it after its fence: it reports
// whether the scope is still quarantined.
func (w *Workspace) quarantineInForce() (bool, error) {
	m, err := w.readState(QuarantineFile)
	if err != nil || m == nil {
		return m != nil || err != nil, err
	}
	if late, err := w.lateRecord(m); err != nil || !late {
		return true, err
	}
	return false, w.setAsideLate(QuarantineFile)
}
