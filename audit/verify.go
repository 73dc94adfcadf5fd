package audit

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Report is what Verify found in an audit directory.
type Report struct {
	Files    int       `json:"files"`
	Records  int       `json:"records"` // lines checked, checkpoints included
	Events   int       `json:"events"`
	Chains   []Chain   `json:"chains"`
	Warnings []Problem `json:"warnings,omitempty"` // worth a look, not evidence of tampering
	Problems []Problem `json:"problems,omitempty"` // the log was altered (or damaged)
	Omitted  int       `json:"omitted_problems,omitempty"`
}

// Chain summarises one writer's chain.
type Chain struct {
	Writer  string `json:"writer"` // file name stem <node>-<pid>-<start>
	Files   int    `json:"files"`
	Records int    `json:"records"`
	Head    string `json:"head"`   // hash of the last record: keep it elsewhere to anchor the chain
	Closed  bool   `json:"closed"` // ends in a close checkpoint; an open chain's writer is running or crashed
}

// Problem is one finding, located by file and line (line 0: the whole file).
type Problem struct {
	File    string `json:"file"`
	Line    int    `json:"line"`
	Message string `json:"message"`
	Text    string `json:"record,omitempty"` // the offending line, cut short
}

func (p Problem) String() string {
	if p.Line == 0 {
		return p.File + ": " + p.Message
	}
	return fmt.Sprintf("%s:%d: %s", p.File, p.Line, p.Message)
}

// OK reports whether every chain is intact.
func (r Report) OK() bool { return len(r.Problems) == 0 }

// String is the one-line summary, e.g. "3 files, 12034 records, chain intact".
func (r Report) String() string {
	s := fmt.Sprintf("%d files, %d records", r.Files, r.Records)
	if !r.OK() {
		return s + fmt.Sprintf(", CHAIN BROKEN (%d problems)", len(r.Problems)+r.Omitted)
	}
	s += ", chain intact"
	open := 0
	for _, c := range r.Chains {
		if !c.Closed {
			open++
		}
	}
	switch {
	case open > 0:
		s += fmt.Sprintf(" (%d writers, %d still open)", len(r.Chains), open)
	case len(r.Chains) > 1:
		s += fmt.Sprintf(" (%d writers)", len(r.Chains))
	}
	return s
}

// maxProblems bounds the problems a report lists; the rest are counted.
const maxProblems = 100

