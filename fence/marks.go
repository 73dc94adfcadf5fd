package fence

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Marks are the takeover's high-water marks of one node: how long each
// append-only file only that node writes was when it was fenced, as the
// fencing node read it after the fence took hold. A reader treats the
// bytes of such a file past its mark, and every file of the node created
// after the fence, as written after the fence: ignored, and said so.
//
// Why marks and not an epoch. An epoch a writer stamps on what it writes
// (read from a file the fence bumps) is checked by nobody at the moment
// the bytes land: a writer that read the epoch before the fence, froze,
// and woke after it stamps the old epoch on a late record, which is then
// indistinguishable from one written before the fence. A time is no
// better: every time on the volume is its writer's clock. Marks need
// neither: they are lengths the fencing node observed on the storage
// after the fence took hold (on CephFS after the MDS's OSD epoch barrier,
// when nothing of the fenced instances can land any more; with the
// operator's confirmation, once the node is cut off). Every byte below a
// mark was on the storage at the fence; the node's files are appended to
// only by the node, so every byte past a mark, and every file the
// listing at the fence did not hold, came later. On CephFS there should
// be none (the storage refuses them); a mark is what tells them apart
// where the storage could not refuse them.
//
// Marks only hold for bytes one node alone wrote, so each kind of record
// is marked as its writers allow:
//   - the node's audit chain and ledger (package audit) and its change
//     journals (one file per writing process, named after its node), by
//     the length of each of its files;
//   - call logs (package callrec), which another node's writer takes over
//     once nobody holds them: by the length of every call log of the
//     volume, and a line counts as the node's by the node it names, so a
//     line of the node past its log's mark is late and another writer's
//     is not;
//   - execution markers and quarantines, whole records naming their node:
//     by the scopes where the node had one at the fence. One of the node's
//     elsewhere, while the fence is in force, came later.
//
// See DEPLOY.md §11 for what a reader does with what is late.
//
// A re-admission (loomfs fence --readmit, once the node's old processes
// are stopped) closes the window: each file's Readmit is its length
// then, files created during the fence are marked from 0, and bytes
// written after the re-admission (the re-admitted node's own) are read
// again. Marks are kept for good: the audit keeps what they explain.
type Marks struct {
	Node string `json:"node"`
	// Fences are the fences the marks came from (their records' times,
	// by the fencing node's clock: for messages only, never compared).
	Fences []time.Time `json:"fences"`
	// Audit marks the node's audit files, by name in the audit
	// directory.
	Audit map[string]Mark `json:"audit"`
	// Journals marks the node's change journal files and Calls every
	// call log, each by ScopeFile.
	Journals map[string]Mark `json:"journals,omitempty"`
	Calls    map[string]Mark `json:"calls,omitempty"`
	// Markers are the scopes (by hash) where the node had an execution
	// marker or a quarantine at a fence in force.
	Markers []string `json:"markers,omitempty"`
	// InForce is true from a fence to the re-admission: every file of
	// the node that the marks do not name was created after the fence.
	InForce bool `json:"in_force"`
}

// Lengths are what a fence measured of a node's records once it held:
// the length of each file by its key in Marks, and the scopes where the
// node had a marker.
type Lengths struct {
	Audit    map[string]int64
	Journals map[string]int64
	Calls    map[string]int64
	Markers  []string
}

// ScopeFile is the key of a scope's journal file or call log in Marks:
// the scope's hash (its state directory's name) and the file's name.
func ScopeFile(scopeHash, name string) string { return scopeHash + "/" + name }

// Mark is one file's window of bytes written after a fence: from Fenced
// (its length at the fence; 0 for a file created after it) to Readmit
// (its length at the re-admission), or without end while the fence is
// in force (Readmitted false).
type Mark struct {
	Fenced     int64 `json:"fenced"`
	Readmit    int64 `json:"readmit,omitempty"`
	Readmitted bool  `json:"readmitted,omitempty"`
}

// Late reports whether the byte range [off, end) of the file lies, in
// part, in the window of bytes written after the fence.
func (m Mark) Late(off, end int64) bool {
	return end > m.Fenced && (!m.Readmitted || off < m.Readmit)
}

// Late reports whether the bytes [off, end) of the node's audit file name
// were written after a fence of the node. m may be nil: a node never
// fenced.
func (m *Marks) Late(name string, off, end int64) bool {
	if m == nil {
		return false
	}
	return m.late(m.Audit, name, off, end)
}

// LateJournal reports whether the bytes [off, end) of the node's change
// journal file (by ScopeFile) were written after a fence of the node.
func (m *Marks) LateJournal(key string, off, end int64) bool {
	if m == nil {
		return false
	}
	return m.late(m.Journals, key, off, end)
}

// LateCall reports whether a line [off, end) of a call log (by ScopeFile)
// that names the node was written after a fence of the node.
func (m *Marks) LateCall(key string, off, end int64) bool {
	if m == nil {
		return false
	}
	return m.late(m.Calls, key, off, end)
}

