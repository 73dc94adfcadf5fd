package audit

import (
	"bufio"
	"bytes"
	"container/heap"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/agentloom/loomfs/fence"
)

// Filter selects event records. Zero fields match everything.
type Filter struct {
	// Scope is a scope hash, or SPACE/AGENT/SESSION (a main scope: the
	// actor has no instance) or SPACE/AGENT/SESSION/RUN/INSTANCE (one child
	// instance), matched against the record's actor.
	Scope  string
	Since  time.Time // records at or after
	Until  time.Time // records before
	Source Source
	Op     string
	Path   string // string prefix of the path or the new path
	Result string
	Node   string // records of this node only
	Trace  string // records of this trace only: a call end to end
}

// Match reports whether r is an event record that f selects.
func (f Filter) Match(r Record) bool {
	switch {
	case r.Kind != KindEvent,
		f.Scope != "" && !matchScope(f.Scope, r),
		!f.Since.IsZero() && r.Time.Before(f.Since),
		!f.Until.IsZero() && !r.Time.Before(f.Until),
		f.Source != "" && r.Source != f.Source,
		f.Op != "" && r.Op != f.Op,
		f.Path != "" && !strings.HasPrefix(r.Path, f.Path) && !strings.HasPrefix(r.NewPath, f.Path),
		f.Result != "" && r.Result != f.Result,
		f.Node != "" && r.Node != f.Node,
		f.Trace != "" && r.TraceID != f.Trace:
		return false
	}
	return true
}

func matchScope(scope string, r Record) bool {
	if !strings.Contains(scope, "/") {
		return r.Scope == scope
	}
	a := r.Actor
	switch p := strings.Split(scope, "/"); len(p) {
	case 3:
		return a.Space == p[0] && a.Agent == p[1] && a.Session == p[2] && a.Instance == ""
	case 5:
		return a.Space == p[0] && a.Agent == p[1] && a.Session == p[2] && a.Run == p[3] && a.Instance == p[4]
	}
	return false
}

// Query calls fn for every event record in dir that f matches, oldest first
// across all chains. It skips lines it cannot parse: Verify is the judge of
// those. An error from fn stops the query and is returned.
func Query(dir string, f Filter, fn func(Record) error) error {
	return QueryWith(dir, f, nil, fn)
}

// ScanProgress says how far a query has read.
type ScanProgress struct {
	Files, TotalFiles int   // files opened, files that can hold matches
	Bytes, TotalBytes int64 // bytes read, bytes of those files
	Records           int64 // records read
	Elapsed           time.Duration
}

// progressEvery is how often QueryWith reports progress.
var progressEvery = time.Second

// QueryWith is Query that reads only the files that can hold matches (a
// node chain's file names carry its node and the day of its events) and
// calls progress, if set, about once a second while it reads.
func QueryWith(dir string, f Filter, progress func(ScanProgress), fn func(Record) error) error {
	chains, err := scanDir(dir)
	if err != nil {
		return err
	}
	st := &scanStats{start: time.Now(), fn: progress}
	kept := chains[:0]
	for _, c := range chains {
		if f.Node != "" && c.w.node != fileNode(f.Node) {
			continue
		}
		if c.w.kind == nodeChainFile {
			c.files = slices.DeleteFunc(c.files, func(cf chainFile) bool {
				return !f.Until.IsZero() && !cf.day.Before(f.Until) ||
					!f.Since.IsZero() && !cf.day.Add(24*time.Hour).After(f.Since)
			})
			if len(c.files) == 0 {
				continue
			}
			c.w.start = c.files[0].day
		} else if !f.Until.IsZero() && !c.w.start.Before(f.Until) {
			continue
		}
		for _, cf := range c.files {
			if fi, err := os.Stat(filepath.Join(dir, cf.name)); err == nil {
				st.p.TotalBytes += fi.Size()
			}
		}
		st.p.TotalFiles += len(c.files)
		c.stats = st
		c.since = f.Since
		kept = append(kept, c)
	}
	sortChains(kept)
	return mergeChains(dir, kept, func(r Record) error {
		st.tick()
		if f.Match(r) {
			return fn(r)
		}
		return nil
	})
}