// Verify checks every chain in dir independently: sequence numbers, hash
// links, checkpoints and the file set of each rotation. It returns an error
// only when dir cannot be read; what it finds is in the Report.
//
// A line cut short at the very end of a chain (a crash mid-write) is a
// warning. What no hash chain can show is a cut at the end of an open chain
// or the removal of a whole chain; Chain.Head, kept elsewhere, guards that.
func Verify(dir string) (Report, error) {
	var rep Report
	fi, err := os.Lstat(dir)
	if err != nil {
		return rep, fmt.Errorf("audit directory: %w", err)
	}
	if !fi.IsDir() {
		return rep, fmt.Errorf("audit directory %s is not a directory", dir)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		rep.warn(Problem{File: ".", Message: fmt.Sprintf("directory mode %v: should be 0700", fi.Mode().Perm())})
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return rep, fmt.Errorf("read audit directory: %w", err)
	}
	chains := groupChains(ents, func(e os.DirEntry, isLog bool) {
		if !isLog {
			rep.warn(Problem{File: e.Name(), Message: "not an audit log file"})
			return
		}
		rep.problem(Problem{File: e.Name(), Message: fmt.Sprintf("not a regular file (%v)", e.Type())})
	})
	slices.SortFunc(chains, func(a, b *chainReader) int { return strings.Compare(a.w.id, b.w.id) })
	for _, c := range chains {
		slices.SortFunc(c.files, func(a, b chainFile) int { return a.n - b.n })
		if err := verifyChain(dir, c, &rep); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// chainCheck is the state of one chain's verification.
type chainCheck struct {
	rep        *Report
	w          writerID
	seq        uint64 // seq of the last record
	prev       string // hash of the last line
	prevLine   []byte // the last line, to show if the next reveals it was altered
	prevFile   string
	prevLineNo int
	lastRec    Record
	events     uint64
	closed     bool
	resync     bool // after a problem: take the next record as the new base
	inChain    int  // records seen in this chain
	fileRecs   int  // records seen in the current file
}

func verifyChain(dir string, c *chainReader, rep *Report) error {
	k := &chainCheck{rep: rep, w: c.w}
	sum := Chain{Writer: c.w.id, Files: len(c.files)}
	want := 1
	for i, cf := range c.files {
		rep.Files++
		last := i == len(c.files)-1
		if cf.n != want {
			rep.problem(Problem{File: cf.name, Message: fmt.Sprintf("file %d of this chain is missing: a file was removed from the rotation set", want)})
			k.resync = true
		}
		want = cf.n + 1
		if k.closed {
			rep.problem(Problem{File: cf.name, Message: "file after the chain's close checkpoint"})
		}
		size, err := k.file(dir, cf.name, last)
		if err != nil {
			return err
		}
		if last {
			if k.fileRecs > 0 && k.lastRec.Kind == KindCheckpoint && k.lastRec.Reason == "rotate" {
				rep.problem(Problem{File: cf.name, Message: fmt.Sprintf("chain ends in a rotation checkpoint but file %d is missing", cf.n+1)})
			}
			break
		}
		switch {
		case size == 0:
			rep.problem(Problem{File: cf.name, Message: "empty file in the middle of the chain: its records were removed"})
		case k.lastRec.Kind == KindCheckpoint && k.lastRec.Reason == "rotate":
		case i+1 == len(c.files)-1 && c.isEmpty(dir, i+1):
			rep.warn(Problem{File: cf.name, Message: "no rotation checkpoint: the writer stopped while rotating"})
		default:
			rep.problem(Problem{File: cf.name, Message: "file does not end in a rotation checkpoint: records were removed from its end"})
		}
	}
	sum.Records, sum.Head, sum.Closed = k.inChain, k.prev, k.closed
	rep.Chains = append(rep.Chains, sum)
	return nil
}

func (c *chainReader) isEmpty(dir string, i int) bool {
	fi, err := os.Stat(filepath.Join(dir, c.files[i].name))
	return err == nil && fi.Size() == 0
}

// file checks the lines of one file and returns its size.
func (k *chainCheck) file(dir, name string, lastFile bool) (int64, error) {
	f, err := os.Open(filepath.Join(dir, name))
	if err != nil {
		return 0, fmt.Errorf("read audit log: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("read audit log: %w", err)
	}
	if fi.Mode().Perm() != 0o600 {
		k.rep.warn(Problem{File: name, Message: fmt.Sprintf("file mode %v: should be 0600", fi.Mode().Perm())})
	}
	k.fileRecs = 0
	br := bufio.NewReaderSize(f, 64<<10)
	var long []byte
	for lineNo := 1; ; lineNo++ {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			long = append(long[:0], line...)
			rest, rerr := br.ReadBytes('\n')
			line, err = append(long, rest...), rerr
		}
		if errors.Is(err, io.EOF) {
			if len(line) > 0 {
				p := Problem{File: name, Line: lineNo, Message: "incomplete last line", Text: cut(line)}
				if lastFile {
					p.Message += " (the writer crashed mid-record?); ignored"
					k.rep.warn(p)
				} else {
					k.rep.problem(p)
				}
			}
			return fi.Size(), nil
		}
		if err != nil {
			return 0, fmt.Errorf("read audit log %s: %w", name, err)
		}
		k.line(name, lineNo, line)
	}
}

// line checks one complete line against the chain so far.
func (k *chainCheck) line(name string, lineNo int, line []byte) {
	k.rep.Records++
	k.inChain++
	bad := func(msg string) {
		k.rep.problem(Problem{File: name, Line: lineNo, Message: msg, Text: cut(line)})
		k.resync = true
	}
	sum := sha256.Sum256(line)
	defer func() {
		k.prev = hex.EncodeToString(sum[:])
		k.prevFile, k.prevLineNo = name, lineNo
		k.prevLine = append(k.prevLine[:0], line...)
		k.fileRecs++
	}()

	r, err := parseRecord(line)
	if err != nil {
		bad("not a valid record: " + err.Error())
		k.lastRec = Record{}
		return
	}
	switch {
	case r.PID != k.w.pid || fileNode(r.Node) != k.w.node:
		bad(fmt.Sprintf("record of node %q pid %d in another writer's file", r.Node, r.PID))
	case k.closed:
		bad("record after the chain's close checkpoint")
	case k.fileRecs > 0 && k.lastRec.Kind == KindCheckpoint && k.lastRec.Reason == "rotate":
		bad("record after a rotation checkpoint")
	case k.resync:
		k.resync = false
	case r.Seq != k.seq+1:
		bad(fmt.Sprintf("sequence number %d where %d was due: records were dropped, inserted or reordered", r.Seq, k.seq+1))
	case r.Prev != k.prev && k.inChain == 1:
		bad("first record links to a predecessor: the chain's first records were removed")
	case r.Prev != k.prev:
		// The record before this one is not the one it was chained to.
		k.rep.problem(Problem{File: k.prevFile, Line: k.prevLineNo, Text: cut(k.prevLine),
			Message: fmt.Sprintf("record was altered: its hash does not match the prev of the next record, seq %d", r.Seq)})
	}
	k.seq = r.Seq
	k.lastRec = r
	switch r.Kind {
	case KindEvent:
		k.events++
		k.rep.Events++
	case KindCheckpoint:
		if r.Count != k.events || r.Head != r.Prev {
			bad(fmt.Sprintf("checkpoint says %d events, head %.12s; the chain has %d, head %.12s", r.Count, r.Head, k.events, r.Prev))
		}
		if r.Reason == "close" {
			k.closed = true
		}
	}
}

func (r *Report) problem(p Problem) {
	if len(r.Problems) >= maxProblems {
		r.Omitted++
		return
	}
	r.Problems = append(r.Problems, p)
}

func (r *Report) warn(p Problem) {
	if len(r.Warnings) < maxProblems {
		r.Warnings = append(r.Warnings, p)
	}
}

// cut shortens a line for a report.
func cut(line []byte) string {
	const max = 1024
	s := strings.TrimSuffix(string(line), "\n")
	if len(s) > max {
		s = s[:max] + "…"
	}
	return s
}
