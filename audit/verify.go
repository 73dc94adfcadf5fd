package audit

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/agentloom/loomfs/fence"
)

// Report is what Verify found in an audit directory.
type Report struct {
	Files    int           `json:"files"`
	Records  int           `json:"records"` // chain lines checked, checkpoints included
	Events   int           `json:"events"`
	Chains   []Chain       `json:"chains"`
	Nodes    []NodeSummary `json:"nodes"`
	Legacy   int           `json:"legacy_chains,omitempty"` // per-process chains of the format before the ledger
	Signed   bool          `json:"signed"`                  // verified against trusted keys
	Anchored int           `json:"anchored_heads,omitempty"`
	Warnings []Problem     `json:"warnings,omitempty"` // worth a look, not evidence of tampering
	Problems []Problem     `json:"problems,omitempty"` // the log was altered (or damaged)
	Omitted  int           `json:"omitted_problems,omitempty"`
	// Crashed lists writers that ended without closing: a crash, or their
	// last records and close were cut. Not counted as problems; see Clean.
	Crashed []Problem `json:"ended_without_closing,omitempty"`
	// Fenced lists the nodes fenced from the volume (loomfs fence) and
	// what they wrote after a fence.
	Fenced []FencedNode `json:"fenced_nodes,omitempty"`
}

// Chain summarises one chain: a node's, or a legacy writer's.
type Chain struct {
	Writer  string `json:"writer"` // <node>.chain, or the legacy file name stem <node>-<pid>-<start>
	Files   int    `json:"files"`
	Records int    `json:"records"`
	Head    string `json:"head"`             // hash of the last record
	Closed  bool   `json:"closed,omitempty"` // legacy: ends in a close checkpoint
	Legacy  bool   `json:"legacy,omitempty"`
}