// scanStats counts what a query has read, for its progress reports.
type scanStats struct {
	p     ScanProgress
	start time.Time
	last  time.Time
	fn    func(ScanProgress)
}

func (s *scanStats) tick() {
	s.p.Records++
	if s.fn == nil || progressEvery > 0 && s.p.Records%4096 != 0 {
		return
	}
	now := time.Now()
	if now.Sub(s.start) < progressEvery || now.Sub(s.last) < progressEvery {
		return
	}
	s.last = now
	s.p.Elapsed = now.Sub(s.start)
	s.fn(s.p)
}

// Follow calls fn for every event record in dir, oldest first, and then
// for each record appended later, across rotations and new writers, until
// ctx is done; it then returns ctx.Err(). It polls rather than waits on
// inotify, which cannot see writes made by other nodes of a shared root.
func Follow(ctx context.Context, dir string, fn func(Record) error) error {
	return Tail(ctx, dir, Filter{}, -1, true, fn)
}

// pollInterval is how often Tail looks for new records while following.
var pollInterval = 250 * time.Millisecond

// Tail calls fn for the last n records in dir that f matches (all of them
// when n < 0), oldest first; with follow it then calls fn for each matching
// record appended later until ctx is done, and returns ctx.Err().
func Tail(ctx context.Context, dir string, f Filter, n int, follow bool, fn func(Record) error) error {
	chains, err := scanDir(dir)
	if err != nil {
		return err
	}
	var ring []Record // the last n matches; ring[seen%n] is the oldest once full
	seen := 0
	err = mergeChains(dir, chains, func(r Record) error {
		switch {
		case !f.Match(r):
		case n < 0:
			return fn(r)
		case n > 0:
			if len(ring) < n {
				ring = append(ring, r)
			} else {
				ring[seen%n] = r
			}
			seen++
		}
		return nil
	})
	if err != nil {
		return err
	}
	for i := range ring {
		if err := fn(ring[(seen-len(ring)+i)%len(ring)]); err != nil {
			return err
		}
	}
	if !follow {
		return nil
	}
	known := make(map[string]*chainReader, len(chains))
	for _, c := range chains {
		known[c.w.id] = c
	}
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		fresh, err := scanDir(dir)
		if err != nil {
			return err
		}
		var batch []Record
		for _, c := range fresh {
			old := known[c.w.id]
			if old == nil {
				known[c.w.id] = c
				old = c
			} else {
				old.setFiles(c.files)
				old.marks = c.marks
			}
			for !old.done {
				r, ok, err := old.next(dir)
				if err != nil {
					return err
				}
				if !ok {
					break
				}
				if f.Match(r) {
					batch = append(batch, r)
				}
			}
		}
		slices.SortStableFunc(batch, func(a, b Record) int { return a.Time.Compare(b.Time) })
		for _, r := range batch {
			if err := fn(r); err != nil {
				return err
			}
		}
	}
}

// chainReader reads one writer's files in order and remembers where it
// stopped, so that a follower can pick up there.
type chainReader struct {
	w     writerID
	files []chainFile // by number

	fi       int   // index in files of the file being read
	off      int64 // bytes of complete lines consumed from files[fi]
	f        *os.File
	br       *bufio.Reader
	lastKind string
	done     bool   // the chain ended with a close checkpoint
	head     Record // next record, while merging
	stats    *scanStats
	since    time.Time // skip records written before, without decoding them
	// marks are the fence marks of the chain's node, if it was fenced:
	// records it wrote after a fence are skipped.
	marks *fence.Marks
}

type chainFile struct {
	name string
	n    int
	day  time.Time // node chain files: the day of their events
}