// LateMarker reports whether an execution marker or quarantine of the
// node in the scope scopeHash was written after a fence still in force:
// the fence did not see it. One written while a fence was in force and
// still there after the re-admission counts as the node's own.
func (m *Marks) LateMarker(scopeHash string) bool {
	return m != nil && m.InForce && !slices.Contains(m.Markers, scopeHash)
}

func (m *Marks) late(marks map[string]Mark, key string, off, end int64) bool {
	mk, ok := marks[key]
	if !ok {
		return m.InForce
	}
	return mk.Late(off, end)
}

// MarksDir holds the marks under Dir, one file per node ever fenced
// (NODE.json), apart from the fence records.
const MarksDir = "marks"

func marksPath(root, node string) string { return filepath.Join(root, Dir, MarksDir, node+".json") }

// AddMarks merges the lengths of the node's records at a fence into its
// kept marks and puts the fence in force. A file marked by an earlier
// fence keeps its mark: its window starts there.
func AddMarks(root, node string, at time.Time, l Lengths) (Marks, error) {
	m, err := ReadMarks(root, node)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return m, err
	}
	m.Node = node
	m.Fences = append(m.Fences, at.UTC())
	m.Audit = openWindows(m.Audit, l.Audit)
	m.Journals = openWindows(m.Journals, l.Journals)
	m.Calls = openWindows(m.Calls, l.Calls)
	if !m.InForce {
		m.Markers = nil // the last window's are settled: cleared or kept as the node's
	}
	for _, h := range l.Markers {
		if !slices.Contains(m.Markers, h) {
			m.Markers = append(m.Markers, h)
		}
	}
	m.InForce = true
	return m, writeJSON(marksPath(root, node), m)
}

// openWindows marks each file of sizes from its length, but for one still
// in an open window, which starts where it did.
func openWindows(marks map[string]Mark, sizes map[string]int64) map[string]Mark {
	if marks == nil {
		marks = map[string]Mark{}
	}
	for key, size := range sizes {
		if old, ok := marks[key]; ok && !old.Readmitted {
			continue // still in an open window: it starts there
		}
		// New, or fenced again after a re-admission: one window per file
		// is kept, from this fence on (the audit's fence and readmit
		// records name the earlier one).
		marks[key] = Mark{Fenced: size}
	}
	return marks
}

// Readmitted closes the window of the node's marks at re-admission: each
// marked file's window ends at its length now, and each file of the node
// created during the fence (now, its length) is marked from 0.
func Readmitted(root, node string, l Lengths) (Marks, error) {
	m, err := ReadMarks(root, node)
	if errors.Is(err, os.ErrNotExist) {
		return m, nil // fenced before marks were kept
	}
	if err != nil {
		return m, err
	}
	m.Audit = closeWindows(m.Audit, l.Audit, m.InForce)
	m.Journals = closeWindows(m.Journals, l.Journals, m.InForce)
	m.Calls = closeWindows(m.Calls, l.Calls, m.InForce)
	m.InForce = false
	return m, writeJSON(marksPath(root, node), m)
}

// closeWindows ends each open window at the file's size now; a file the
// fence did not see was made during it (if it is in force) and is marked
// from 0.
func closeWindows(marks map[string]Mark, sizes map[string]int64, inForce bool) map[string]Mark {
	if marks == nil && len(sizes) > 0 {
		marks = map[string]Mark{}
	}
	for key, size := range sizes {
		mk, ok := marks[key]
		switch {
		case !ok && inForce:
			marks[key] = Mark{Fenced: 0, Readmit: size, Readmitted: true}
		case ok && !mk.Readmitted:
			mk.Readmit, mk.Readmitted = max(size, mk.Fenced), true
			marks[key] = mk
		}
	}
	return marks
}

// ReadMarks returns node's kept marks under root; an error wrapping
// os.ErrNotExist if it was never fenced since marks were kept.
func ReadMarks(root, node string) (Marks, error) {
	return readJSON[Marks](node, "marks", func() string { return marksPath(root, node) })
}

// AllMarks returns the kept marks of every node ever fenced under root,
// by node name; none when root has no fence directory.
func AllMarks(root string) (map[string]*Marks, error) {
	ents, err := os.ReadDir(filepath.Join(root, Dir, MarksDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the fence marks: %w", err)
	}
	out := map[string]*Marks{}
	for _, e := range ents {
		node, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || CheckNode(node) != nil {
			continue
		}
		m, err := ReadMarks(root, node)
		if err != nil {
			return nil, err
		}
		out[node] = &m
	}
	return out, nil
}

// writeJSON keeps v at path whole or not at all, durably.
func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("record the fence marks: %w", err)
	}
	f, err := os.CreateTemp(dir, ".tmp-")
	if err != nil {
		return fmt.Errorf("record the fence marks: %w", err)
	}
	defer os.Remove(f.Name())
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		return fmt.Errorf("record the fence marks: %w", err)
	}
	return nil
}