// NodeSummary is what a node's ledger says and what of it was checked.
type NodeSummary struct {
	Node       string `json:"node"`
	Writers    int    `json:"writers"`
	Closed     int    `json:"closed"`
	Running    int    `json:"running"`
	Crashed    int    `json:"ended_without_closing"`
	Seals      int    `json:"seals"`
	SignedUpTo uint64 `json:"signed_up_to,omitempty"` // ledger seq of the last seal a trusted key signed
	LedgerSeq  uint64 `json:"ledger_seq"`
	LedgerHead string `json:"ledger_head"`
	ChainSeq   uint64 `json:"chain_seq"`
	ChainHead  string `json:"chain_head"`
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

// OK reports whether every chain and ledger is intact.
func (r Report) OK() bool { return len(r.Problems) == 0 }

// Clean reports whether the log is intact and, unless allowCrashed says
// the operator has looked at them, no writer ended without closing.
func (r Report) Clean(allowCrashed bool) bool {
	return r.OK() && (allowCrashed || len(r.Crashed) == 0)
}

// String is the summary, e.g. "3 files, 12034 records, chain intact
// (2 nodes, 30 writers)".
func (r Report) String() string {
	s := fmt.Sprintf("%d files, %d records", r.Files, r.Records)
	if !r.OK() {
		return s + fmt.Sprintf(", CHAIN BROKEN (%d problems)", len(r.Problems)+r.Omitted)
	}
	s += ", chain intact"
	var parts []string
	writers, running := 0, 0
	for _, n := range r.Nodes {
		writers += n.Writers
		running += n.Running
	}
	if len(r.Nodes) > 0 {
		parts = append(parts, plural(len(r.Nodes), "node")+", "+plural(writers, "writer"))
	}
	if running > 0 {
		parts = append(parts, fmt.Sprintf("%d running", running))
	}
	if len(r.Crashed) > 0 {
		parts = append(parts, fmt.Sprintf("%d ended without closing", len(r.Crashed)))
	}
	for _, f := range r.Fenced {
		if f.LateRecords > 0 {
			parts = append(parts, fmt.Sprintf("%d lines node %s wrote after its fence, ignored by readers", f.LateRecords, f.Node))
		}
	}
	open := 0
	for _, c := range r.Chains {
		if c.Legacy && !c.Closed {
			open++
		}
	}
	if r.Legacy > 0 {
		l := plural(r.Legacy, "legacy writer")
		if open > 0 {
			l += fmt.Sprintf(", %d still open", open)
		}
		parts = append(parts, l)
	}
	if len(parts) > 0 {
		s += " (" + strings.Join(parts, ", ") + ")"
	}
	return s
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// maxProblems bounds the problems a report lists; the rest are counted.
const maxProblems = 100

// VerifyOptions add what the log alone can't prove.
type VerifyOptions struct {
	// Keys are the public keys the auditor trusts: every node must have
	// one, and every seal must be signed by its node's key.
	Keys TrustedKeys
	// Anchors are heads exported earlier (Anchor): the log must still
	// extend each of them.
	Anchors []Anchor
}

// Verify checks dir with no keys and no anchors: see VerifyWith.
func Verify(dir string) (Report, error) { return VerifyWith(dir, VerifyOptions{}) }

// VerifyWith checks every node's ledger and chain: sequence numbers, hash
// links, checkpoints and the file set of each rotation; that every
// registered writer's records are there up to the head the ledger holds
// and every record's writer is registered; with keys, every signature;
// with anchors, that each anchored head is still in the log. Legacy
// per-process chains are checked as hash chains. It returns an error only
// when dir cannot be read; what it finds is in the Report.
//
// A line cut short at the very end of a chain (a crash mid-write) is a
// warning.
func VerifyWith(dir string, opts VerifyOptions) (Report, error) {
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

	nodes := map[string]*chainReader{} // node chains by node
	var legacy []*chainReader
	for _, c := range chains {
		if c.w.kind == nodeChainFile {
			nodes[c.w.node] = c
		} else {
			legacy = append(legacy, c)
		}
	}
	names := map[string]bool{}
	for n := range nodes {
		names[n] = true
	}
	ledgers := map[string]bool{}
	for _, e := range ents {
		if p := parseName(e.Name()); p.kind == ledgerFile && e.Type().IsRegular() {
			ledgers[p.w.node] = true
			names[p.w.node] = true
		}
	}
	for n := range opts.Keys {
		names[n] = true
	}
	anchored := map[string][]anchorRef{}
	for _, a := range opts.Anchors {
		for _, h := range a.Heads {
			n := fileNode(h.Node)
			names[n] = true
			anchored[n] = append(anchored[n], anchorRef{Head: h, at: a.Time.UTC().Format("2006-01-02T15:04:05Z")})
			rep.Anchored++
		}
	}
	rep.Signed = opts.Keys != nil
	marks, err := fencedMarks(dir)
	if err != nil {
		return rep, err
	}
	for _, n := range slices.Sorted(func(yield func(string) bool) {
		for n := range names {
			if !yield(n) {
				return
			}
		}
	}) {
		v := &nodeCheck{rep: &rep, dir: dir, node: n, chain: nodes[n], keys: opts.Keys, anchors: anchored[n], marks: marks[n]}
		if err := v.run(ledgers[n]); err != nil {
			return rep, err
		}
	}
	for _, c := range legacy {
		if err := verifyChain(dir, c, &rep, nil); err != nil {
			return rep, err
		}
		rep.Legacy++
	}
	if rep.Legacy > 0 {
		rep.warn(Problem{File: ".", Message: fmt.Sprintf("%d chains are in the legacy per-process format (written before the ledger): "+
			"they are checked as hash chains only, so a writer removed whole or a cut tail can't be found in them", rep.Legacy)})
	}
	return rep, nil
}

// hashRef is a claim, made by a ledger entry or an anchor, about the hash
// of the chain's record at some seq.
type hashRef struct {
	hash  string
	where Problem // where the claim was made
}

type anchorRef struct {
	Head
	at string
}

// writerState is one registered writer as the ledger and the chain show it.
type writerState struct {
	id        uint64
	pid       int
	start     string
	line      int // of its open entry
	chainSeq  uint64
	close     *LedgerEntry
	closeLine int
	events    uint64 // its events found in the chain
}

// nodeCheck verifies one node: its ledger, then its chain against it.
type nodeCheck struct {
	rep     *Report
	dir     string
	node    string
	chain   *chainReader
	keys    TrustedKeys
	anchors []anchorRef

	ledgerName string
	writers    map[uint64]*writerState
	want       map[uint64][]hashRef // chain seq -> claims about its hash
	sum        NodeSummary
	ledgerLen  int
	sealsSeen  []*LedgerEntry
	late       []lateRecord // records of writers the ledger did not hold yet
	// marks are the node's fence marks, if it was ever fenced, and
	// afterFence what lies past them.
	marks      *fence.Marks
	afterFence lateCount
}

// lateRecord is a record of a writer that registered while Verify was
// reading, as far as the ledger it read first can tell.
type lateRecord struct {
	writer uint64
	pid    int
	where  Problem
}

func (v *nodeCheck) run(hasLedger bool) error {
	v.ledgerName = ledgerFileName(v.node)
	v.writers = map[uint64]*writerState{}
	v.want = map[uint64][]hashRef{}
	v.sum.Node = v.node
	var hashes []string // of ledger lines, by seq-1
	if hasLedger {
		var err error
		if hashes, err = v.ledger(); err != nil {
			return err
		}
	}
	switch {
	case !hasLedger && v.chain != nil:
		v.rep.problem(Problem{File: v.chain.files[0].name, Message: fmt.Sprintf("the chain of node %s is not registered in any ledger: %s was removed", v.node, v.ledgerName)})
	case !hasLedger && v.keys[v.node] != nil:
		v.rep.problem(Problem{File: v.ledgerName, Message: fmt.Sprintf("node %s has a trusted key but no ledger: its audit log was removed", v.node)})
	case hasLedger && v.chain == nil && len(v.writers) > 0:
		v.rep.problem(Problem{File: v.ledgerName, Message: fmt.Sprintf("the chain of node %s is missing: its ledger registers %d writers but none of their files is there", v.node, len(v.writers))})
	}
	for _, a := range v.anchors {
		if fileNode(a.Node) != v.node {
			continue
		}
		where := Problem{File: v.ledgerName, Message: "anchor of " + a.at}
		switch {
		case !hasLedger:
			v.rep.problem(Problem{File: v.ledgerName, Message: fmt.Sprintf("anchored node %s (anchor of %s) has no ledger: the audit directory was removed or replaced", v.node, a.at)})
			continue
		case a.LedgerSeq > uint64(len(hashes)):
			v.rep.problem(Problem{File: v.ledgerName, Message: fmt.Sprintf("anchored head no longer extended: the ledger ends at seq %d, the anchor of %s holds seq %d (the directory was replaced by an older copy, or the ledger cut)", len(hashes), a.at, a.LedgerSeq)})
		case a.LedgerSeq > 0 && hashes[a.LedgerSeq-1] != a.LedgerHead:
			v.rep.problem(Problem{File: v.ledgerName, Line: int(a.LedgerSeq), Message: fmt.Sprintf("anchored head no longer extended: ledger entry %d is not the one anchored at %s (the ledger was rewritten)", a.LedgerSeq, a.at)})
		}
		if a.ChainSeq > 0 {
			v.want[a.ChainSeq] = append(v.want[a.ChainSeq], hashRef{hash: a.ChainHead, where: where})
		}
	}
	var last uint64
	if v.chain != nil {
		var err error
		if last, err = v.chainFiles(); err != nil {
			return err
		}
	}
	v.crossCheck(last)
	if v.keys != nil {
		v.signatures()
	}
	v.fenced()
	v.rep.Nodes = append(v.rep.Nodes, v.sum)
	return nil
}

// ledger checks the ledger's own chain and collects its writers and
// claims. It returns the hash of every line.
func (v *nodeCheck) ledger() ([]string, error) {
	f, err := os.Open(filepath.Join(v.dir, v.ledgerName))
	if err != nil {
		return nil, fmt.Errorf("read audit ledger: %w", err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Mode().Perm() != 0o600 {
		v.rep.warn(Problem{File: v.ledgerName, Message: fmt.Sprintf("file mode %v: should be 0600", fi.Mode().Perm())})
	}
	var hashes []string
	var seals []*LedgerEntry
	prev := ""
	br := bufio.NewReaderSize(f, 64<<10)
	var off int64
	for lineNo := 1; ; lineNo++ {
		line, err := br.ReadBytes('\n')
		if err == nil && v.marks.Late(v.ledgerName, off, off+int64(len(line))) {
			v.afterFence.add(v.ledgerName, len(line))
		}
		off += int64(len(line))
		if errors.Is(err, io.EOF) {
			if len(line) > 0 {
				v.rep.warn(Problem{File: v.ledgerName, Line: lineNo, Message: "incomplete last entry (a writer crashed mid-entry?); ignored", Text: cut(line)})
			}
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read audit ledger: %w", err)
		}
		sum := sha256.Sum256(line)
		h := hex.EncodeToString(sum[:])
		bad := func(msg string) {
			v.rep.problem(Problem{File: v.ledgerName, Line: lineNo, Message: msg, Text: cut(line)})
		}
		var e LedgerEntry
		if err := json.Unmarshal(line, &e); err != nil {
			bad("not a valid ledger entry: " + err.Error())
			hashes, prev = append(hashes, h), h
			continue
		}
		switch {
		case e.Seq != uint64(len(hashes))+1:
			bad(fmt.Sprintf("ledger entry seq %d where %d was due: an entry was removed, inserted or reordered", e.Seq, len(hashes)+1))
		case e.Prev != prev:
			v.rep.problem(Problem{File: v.ledgerName, Line: lineNo - 1, Message: fmt.Sprintf("ledger entry was altered: its hash does not match the prev of entry %d", e.Seq)})
		case fileNode(e.Node) != v.node:
			bad(fmt.Sprintf("entry of node %q in node %s's ledger", e.Node, v.node))
		}
		hashes, prev = append(hashes, h), h
		where := Problem{File: v.ledgerName, Line: lineNo, Message: "ledger entry " + e.Kind}
		if e.ChainSeq > 0 {
			v.want[e.ChainSeq] = append(v.want[e.ChainSeq], hashRef{hash: e.ChainHead, where: where})
		}
		switch e.Kind {
		case LedgerOpen:
			v.writers[uint64(len(hashes))] = &writerState{id: uint64(len(hashes)), pid: e.PID, start: e.Start.UTC().Format("2006-01-02T15:04:05Z"), line: lineNo, chainSeq: e.ChainSeq}
		case LedgerClose:
			w := v.writers[e.Writer]
			switch {
			case w == nil:
				bad(fmt.Sprintf("close of writer %d, which the ledger never registered", e.Writer))
			case w.close != nil:
				bad(fmt.Sprintf("second close of writer %d", e.Writer))
			case w.pid != e.PID:
				bad(fmt.Sprintf("close of writer %d by pid %d; it was registered by pid %d", e.Writer, e.PID, w.pid))
			default:
				w.close, w.closeLine = &e, lineNo
				if e.LastSeq > 0 {
					v.want[e.LastSeq] = append(v.want[e.LastSeq], hashRef{hash: e.LastHash, where: where})
				}
			}
		case LedgerSeal:
			seals = append(seals, &e)
			v.sum.Seals++
		default:
			bad(fmt.Sprintf("unknown ledger entry kind %q", e.Kind))
		}
	}
	v.sum.LedgerSeq = uint64(len(hashes))
	if len(hashes) > 0 {
		v.sum.LedgerHead = hashes[len(hashes)-1]
	}
	v.ledgerLen = len(hashes)
	v.sealsSeen = seals
	return hashes, nil
}

// chainFiles checks the node's chain file by file and returns the seq of
// its last record.
func (v *nodeCheck) chainFiles() (uint64, error) {
	c := v.chain
	k := &chainCheck{rep: v.rep, w: c.w, node: v}
	if err := k.files(v.dir, c); err != nil {
		return 0, err
	}
	v.sum.ChainSeq, v.sum.ChainHead = k.seq, k.prev
	v.rep.Chains = append(v.rep.Chains, Chain{Writer: c.w.id, Files: len(c.files), Records: k.inChain, Head: k.prev})
	return k.seq, nil
}

// lostToFence reports whether records the ledger names but the chain
// lacks can be the loss of the node's fence: the node was fenced, and
// each of its audit files is still at least as long as the fencing node
// saw it after the fence, so nothing was cut from them since. An evicted
// client's writes that had not reached the storage never will (it refuses
// them), while a ledger entry written before them may have.
func (v *nodeCheck) lostToFence() bool {
	if v.marks == nil || len(v.marks.Audit) == 0 {
		return false
	}
	for name, m := range v.marks.Audit {
		fi, err := os.Stat(filepath.Join(v.dir, name))
		if err != nil || fi.Size() < m.Fenced {
			return false
		}
	}
	return true
}

// fenceLoss says why lostToFence's records are missing.
func (v *nodeCheck) fenceLoss() string {
	return fmt.Sprintf("node %s was fenced, and records it wrote before the fence never reached the storage (a fenced client's unflushed writes, which the storage refuses); its audit files are as long as at the fence, so nothing was cut from them since", v.node)
}

// crossCheck compares what the ledger claims with what the chain holds.
func (v *nodeCheck) crossCheck(last uint64) {
	for _, seq := range slices.Sorted(func(yield func(uint64) bool) {
		for s := range v.want {
			if !yield(s) {
				return
			}
		}
	}) {
		for _, ref := range v.want[seq] {
			if seq > last && v.chain != nil {
				p := ref.where
				if v.lostToFence() {
					p.Message = fmt.Sprintf("the chain ends at seq %d but %s records its record %d: %s", last, p.Message, seq, v.fenceLoss())
					v.rep.warn(p)
					continue
				}
				p.Message = fmt.Sprintf("the chain ends at seq %d but %s records its record %d: records were cut from the end of the chain, or the chain was rewritten shorter", last, p.Message, seq)
				v.rep.problem(p)
			}
		}
	}
	var led *os.File
	if v.ledgerLen > 0 {
		led, _ = os.Open(filepath.Join(v.dir, v.ledgerName))
		if led != nil {
			defer led.Close()
		}
	}
	opened, closed := v.newerEntries()
	for _, r := range v.late {
		if pid, ok := opened[r.writer]; !ok || pid != r.pid {
			p := r.where
			p.Message = fmt.Sprintf("record of writer %d (pid %d), which the ledger does not register: a forged record, or the ledger was cut", r.writer, r.pid)
			v.rep.problem(p)
		}
	}
	for _, id := range slices.Sorted(func(yield func(uint64) bool) {
		for id := range v.writers {
			if !yield(id) {
				return
			}
		}
	}) {
		w := v.writers[id]
		v.sum.Writers++
		if w.close != nil {
			v.sum.Closed++
			switch {
			case w.close.Count > w.events && v.chain != nil && v.lostToFence():
				v.rep.warn(Problem{File: v.ledgerName, Line: w.closeLine, Message: fmt.Sprintf("writer %d (pid %d) closed with %d events; the chain holds %d of them: %s", id, w.pid, w.close.Count, w.events, v.fenceLoss())})
			case w.close.Count != w.events && v.chain != nil:
				v.rep.problem(Problem{File: v.ledgerName, Line: w.closeLine, Message: fmt.Sprintf("writer %d (pid %d) closed with %d events; the chain holds %d of them: its records were removed", id, w.pid, w.close.Count, w.events)})
			}
			continue
		}
		if led != nil {
			if held, err := lockHeld(led, writerLockBase+int64(id), 1); err == nil && held {
				v.sum.Running++
				continue
			}
		}
		// A writer appends its close before it lets its lock go, so the
		// ledger read after the lock was seen free shows a close made
		// while Verify was reading.
		if !closed[id] {
			_, closed = v.newerEntries()
		}
		if closed[id] {
			v.sum.Closed++
			continue
		}
		v.sum.Crashed++
		v.rep.Crashed = append(v.rep.Crashed, Problem{File: v.ledgerName, Line: w.line,
			Message: fmt.Sprintf("writer ended without closing: writer %d (pid %d, started %s, %d events in the chain) is gone with no close entry: it crashed, or its last records and close were cut", id, w.pid, w.start, w.events)})
	}
}

// newerEntries reads the ledger entries appended since Verify read the
// ledger: the writers opened (with their pids) and closed meanwhile.
func (v *nodeCheck) newerEntries() (opened map[uint64]int, closed map[uint64]bool) {
	opened, closed = map[uint64]int{}, map[uint64]bool{}
	f, err := os.Open(filepath.Join(v.dir, v.ledgerName))
	if err != nil {
		return opened, closed
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, 64<<10)
	for n := 1; ; n++ {
		line, err := br.ReadBytes('\n')
		if err != nil {
			return opened, closed
		}
		if n <= v.ledgerLen {
			continue
		}
		var e LedgerEntry
		if json.Unmarshal(line, &e) != nil || e.Seq != uint64(n) {
			return opened, closed
		}
		switch e.Kind {
		case LedgerOpen:
			opened[e.Seq] = e.PID
		case LedgerClose:
			closed[e.Writer] = true
		}
	}
}

// signatures checks every seal against the trusted keys.
func (v *nodeCheck) signatures() {
	keys := v.keys[v.node]
	if keys == nil {
		if v.ledgerLen > 0 {
			v.rep.problem(Problem{File: v.ledgerName, Message: fmt.Sprintf("node %s has no trusted key among --keys: its signatures can't be checked", v.node)})
		}
		return
	}
	if v.ledgerLen == 0 {
		return
	}
	valid := verifySeals(v.sealsSeen, keys)
	for i, e := range v.sealsSeen {
		if !valid[i] {
			v.rep.problem(Problem{File: v.ledgerName, Line: int(e.Seq), Message: fmt.Sprintf("seal %d is not signed by a trusted key of node %s (key %q): the ledger was rewritten and signed again", e.Seq, v.node, e.Key)})
			continue
		}
		v.sum.SignedUpTo = e.Seq
	}
	switch {
	case v.sum.SignedUpTo == 0:
		v.rep.problem(Problem{File: v.ledgerName, Message: fmt.Sprintf("node %s has no checkpoint signed by its trusted key", v.node)})
	case v.sum.SignedUpTo < uint64(v.ledgerLen):
		v.rep.warn(Problem{File: v.ledgerName, Message: fmt.Sprintf("%d ledger entries after the last signed checkpoint (seq %d) are only chained, not signed", uint64(v.ledgerLen)-v.sum.SignedUpTo, v.sum.SignedUpTo)})
	}
}

// verifySeals checks seals against keys on every core: a signature costs
// about 60 µs, the one part of verify that is CPU-bound on a month of log.
func verifySeals(seals []*LedgerEntry, keys []ed25519.PublicKey) []bool {
	valid := make([]bool, len(seals))
	workers := min(runtime.GOMAXPROCS(0), len(seals))
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(seals); i += workers {
				valid[i] = verifySeal(seals[i], keys)
			}
		}()
	}
	wg.Wait()
	return valid
}

// verifyChain checks a legacy per-process chain.
func verifyChain(dir string, c *chainReader, rep *Report, node *nodeCheck) error {
	k := &chainCheck{rep: rep, w: c.w, node: node}
	if err := k.files(dir, c); err != nil {
		return err
	}
	rep.Chains = append(rep.Chains, Chain{Writer: c.w.id, Files: len(c.files), Records: k.inChain, Head: k.prev, Closed: k.closed, Legacy: true})
	return nil
}

// chainCheck is the state of one chain's verification.
type chainCheck struct {
	rep        *Report
	w          writerID
	node       *nodeCheck // nil for a legacy chain
	seq        uint64     // seq of the last record
	prev       string     // hash of the last line
	prevLine   []byte     // the last line, to show if the next reveals it was altered
	prevFile   string
	prevLineNo int
	lastRec    verifyFields
	events     uint64
	closed     bool
	resync     bool // after a problem: take the next record as the new base
	inChain    int  // records seen in this chain
	fileRecs   int  // records seen in the current file
	nextFile   string
}

// files checks the chain's files in order.
func (k *chainCheck) files(dir string, c *chainReader) error {
	rep := k.rep
	want := 1
	for i := 0; i < len(c.files); i++ {
		if c.files[i].n != want && k.node != nil && k.nextFile != "" {
			// readdir promises nothing of entries made while it reads: a
			// file rotated in meanwhile may be missing from the listing
			// while a later one is in it. The checkpoint names it.
			p := parseName(k.nextFile)
			if fi, err := os.Lstat(filepath.Join(dir, k.nextFile)); err == nil && fi.Mode().IsRegular() && p.kind == nodeChainFile && p.w.node == c.w.node && p.n == want {
				c.files = slices.Insert(c.files, i, chainFile{name: k.nextFile, n: p.n, day: p.day})
			}
		}
		cf := c.files[i]
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
		if k.nextFile != "" && k.nextFile != cf.name {
			rep.problem(Problem{File: cf.name, Message: fmt.Sprintf("the rotation checkpoint before it names %q as the next file", k.nextFile)})
		}
		k.nextFile = ""
		size, err := k.file(dir, cf.name, last)
		if err != nil {
			return err
		}
		rotated := k.fileRecs > 0 && k.lastRec.Kind == KindCheckpoint && k.lastRec.Reason == "rotate"
		if last && rotated && k.node != nil {
			// Rotated since the directory was listed: read on.
			p := parseName(k.nextFile)
			if fi, err := os.Lstat(filepath.Join(dir, k.nextFile)); err == nil && fi.Mode().IsRegular() && p.kind == nodeChainFile && p.w.node == c.w.node {
				c.files = append(c.files, chainFile{name: k.nextFile, n: p.n, day: p.day})
				continue
			}
		}
		if last {
			if rotated {
				rep.problem(Problem{File: cf.name, Message: fmt.Sprintf("chain ends in a rotation checkpoint but file %d is missing", cf.n+1)})
			}
			break
		}
		switch {
		case size == 0:
			rep.problem(Problem{File: cf.name, Message: "empty file in the middle of the chain: its records were removed"})
		case rotated:
		case i+1 == len(c.files)-1 && c.isEmpty(dir, i+1):
			rep.warn(Problem{File: cf.name, Message: "no rotation checkpoint: the writer stopped while rotating"})
		default:
			rep.problem(Problem{File: cf.name, Message: "file does not end in a rotation checkpoint: records were removed from its end"})
		}
	}
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
	if k.node != nil && !lastFile {
		// A rotation out of it may be under way: its writer holds the
		// lock until the checkpoint is written, and nobody appends after.
		if err := waitUnlocked(f); err != nil {
			return 0, err
		}
		if fi, err = f.Stat(); err != nil {
			return 0, fmt.Errorf("read audit log: %w", err)
		}
	}
	k.fileRecs = 0
	br := bufio.NewReaderSize(f, 256<<10)
	var long []byte
	var off int64
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
		if k.node != nil && k.node.marks.Late(name, off, off+int64(len(line))) {
			k.node.afterFence.add(name, len(line))
		}
		off += int64(len(line))
		k.line(name, lineNo, line)
	}
}

// verifyFields are the fields of a record that Verify checks; decoding
// only these keeps verify fast.
type verifyFields struct {
	Kind   string `json:"kind"`
	Node   string `json:"node"`
	PID    int    `json:"pid"`
	Writer uint64 `json:"writer"`
	Seq    uint64 `json:"seq"`
	Prev   string `json:"prev"`
	Count  uint64 `json:"count"`
	Head   string `json:"head"`
	Reason string `json:"reason"`
	Next   string `json:"next"`
}

// parseFast reads the fields from a line laid out as Log writes it: the
// chain's fields first, in a fixed order, before any value a door
// supplied, so the first occurrence of each key is the record's own. It
// reports false for any other layout, which json.Unmarshal then reads.
// The rest of the line is not parsed: its bytes are covered by the hash
// the next record (or the ledger) holds.
func (r *verifyFields) parseFast(line []byte) bool {
	if !bytes.HasPrefix(line, []byte(`{"time":"`)) {
		return false
	}
	end := bytes.IndexByte(line[len(`{"time":"`):], '"')
	if end < 0 {
		return false
	}
	rest := line[len(`{"time":"`)+end+1:]
	var ok bool
	if r.Node, rest, ok = stringField(rest, `,"node":"`); !ok {
		return false
	}
	var pid uint64
	if pid, rest, ok = uintField(rest, `,"pid":`); !ok {
		return false
	}
	r.PID = int(pid)
	if bytes.HasPrefix(rest, []byte(`,"writer":`)) {
		if r.Writer, rest, ok = uintField(rest, `,"writer":`); !ok {
			return false
		}
	}
	if r.Kind, rest, ok = stringField(rest, `,"kind":"`); !ok {
		return false
	}
	if r.Seq, rest, ok = uintField(rest, `,"seq":`); !ok {
		return false
	}
	if r.Prev, rest, ok = stringField(rest, `,"prev":"`); !ok {
		return false
	}
	if r.Kind != KindCheckpoint {
		return true
	}
	if r.Count, rest, ok = uintField(rest, `,"count":`); !ok {
		return false
	}
	if r.Head, rest, ok = stringField(rest, `,"head":"`); !ok {
		return false
	}
	if r.Reason, rest, ok = stringField(rest, `,"reason":"`); !ok {
		return false
	}
	if bytes.HasPrefix(rest, []byte(`,"next":"`)) {
		if r.Next, rest, ok = stringField(rest, `,"next":"`); !ok {
			return false
		}
	}
	return string(rest) == "}\n"
}

// stringField reads key and a string without escapes at the start of b.
func stringField(b []byte, key string) (string, []byte, bool) {
	if !bytes.HasPrefix(b, []byte(key)) {
		return "", nil, false
	}
	b = b[len(key):]
	j := bytes.IndexByte(b, '"')
	if j < 0 || bytes.IndexByte(b[:j], '\\') >= 0 {
		return "", nil, false
	}
	return string(b[:j]), b[j+1:], true
}

func uintField(b []byte, key string) (uint64, []byte, bool) {
	if !bytes.HasPrefix(b, []byte(key)) {
		return 0, nil, false
	}
	b = b[len(key):]
	var n uint64
	i := 0
	for ; i < len(b) && b[i] >= '0' && b[i] <= '9' && i < 19; i++ {
		n = n*10 + uint64(b[i]-'0')
	}
	if i == 0 || i == len(b) || (b[i] != ',' && b[i] != '}') {
		return 0, nil, false
	}
	return n, b[i:], true
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

	var r verifyFields
	var err error
	if !r.parseFast(line) {
		r = verifyFields{}
		err = json.Unmarshal(line, &r)
	}
	if err == nil && r.Kind != KindEvent && r.Kind != KindCheckpoint {
		err = fmt.Errorf("unknown record kind %q", r.Kind)
	}
	if err != nil {
		bad("not a valid record: " + err.Error())
		k.lastRec = verifyFields{}
		return
	}
	var w *writerState
	if k.node != nil {
		w = k.node.writers[r.Writer]
	}
	switch {
	case k.node == nil && (r.PID != k.w.pid || fileNode(r.Node) != k.w.node):
		bad(fmt.Sprintf("record of node %q pid %d in another writer's file", r.Node, r.PID))
	case k.node != nil && fileNode(r.Node) != k.w.node:
		bad(fmt.Sprintf("record of node %q in node %s's chain", r.Node, k.w.node))
	case k.node != nil && w == nil && r.Writer > uint64(k.node.ledgerLen):
		// Registered after Verify read the ledger, or forged: settled
		// once the ledger is read again.
		k.node.late = append(k.node.late, lateRecord{writer: r.Writer, pid: r.PID, where: Problem{File: name, Line: lineNo, Text: cut(line)}})
	case k.node != nil && (w == nil || w.pid != r.PID):
		bad(fmt.Sprintf("record of writer %d (pid %d), which the ledger does not register: a forged record, or the ledger was cut", r.Writer, r.PID))
	case k.node != nil && r.Seq <= w.chainSeq:
		bad(fmt.Sprintf("record of writer %d before its registration (chain seq %d)", r.Writer, w.chainSeq))
	case k.node != nil && w.close != nil && r.Seq > w.close.ChainSeq:
		bad(fmt.Sprintf("record of writer %d after its close", r.Writer))
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
	if k.node != nil {
		if refs := k.node.want[r.Seq]; refs != nil {
			h := hex.EncodeToString(sum[:])
			for _, ref := range refs {
				if ref.hash != h {
					p := ref.where
					p.Message = fmt.Sprintf("record %d of the chain (%s:%d) is not the one %s recorded: the chain was rewritten", r.Seq, name, lineNo, p.Message)
					k.rep.problem(p)
				}
			}
		}
	}
	switch r.Kind {
	case KindEvent:
		k.events++
		k.rep.Events++
		if w != nil {
			w.events++
		}
	case KindCheckpoint:
		if k.node == nil {
			if r.Count != k.events || r.Head != r.Prev {
				bad(fmt.Sprintf("checkpoint says %d events, head %.12s; the chain has %d, head %.12s", r.Count, r.Head, k.events, r.Prev))
			}
			if r.Reason == "close" {
				k.closed = true
			}
			return
		}
		if r.Reason != "rotate" || r.Count != uint64(k.fileRecs) || r.Head != r.Prev {
			bad(fmt.Sprintf("%s checkpoint says %d records, head %.12s; the file has %d, head %.12s", r.Reason, r.Count, r.Head, k.fileRecs, r.Prev))
		}
		k.nextFile = r.Next
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