// groupChains groups the chain files among ents by chain: one per node, and
// one per process for legacy files. Ledgers are left out. bad, if set, is
// told of every other entry: isLog says whether its name is a log file's
// (then it is not a regular file).
func groupChains(ents []os.DirEntry, bad func(e os.DirEntry, isLog bool)) []*chainReader {
	byID := map[string]*chainReader{}
	var chains []*chainReader
	for _, e := range ents {
		p := parseName(e.Name())
		if p.kind == ledgerFile && e.Type().IsRegular() {
			continue
		}
		if p.kind == notAuditFile || !e.Type().IsRegular() {
			if bad != nil {
				bad(e, p.kind != notAuditFile)
			}
			continue
		}
		c := byID[p.w.id]
		if c == nil {
			c = &chainReader{w: p.w}
			byID[p.w.id] = c
			chains = append(chains, c)
		}
		c.files = append(c.files, chainFile{name: e.Name(), n: p.n, day: p.day})
	}
	for _, c := range chains {
		slices.SortFunc(c.files, func(a, b chainFile) int { return a.n - b.n })
		if c.w.kind == nodeChainFile {
			c.w.start = c.files[0].day
		}
	}
	return chains
}

// scanDir groups the chain files in dir by chain, ordered by start time.
func scanDir(dir string) ([]*chainReader, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read audit directory: %w", err)
	}
	chains := groupChains(ents, nil)
	marks, err := fencedMarks(dir)
	if err != nil {
		return nil, err
	}
	for _, c := range chains {
		if c.w.kind == nodeChainFile {
			c.marks = marks[c.w.node]
		}
	}
	sortChains(chains)
	return chains, nil
}

func sortChains(chains []*chainReader) {
	slices.SortFunc(chains, func(a, b *chainReader) int {
		if c := a.w.start.Compare(b.w.start); c != 0 {
			return c
		}
		return strings.Compare(a.w.id, b.w.id)
	})
}

// next returns the chain's next event record, moving on to the next file
// once the current one is finished. A partial last line is left unread, to
// be read again once it is complete.
func (c *chainReader) next(dir string) (Record, bool, error) {
	for !c.done && c.fi < len(c.files) {
		if c.f == nil {
			f, err := os.Open(filepath.Join(dir, c.files[c.fi].name))
			if errors.Is(err, os.ErrNotExist) { // removed by retention
				c.fi, c.off = c.fi+1, 0
				continue
			}
			if err != nil {
				return Record{}, false, fmt.Errorf("read audit log: %w", err)
			}
			if _, err := f.Seek(c.off, io.SeekStart); err != nil {
				f.Close()
				return Record{}, false, fmt.Errorf("read audit log: %w", err)
			}
			c.f = f
			if c.stats != nil {
				c.stats.p.Files++
			}
			if c.br == nil {
				c.br = bufio.NewReaderSize(f, 64<<10)
			} else {
				c.br.Reset(f)
			}
		}
		line, err := c.br.ReadSlice('\n')
		if err == nil {
			c.off += int64(len(line))
			if c.stats != nil {
				c.stats.p.Bytes += int64(len(line))
			}
			if c.marks.Late(c.files[c.fi].name, c.off-int64(len(line)), c.off) {
				continue
			}
			if !c.since.IsZero() && writtenBefore(line, c.since) {
				continue
			}
			r, perr := parseRecord(line)
			if perr != nil {
				continue
			}
			c.lastKind = r.Kind
			if r.Kind == KindCheckpoint && r.Reason == "close" {
				c.done = true
				c.close()
			}
			if r.Kind == KindEvent {
				return r, true, nil
			}
			continue
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			// A line longer than the buffer: read it whole.
			rest, rerr := c.br.ReadBytes('\n')
			if rerr == nil {
				full := append(append([]byte(nil), line...), rest...)
				c.off += int64(len(full))
				if c.marks.Late(c.files[c.fi].name, c.off-int64(len(full)), c.off) {
					continue
				}
				if r, perr := parseRecord(full); perr == nil {
					c.lastKind = r.Kind
					if r.Kind == KindEvent {
						return r, true, nil
					}
				}
				continue
			}
			err = rerr
		}
		if !errors.Is(err, io.EOF) && !errors.Is(err, bufio.ErrBufferFull) {
			c.close()
			return Record{}, false, fmt.Errorf("read audit log: %w", err)
		}
		// End of what is there now. Move on only when this file is
		// finished: it ended in a rotation checkpoint, or the writer has
		// started writing the next one.
		c.close()
		if c.fi+1 < len(c.files) && (c.lastKind == KindCheckpoint || c.nonEmpty(dir, c.fi+1)) {
			c.fi, c.off, c.lastKind = c.fi+1, 0, ""
			continue
		}
		return Record{}, false, nil
	}
	return Record{}, false, nil
}

