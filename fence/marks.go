package fence

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
// Marks only hold for files one node alone appends to: its audit chain
// and ledger (package audit). A change journal's late lines name paths
// that a late write may have changed, which a reader must not drop;
// call logs are taken over by other writers once unlocked, so a length
// can't tell the fenced node's bytes from the next writer's; markers are
// whole records naming their node. See DEPLOY.md §11.
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
	// InForce is true from a fence to the re-admission: every audit file
	// of the node that Audit does not name was created after the fence.
	InForce bool `json:"in_force"`
}

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
	mk, ok := m.Audit[name]
	if !ok {
		return m.InForce
	}
	return mk.Late(off, end)
}

// MarksDir holds the marks under Dir, one file per node ever fenced
// (NODE.json), apart from the fence records.
const MarksDir = "marks"

func marksPath(root, node string) string { return filepath.Join(root, Dir, MarksDir, node+".json") }

// AddMarks merges the lengths of the node's audit files at a fence
// (name → length) into its kept marks and puts the fence in force. A file
// marked by an earlier fence keeps its mark: its window starts there.
func AddMarks(root, node string, at time.Time, audit map[string]int64) (Marks, error) {
	m, err := ReadMarks(root, node)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return m, err
	}
	m.Node = node
	m.Fences = append(m.Fences, at.UTC())
	if m.Audit == nil {
		m.Audit = map[string]Mark{}
	}
	for name, size := range audit {
		if old, ok := m.Audit[name]; ok && !old.Readmitted {
			continue // still in an open window: it starts there
		}
		// New, or fenced again after a re-admission: one window per file
		// is kept, from this fence on (the audit's fence and readmit
		// records name the earlier one).
		m.Audit[name] = Mark{Fenced: size}
	}
	m.InForce = true
	return m, writeJSON(marksPath(root, node), m)
}

// Readmitted closes the window of the node's marks at re-admission: each
// marked file's window ends at its length now, and each file of the node
// created during the fence (now, its length) is marked from 0.
func Readmitted(root, node string, audit map[string]int64) (Marks, error) {
	m, err := ReadMarks(root, node)
	if errors.Is(err, os.ErrNotExist) {
		return m, nil // fenced before marks were kept
	}
	if err != nil {
		return m, err
	}
	for name, size := range audit {
		mk, ok := m.Audit[name]
		switch {
		case !ok && m.InForce:
			m.Audit[name] = Mark{Fenced: 0, Readmit: size, Readmitted: true}
		case ok && !mk.Readmitted:
			mk.Readmit, mk.Readmitted = max(size, mk.Fenced), true
			m.Audit[name] = mk
		}
	}
	m.InForce = false
	return m, writeJSON(marksPath(root, node), m)
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
