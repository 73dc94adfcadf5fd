package audit

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/agentloom/loomfs/fence"
)

// A fenced node's audit files are marked at its fence (fence.Marks): how
// long its chain's files and its ledger were once the fence held. Only
// the node appends to them, so what lies past a mark, and a file of the
// node the fence did not see, was written after the fence. Readers
// (Query, Tail) skip those records; Verify still checks them as links of
// the chain (removing them would break it, and hide them) and reports
// them as written after the fence: ignored, not hidden.

// FenceLengths lists node's audit files in dir (its chain's files and its
// ledger) with their lengths now, for the marks of its fence. Each file
// is opened before it is measured, so a client that caches attributes
// (NFS) asks the server.
func FenceLengths(dir, node string) (map[string]int64, error) {
	ents, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return map[string]int64{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read audit directory: %w", err)
	}
	want := fileNode(node)
	out := map[string]int64{}
	for _, e := range ents {
		p := parseName(e.Name())
		if (p.kind != nodeChainFile && p.kind != ledgerFile) || p.w.node != want || !e.Type().IsRegular() {
			continue
		}
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("measure audit file %s: %w", e.Name(), err)
		}
		fi, err := f.Stat()
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("measure audit file %s: %w", e.Name(), err)
		}
		out[e.Name()] = fi.Size()
	}
	return out, nil
}

// fencedMarks returns the marks of every node fenced from the volume
// whose audit directory dir is, by the node's name in file names; none
// for a directory that is not a volume's (its parent has no fences).
func fencedMarks(dir string) (map[string]*fence.Marks, error) {
	all, err := fence.AllMarks(filepath.Dir(filepath.Clean(dir)))
	if err != nil || len(all) == 0 {
		return nil, err
	}
	out := make(map[string]*fence.Marks, len(all))
	for node, m := range all {
		out[fileNode(node)] = m
	}
	return out, nil
}

// lateCount is what Verify found of one fenced node's records written
// after its fence.
type lateCount struct {
	records int
	bytes   int64
	files   map[string]bool
}

func (l *lateCount) add(name string, n int) {
	if l.files == nil {
		l.files = map[string]bool{}
	}
	l.records++
	l.bytes += int64(n)
	l.files[name] = true
}

// FencedNode is what Verify says of a node fenced from the volume.
type FencedNode struct {
	Node    string `json:"node"`
	Fences  int    `json:"fences"`
	InForce bool   `json:"in_force"` // not re-admitted since
	// LateRecords and LateBytes are the lines (records and ledger
	// entries) and bytes it wrote after a fence: checked as links of
	// their chains, skipped by readers.
	LateRecords int      `json:"late_records"`
	LateBytes   int64    `json:"late_bytes"`
	LateFiles   []string `json:"late_files,omitempty"`
}

// fenced reports the fenced node v checks.
func (v *nodeCheck) fenced() {
	if v.marks == nil {
		return
	}
	fn := FencedNode{Node: v.node, Fences: len(v.marks.Fences), InForce: v.marks.InForce, LateRecords: v.afterFence.records, LateBytes: v.afterFence.bytes}
	for name := range v.afterFence.files {
		fn.LateFiles = append(fn.LateFiles, name)
	}
	sort.Strings(fn.LateFiles)
	v.rep.Fenced = append(v.rep.Fenced, fn)
	if fn.LateRecords > 0 {
		v.rep.warn(Problem{File: v.ledgerName, Message: fmt.Sprintf("node %s was fenced; %d lines (%d bytes) it wrote after its fence are in %s: they are checked as links of its chain and ignored by readers (audit query, tail)",
			v.node, fn.LateRecords, fn.LateBytes, strings.Join(fn.LateFiles, ", "))})
	}
}