// setFiles replaces the file list with a fresh scan, keeping the place of
// the reader even if retention removed files before it.
func (c *chainReader) setFiles(files []chainFile) {
	var cur int
	switch {
	case c.fi < len(c.files):
		cur = c.files[c.fi].n
	case len(c.files) > 0:
		cur = c.files[len(c.files)-1].n + 1
	}
	c.files = files
	c.fi = len(files)
	for i, f := range files {
		if f.n >= cur {
			c.fi = i
			if f.n != cur {
				c.off, c.lastKind = 0, ""
			}
			break
		}
	}
}

func (c *chainReader) nonEmpty(dir string, i int) bool {
	fi, err := os.Stat(filepath.Join(dir, c.files[i].name))
	return err == nil && fi.Size() > 0
}

func (c *chainReader) close() {
	if c.f != nil {
		c.f.Close()
		c.f = nil
	}
}

// writtenBefore reports whether line is a record stamped before t, reading
// only the time its writer puts first. A line it can't read that way is
// not before: parseRecord decides.
func writtenBefore(line []byte, t time.Time) bool {
	const key = `{"time":"`
	if !bytes.HasPrefix(line, []byte(key)) {
		return false
	}
	end := bytes.IndexByte(line[len(key):], '"')
	if end < 0 {
		return false
	}
	ts, err := time.Parse(time.RFC3339Nano, string(line[len(key):len(key)+end]))
	return err == nil && ts.Before(t)
}

// parseRecord decodes one line, restoring paths that are not UTF-8.
func parseRecord(line []byte) (Record, error) {
	var r Record
	if err := json.Unmarshal(line, &r); err != nil {
		return Record{}, err
	}
	if r.Kind != KindEvent && r.Kind != KindCheckpoint {
		return Record{}, fmt.Errorf("unknown record kind %q", r.Kind)
	}
	for _, p := range []struct {
		b64 string
		dst *string
	}{{r.PathB64, &r.Path}, {r.NewPathB64, &r.NewPath}} {
		if p.b64 == "" {
			continue
		}
		b, err := base64.StdEncoding.DecodeString(p.b64)
		if err != nil {
			return Record{}, fmt.Errorf("bad base64 path: %w", err)
		}
		*p.dst = string(b)
	}
	return r, nil
}

// mergeChains calls fn for every event record of chains in time order. A
// chain is opened only once the merge reaches its start time, so a
// directory of many finished chains holds few files open at once.
func mergeChains(dir string, chains []*chainReader, fn func(Record) error) error {
	h := &recordHeap{}
	defer func() {
		for _, c := range chains {
			c.close()
		}
	}()
	next := 0
	for {
		for next < len(chains) && (h.Len() == 0 || !chains[next].w.start.After((*h)[0].head.Time)) {
			c := chains[next]
			next++
			r, ok, err := c.next(dir)
			if err != nil {
				return err
			}
			if ok {
				c.head = r
				heap.Push(h, c)
			}
		}
		if h.Len() == 0 {
			return nil
		}
		c := (*h)[0]
		if err := fn(c.head); err != nil {
			return err
		}
		r, ok, err := c.next(dir)
		if err != nil {
			return err
		}
		if ok {
			c.head = r
			heap.Fix(h, 0)
		} else {
			heap.Pop(h)
			c.close()
		}
	}
}

type recordHeap []*chainReader

func (h recordHeap) Len() int { return len(h) }
func (h recordHeap) Less(i, j int) bool {
	a, b := h[i].head, h[j].head
	if !a.Time.Equal(b.Time) {
		return a.Time.Before(b.Time)
	}
	if h[i].w.id != h[j].w.id {
		return h[i].w.id < h[j].w.id
	}
	return a.Seq < b.Seq
}
func (h recordHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *recordHeap) Push(x any)   { *h = append(*h, x.(*chainReader)) }
func (h *recordHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
