package store

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentloom/loomfs/newname"
	"github.com/agentloom/loomfs/nodeid"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
)

// The change journal lists the paths of a scope that loomfs changed, so a
// snapshot can look at those instead of walking the whole tree.
//
// Each process that changes a scope appends to its own file in the scope's
// state directory (JournalDir), one line per change, written after the
// change is made:
//
//	c PATH   the object at PATH was created, changed or removed
//	t PATH   the whole subtree at PATH may differ (a directory renamed,
//	         cleared or restored)
//	o PATH   the file at PATH was opened for writing: it changed, and
//	         may go on changing until a matching x line
//	x PATH   an open for writing ended; PATH is where its file is now
//	end      the writer closed the file cleanly; nothing follows
//
// A c, t, o or x line may go on, after a tab, with a JSON object saying
// what the change was, for the change feed (package changes): op
// (create, write, delete, rename, mkdir, setattr, symlink, tree), src
// (tool or projection), call (the tool call's or the command's call id),
// ts (Unix time in milliseconds), and for a rename, on the line of the
// old path, to (the new path) and, on the line of the new path, from (the
// old). Every field may be missing (a line of an older writer has none);
// a reader that only wants paths ignores the tab and what follows, and a
// path on a line never holds a tab (AppendPathLine quotes it). The node
// and process that wrote a line are in its file's name
// (NODE.PID.RANDOM.log).
//
// The writes of an open are not noted one by one (a line per write(2)
// would cost a system call each), nor when the file is closed: the
// mount's daemon hears of a close only after close(2) has returned. So
// the x line of an open is no change's line. The two lines of an open,
// its o line and its x line, wait up to journalLinger to go out with the
// next line in one write(2) (tar -x makes one append for several files
// instead of two for each, each a round trip on a shared filesystem;
// every other line goes out at once, after those waiting). Nothing is
// lost by the wait: a writer that dies with lines waiting leaves its file
// unlocked and unfinished, which no reader trusts. A reader in another
// process sees a waiting line up to journalLinger late, so a reader that
// must see every change made before some moment (a snapshot) reads the
// journals no earlier than JournalLag after it (AwaitJournalLines); a
// reader in the writer's own process gets them at once. So
// a reader must look at the path of every open still going each time it
// reads, and the offset a reader keeps in a live file stops at the first
// o line not yet matched by an x (JournalFile.Size). The lines are
// matched by count: an open file may be renamed. A writer that starts a
// new file (a rotation, or after a failed write) begins it with an o
// line for each of its opens still going, at the path its file has now.
//
// A writer holds an OFD write lock on its file for as long as it may
// append (NFSv4 carries such locks between nodes). A reader that finds a
// file unlocked and without its "end" line knows its writer died, possibly
// between a change and its line, and must not trust the journal for the
// changes it covers: a snapshot then walks the whole scope.
//
// Changes made to the backing store by anything other than loomfs are not
// in the journal; a full snapshot sees them.

// JournalDir holds the change journals in the scope's state directory.
const JournalDir = "journal"

// journalRotate is the size at which a writer closes its file and starts
// another, so a long-lived mount never grows one file without bound. A
// variable for tests.
var journalRotate int64 = 8 << 20

const (
	journalSuffix = ".log"
	journalEnd    = "end\n"
)

// journalLinger is the longest an open's line waits for another line to
// go out with: well under the follower's pass gap on one node (25 ms) and
// its poll between nodes (500 ms), so a reader in another process sees
// an open hardly later than before. A variable for tests.
var journalLinger = 10 * time.Millisecond

// JournalLag is how long after its change a line is taken to have
// reached its journal file: twice journalLinger, which leaves a writer's
// timer as long again to fire.
func JournalLag() time.Duration { return 2 * journalLinger }

// AwaitJournalLines waits until JournalLag has passed since t, so that
// the journals then hold the line of every change made before t by a
// writer still running, unless that writer was kept from running for
// longer than journalLinger.
func AwaitJournalLines(ctx context.Context, t time.Time) error {
	wait, cancel := context.WithDeadline(ctx, t.Add(JournalLag()))
	defer cancel()
	<-wait.Done()
	return ctx.Err()
}

// journal is one process's change journal for one scope.
type journal struct {
	mu     sync.Mutex
	f      *os.File // nil until the first change, and after a failure
	size   int64
	closed bool
	buf    []byte
	opens  map[*Open]struct{} // noted by NoteOpen, not yet by NoteClose
	names  map[string]bool    // every file it wrote (OwnJournal)
	// lines counts the lines noted, by the source of their change
	// (JournalLinesExcept).
	lines map[string]uint64

	// waiting holds the lines of opens (o and x) for f not yet
	// written: they go out before the next line, in the same write(2),
	// or when linger fires.
	waiting []byte
	linger  *time.Timer
}

// Open is an open for writing that NoteOpen put in the change journal.
type Open struct {
	path func() string
	by   Change
}

// Change says what a change was and who made it, as a journal line
// carries it for the change feed. The zero Change says nothing beyond the
// path.
type Change struct {
	Op     string `json:"op,omitempty"`
	To     string `json:"to,omitempty"`
	From   string `json:"from,omitempty"`
	Source string `json:"src,omitempty"`
	Call   string `json:"call,omitempty"`
	// Time is set when the line is written: Unix milliseconds.
	Time int64 `json:"ts,omitempty"`
}

// Change ops, as the journal and the change feed name them.
const (
	OpCreate  = "create"
	OpWrite   = "write"
	OpDelete  = "delete"
	OpRename  = "rename"
	OpMkdir   = "mkdir"
	OpSetattr = "setattr"
	OpSymlink = "symlink"
	OpTree    = "tree"
)

// Sources of a change.
const (
	SourceTool       = "tool"
	SourceProjection = "projection"
	// SourcePlatform is the platform's own door (package stage) and the
	// layout an opening makes.
	SourcePlatform = "platform"
	// SourceLoomfs marks loomfs's own files (a projection's health
	// probe): in the journal for snapshots, never in the change feed.
	SourceLoomfs = "loomfs"
)

type changeKey struct{}

// WithChange returns ctx carrying who makes the changes done under it
// (source and call id), for the journal lines of the store's own writes.
func WithChange(ctx context.Context, c Change) context.Context {
	return context.WithValue(ctx, changeKey{}, c)
}

// changeBy is who ctx says makes a change, with op.
func changeBy(ctx context.Context, op string) Change {
	c, _ := ctx.Value(changeKey{}).(Change)
	c.Op = op
	return c
}

// ReadyToChange makes sure the change journal can take the line of a
// change about to be made, opening this process's journal file if need
// be. A change must not be made when it fails: no snapshot would learn of
// it.
func (w *Workspace) ReadyToChange() error {
	j := w.journal
	if j == nil {
		return nil
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f != nil || j.closed {
		return nil
	}
	if err := j.open(w); err != nil {
		return policy.Unavailable(policy.VolumeUnavailable, "the scope's change journal", err)
	}
	return nil
}

// NoteChange records that the object at rel (cleaned, relative to the
// scope) was changed; with subtree, that anything beneath it may have.
// It is called after the change, which ReadyToChange admitted. A journal
// that can't be written is abandoned without its end line, which makes
// the next snapshot walk the scope instead of trusting the journal, so a
// failure here loses nothing and is not returned.
func (w *Workspace) NoteChange(rel string, subtree bool) {
	w.NoteChangeBy(rel, subtree, Change{})
}

// NoteChangeBy is NoteChange saying what the change was and who made it.
func (w *Workspace) NoteChangeBy(rel string, subtree bool, c Change) {
	kind := byte('c')
	if subtree {
		kind = 't'
	}
	w.note(kind, rel, nil, c)
}

// NoteOpen records that a file was opened for writing, after the open
// (which may have created or truncated it), which ReadyToChange admitted.
// path reports where the file is now: it may be renamed while open.
// Every write through the open is covered until NoteClose.
func (w *Workspace) NoteOpen(path func() string) *Open {
	return w.NoteOpenBy(path, Change{})
}

// NoteOpenBy is NoteOpen saying what the open did (c.Op: create or
// write) and who writes; the line of its end says write.
func (w *Workspace) NoteOpenBy(path func() string, c Change) *Open {
	end := c
	end.Op = OpWrite
	o := &Open{path: path, by: end}
	w.note('o', path(), o, c)
	return o
}

// NoteClose records that the open o ended. Nothing may be written
// through it after.
func (w *Workspace) NoteClose(o *Open) {
	j := w.journal
	if j == nil || o == nil {
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if _, ok := j.opens[o]; !ok || j.closed {
		return
	}
	delete(j.opens, o)
	j.count(o.by)
	j.later(w, 'x', o.path(), o.by)
}

// later notes the line of kind for rel to go out with the next line, or
// when linger fires. With no file to write to (a failed write abandoned
// the last) or a full one, it writes at once, starting the next file;
// j.mu is held.
func (j *journal) later(w *Workspace, kind byte, rel string, c Change) {
	if j.f == nil || j.size >= journalRotate {
		j.write(w, kind, rel, c)
		return
	}
	if len(j.waiting) == 0 {
		if j.linger == nil {
			j.linger = time.AfterFunc(journalLinger, j.flushWaiting)
		} else {
			j.linger.Reset(journalLinger)
		}
	}
	j.waiting = appendLine(j.waiting, kind, rel, c)
}

// flushWaiting writes the lines waiting, if any.
func (j *journal) flushWaiting() {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.writeWaiting()
}

// writeWaiting writes the lines waiting to the file they are for; j.mu is
// held.
func (j *journal) writeWaiting() {
	if len(j.waiting) == 0 || j.f == nil || j.closed {
		return
	}
	j.writeRaw(j.waiting)
}

// flushJournal writes the lines waiting, so a reader in this process
// finds every line this Workspace noted, and returns the name and size of
// the file it writes now ("" for none): a reader needs neither to ask
// whether its writer is alive nor, for its size, to open it (each a round
// trip on a shared filesystem, and a mount following the journals asks
// every pass).
func (w *Workspace) flushJournal() (current string, size int64) {
	j := w.journal
	if j == nil {
		return "", 0
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	j.writeWaiting()
	if j.f == nil || j.closed {
		return "", 0
	}
	return j.f.Name(), j.size
}

// note writes a line of kind for rel and, for an o line, remembers open.
func (w *Workspace) note(kind byte, rel string, open *Open, c Change) {
	j := w.journal
	if j == nil {
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed || kind == 'c' && j.coveredByOpen(rel, c) {
		return
	}
	j.count(c)
	if kind == 'o' {
		j.later(w, kind, rel, c)
	} else {
		j.write(w, kind, rel, c)
	}
	if open != nil {
		if j.opens == nil {
			j.opens = map[*Open]struct{}{}
		}
		j.opens[open] = struct{}{}
	}
}

// TempJournalPrefix starts the name a journal file has from its creation
// until it is locked and placed under its own (newname).
const TempJournalPrefix = ".tmp-"

// count counts a line noted for c; j.mu is held.
func (j *journal) count(c Change) {
	if j.lines == nil {
		j.lines = map[string]uint64{}
	}
	j.lines[c.Source]++
}

// JournalLinesExcept counts the lines this Workspace has noted in its
// journal for changes whose source is none of sources. A projection that
// follows the journals compares it between two looks: while it stays the
// same, the Workspace's own file gained only the projection's own lines,
// and a write to it alone is no reason to read the journals.
func (w *Workspace) JournalLinesExcept(sources ...string) uint64 {
	j := w.journal
	if j == nil {
		return 0
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	var n uint64
	for src, c := range j.lines {
		if !slices.Contains(sources, src) {
			n += c
		}
	}
	return n
}

// coveredByOpen reports whether the change c at rel is the attributes of
// a file its own writer (the same source and call) still has open there:
// the open's lines cover it, so it needs no line of its own (tar sets the
// times of each file it has open: one append less per file, a round trip
// on a shared filesystem). Any other change keeps its line, so the change
// feed still tells a delete or a rename by someone else.
func (j *journal) coveredByOpen(rel string, c Change) bool {
	if c.Op != OpSetattr {
		return false
	}
	for o := range j.opens {
		if o.by.Source == c.Source && o.by.Call == c.Call && o.path() == rel {
			return true
		}
	}
	return false
}

// write appends one line, starting a new file first if there is none (a
// failed write abandoned the last) or the current one is full.
func (j *journal) write(w *Workspace, kind byte, rel string, c Change) {
	if j.f != nil && j.size >= journalRotate {
		// The lines waiting are of this file; a failure to write them
		// abandons it.
		if j.writeWaiting(); j.f != nil {
			old := j.f
			if err := j.open(w); err == nil {
				j.end(old)
			} else {
				j.f = old
			}
		}
	}
	if j.f == nil {
		if err := j.open(w); err != nil {
			return
		}
	}
	j.append(kind, rel, c)
}

// append writes one line to the current file, after the lines waiting.
func (j *journal) append(kind byte, rel string, c Change) bool {
	j.buf = appendLine(append(j.buf[:0], j.waiting...), kind, rel, c)
	return j.writeRaw(j.buf)
}

// appendLine appends the line of kind for rel to b.
func appendLine(b []byte, kind byte, rel string, c Change) []byte {
	b = append(b, kind, ' ')
	b = AppendPathLine(b, rel)
	c.Time = time.Now().UnixMilli()
	if meta, err := json.Marshal(c); err == nil {
		b = append(b, '\t')
		b = append(b, meta...)
	}
	return append(b, '\n')
}

// writeRaw writes whole lines b, which hold the lines waiting, to the
// current file. A failed write abandons the file, unlocked and
// unfinished: readers take it as the trace of a writer that may have
// missed a line. Either way the lines waiting are gone: they were for
// that file.
func (j *journal) writeRaw(b []byte) bool {
	j.waiting = j.waiting[:0]
	n, err := unix.Write(int(j.f.Fd()), b)
	if err != nil || n != len(b) {
		j.f.Close()
		j.f = nil
		return false
	}
	j.size += int64(n)
	return true
}

// open starts a new journal file. It is created under a temporary name
// and locked before it is given its real name, so a reader never sees an
// unlocked file of a live writer.
func (j *journal) open(w *Workspace) error {
	dfd, err := w.stateSubdir(JournalDir)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	node, _ := nodeid.Name()
	var r [6]byte
	rand.Read(r[:])
	name := fmt.Sprintf("%s.%d.%s%s", safeNode(node), os.Getpid(), hex.EncodeToString(r[:]), journalSuffix)
	tmp := TempJournalPrefix + name
	fd, err := unix.Openat(dfd, tmp, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_APPEND|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	f := os.NewFile(uintptr(fd), name)
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: 0, Len: 0}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk); err != nil {
		f.Close()
		unix.Unlinkat(dfd, tmp, 0)
		return fmt.Errorf("journal lock: %w", err)
	}
	if err := newname.Place(dfd, tmp, name); err != nil {
		f.Close()
		unix.Unlinkat(dfd, tmp, 0)
		return fmt.Errorf("journal: %w", err)
	}
	j.f, j.size = f, 0
	if j.names == nil {
		j.names = map[string]bool{}
	}
	j.names[name] = true
	// The opens still going carry over, so a reader of this file alone
	// looks at them until they end.
	for o := range j.opens {
		if !j.append('o', o.path(), o.by) {
			return fmt.Errorf("journal %s: write failed", name)
		}
	}
	return nil
}

// finish ends the current file.
func (j *journal) finish() {
	j.writeWaiting()
	if j.linger != nil {
		j.linger.Stop()
	}
	if j.f != nil {
		j.end(j.f)
		j.f = nil
	}
}

// end writes f's end line and closes it. If the line can't be written,
// the file stays unfinished, and readers will not trust it.
func (j *journal) end(f *os.File) {
	unix.Write(int(f.Fd()), []byte(journalEnd))
	f.Close()
}

// closeJournal ends the journal at Workspace.Close.
func (w *Workspace) closeJournal() {
	j := w.journal
	if j == nil {
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	j.finish()
	j.closed = true
}

func safeNode(s string) string {
	s = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' {
			return r
		}
		return '-'
	}, s)
	if s == "" || len(s) > 64 {
		s = "node"
	}
	return s
}

// AppendPathLine appends path as loomfs's line-oriented files (the change
// journals, the snapshot index) write one: as is, or Go-quoted when it
// starts with a quote or holds a byte a line can't carry.
func AppendPathLine(b []byte, path string) []byte {
	for i := 0; i < len(path); i++ {
		if c := path[i]; c < 0x20 || c == 0x7f || (i == 0 && c == '"') {
			return strconv.AppendQuote(b, path)
		}
	}
	return append(b, path...)
}

// ParsePathLine reads a path AppendPathLine wrote.
func ParsePathLine(s string) (string, error) {
	if strings.HasPrefix(s, `"`) {
		return strconv.Unquote(s)
	}
	return s, nil
}

// JournalChange is one line of a journal.
type JournalChange struct {
	Path    string
	Subtree bool
	// Kind is the line's letter: c, t, o or x.
	Kind byte
	// Change is what the line says of the change beyond its path.
	Change
	// End is the offset just past the line in its file.
	End int64
}

// JournalFile is what a reader found in one journal file past an offset.
type JournalFile struct {
	Name string
	// Size is the offset to read from next time: after the last
	// complete line read, or, in a live file, at the first o line whose
	// open has not ended yet.
	Size int64
	// End is the offset after the last complete line read (a reader
	// that wants each line once, not every open still going, reads on
	// from it).
	End     int64
	Changes []JournalChange
	Ended   bool // the writer closed it cleanly
	Live    bool // a writer holds it
	// Late says lines its node wrote after a fence of the node were
	// found and left out (fencemarks.go): what else it changed then is
	// not known.
	Late bool
	// ModTime is when the file last changed; Skipped says it was not
	// read (ReadJournalAfter).
	ModTime time.Time
	Skipped bool
}

// Trusted reports whether every change the file's writer made is in it:
// its writer is alive or closed it cleanly, and it wrote nothing after a
// fence of its node.
func (f *JournalFile) Trusted() bool { return (f.Live || f.Ended) && !f.Late }

// ErrJournalGone says a journal file a cursor names no longer holds what
// the cursor had read (removed, or shorter).
var ErrJournalGone = errors.New("journal file removed or truncated")

// ReadJournal reads every journal file of the scope past the offsets in
// from (file name → offset; files it does not name are read from the
// start; a negative offset names a file the reader is done with, skipped
// and not missed). A file named in from that is gone or shorter is
// reported with ErrJournalGone: the changes it held are lost to the
// reader.
func (w *Workspace) ReadJournal(from map[string]int64) ([]JournalFile, error) {
	return w.readJournals(from, true, time.Time{})
}

// ReadJournalAfter is ReadJournal for a reader that keeps only the files
// it has not finished: a file from does not name, that no writer holds
// and that was last changed before done, is taken as read already and
// described (Skipped, Size and End at its end) without being read.
func (w *Workspace) ReadJournalAfter(from map[string]int64, done time.Time) ([]JournalFile, error) {
	return w.readJournals(from, true, done)
}

// JournalOffsets describes every journal file of the scope with the
// offset a reader reading it whole would keep now (Size: its end, or its
// first open still going), without the changes: where a snapshot that
// walks the scope leaves the journals for the next one.
func (w *Workspace) JournalOffsets() ([]JournalFile, error) {
	return w.readJournals(nil, false, time.Time{})
}

func (w *Workspace) readJournals(from map[string]int64, changes bool, done time.Time) ([]JournalFile, error) {
	current, _ := w.flushJournal()
	dfd, names, err := w.journalDir()
	if err != nil {
		return nil, err
	}
	defer unix.Close(dfd)
	w.settled.keep(names)
	present := make(map[string]bool, len(names))
	var out []JournalFile
	var late lateJournals
	for _, name := range names {
		present[name] = true
		if from[name] < 0 {
			continue // done with, whether or not it is still there
		}
		var skipBefore time.Time
		off, named := from[name]
		if !named {
			skipBefore = done
		}
		if s, ok := w.settled.get(name); ok && named && off == s.end {
			// Read to its end line before: nothing can follow it.
			out = append(out, JournalFile{Name: name, Size: s.end, End: s.end, Ended: true, ModTime: s.mod})
			continue
		}
		judge, err := late.of(w, name)
		if err != nil {
			return nil, err
		}
		jf, size, err := readJournalFile(dfd, name, off, changes, skipBefore, name == current, judge)
		if err != nil {
			return nil, err
		}
		if jf.Ended && !jf.Live && !jf.Skipped && !jf.Late {
			w.settled.put(name, settledJournal{size: size, end: jf.End, mod: jf.ModTime})
		}
		out = append(out, jf)
	}
	for name, off := range from {
		if !present[name] && off >= 0 {
			return out, fmt.Errorf("%s: %w", name, ErrJournalGone)
		}
	}
	return out, nil
}

// RemoveJournal removes journal file name, which no writer holds any
// more, once a reader has no further use for it.
func (w *Workspace) RemoveJournal(name string) error {
	if !strings.HasSuffix(name, journalSuffix) || strings.ContainsRune(name, '/') || strings.HasPrefix(name, ".") {
		return fmt.Errorf("%q is not a journal file", name)
	}
	dfd, err := w.stateSubdir(JournalDir)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	// Noted first, so a feed reader that finds the file gone also finds
	// it here, with when it last changed.
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err == unix.ENOENT {
		return nil
	} else if err != nil {
		return fmt.Errorf("remove journal %s: %w", name, err)
	}
	if err := noteRemoved(dfd, name, time.Unix(st.Mtim.Sec, st.Mtim.Nsec)); err != nil {
		return err
	}
	if err := unix.Unlinkat(dfd, name, 0); err != nil && err != unix.ENOENT {
		return fmt.Errorf("remove journal %s: %w", name, err)
	}
	return nil
}

// RemovedFile lists, one "NAME REMOVED MODIFIED" line each (Unix
// milliseconds), the journal files removed from the directory, when, and
// when they had last changed, so a reader of the change feed
// whose cursor predates a removal learns that changes it never read are
// gone (and starts again) instead of missing them silently.
const RemovedFile = ".removed"

func noteRemoved(dfd int, name string, mtime time.Time) error {
	fd, err := unix.Openat(dfd, RemovedFile, unix.O_CREAT|unix.O_WRONLY|unix.O_APPEND|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("journal removal log: %w", err)
	}
	defer unix.Close(fd)
	line := name + " " + strconv.FormatInt(time.Now().UnixMilli(), 10) + " " + strconv.FormatInt(mtime.UnixMilli(), 10) + "\n"
	if _, err := unix.Write(fd, []byte(line)); err != nil {
		return fmt.Errorf("journal removal log: %w", err)
	}
	return nil
}

// RemovedJournal is a journal file a reader removed, and when it had
// last changed.
type RemovedJournal struct {
	Name    string
	ModTime time.Time
}

// RemovedJournals reads the removal log past offset: the journal files
// removed since, and the offset to read from next time.
func (w *Workspace) RemovedJournals(offset int64) (removed []RemovedJournal, next int64, err error) {
	dfd, err := w.stateSubdir(JournalDir)
	if err != nil {
		return nil, offset, err
	}
	defer unix.Close(dfd)
	fd, err := unix.Openat(dfd, RemovedFile, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err == unix.ENOENT {
		return nil, offset, nil
	}
	if err != nil {
		return nil, offset, fmt.Errorf("journal removal log: %w", err)
	}
	f := os.NewFile(uintptr(fd), RemovedFile)
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return nil, offset, fmt.Errorf("journal removal log: %w", err)
	}
	b, err := io.ReadAll(io.LimitReader(f, 16<<20))
	if err != nil {
		return nil, offset, fmt.Errorf("journal removal log: %w", err)
	}
	b = b[:bytes.LastIndexByte(b, '\n')+1] // whole lines only
	for _, line := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		r := RemovedJournal{Name: f[0], ModTime: time.Now()} // unknown: the latest
		if len(f) == 3 {
			if ms, err := strconv.ParseInt(f[2], 10, 64); err == nil {
				r.ModTime = time.UnixMilli(ms)
			}
		}
		removed = append(removed, r)
	}
	return removed, offset + int64(len(b)), nil
}

// journalDir opens the scope's journal directory and lists the journal
// files in it, sorted.
func (w *Workspace) journalDir() (dfd int, names []string, err error) {
	if dfd, err = w.stateSubdir(JournalDir); err != nil {
		return -1, nil, err
	}
	if names, err = journalNames(dfd); err != nil {
		unix.Close(dfd)
		return -1, nil, err
	}
	return dfd, names, nil
}

// journalNames lists the journal files in dfd, a directory fd opened for
// this listing (journalDir): read from dfd itself, not from a second open
// of it, which would cost an open and a release on a shared filesystem.
func journalNames(dfd int) ([]string, error) {
	var names []string
	buf := make([]byte, 8<<10)
	for {
		n, err := unix.ReadDirent(dfd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("journal dir: %w", err)
		}
		if n <= 0 {
			break
		}
		var all []string
		_, _, all = unix.ParseDirent(buf[:n], -1, all)
		for _, name := range all {
			if strings.HasSuffix(name, journalSuffix) && !strings.HasPrefix(name, ".") {
				names = append(names, name)
			}
		}
	}
	sort.Strings(names)
	return names, nil
}

// readJournalFile reads name past offset, and returns what it found and
// the file's size. Whether its writer is alive is asked before reading
// (unless live says this process writes it), so a writer that ends it
// meanwhile is seen as alive (and its end line, if read, as ended): never
// the reverse. A line late says its node wrote after its fence is left
// out, and the file marked Late.
func readJournalFile(dfd int, name string, offset int64, changes bool, skipBefore time.Time, live bool, late func(off, end int64) bool) (JournalFile, int64, error) {
	jf := JournalFile{Name: name, Size: offset, End: offset}
	journalOpens.Add(1)
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err == unix.ENOENT {
		// Removed between listing and opening: only a reader removes
		// files, and only those it has finished with.
		return jf, 0, fmt.Errorf("%s: %w", name, ErrJournalGone)
	}
	if err != nil {
		return jf, 0, fmt.Errorf("journal %s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	if jf.Live = live; !live {
		if jf.Live, err = lockHeld(fd); err != nil {
			return jf, 0, fmt.Errorf("journal %s lock: %w", name, err)
		}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return jf, 0, fmt.Errorf("journal %s: %w", name, err)
	}
	if st.Size < offset {
		return jf, st.Size, fmt.Errorf("%s: %w", name, ErrJournalGone)
	}
	jf.ModTime = time.Unix(st.Mtim.Sec, st.Mtim.Nsec)
	if !jf.Live && jf.ModTime.Before(skipBefore) {
		jf.Skipped, jf.Size, jf.End = true, st.Size, st.Size
		return jf, st.Size, nil
	}
	if st.Size == offset {
		if !jf.Live {
			// Read to its end before: whether that end is the end line
			// (not one written after its node's fence) decides whether
			// the file can be trusted.
			jf.Ended = endsClean(f, offset) && (late == nil || !late(offset-int64(len(journalEnd)), offset))
		}
		return jf, st.Size, nil
	}
	buf := make([]byte, st.Size-offset)
	n, err := f.ReadAt(buf, offset)
	if n < len(buf) && err != nil {
		buf = buf[:n]
	}
	// Only whole lines: a line being appended is read next time.
	end := bytes.LastIndexByte(buf, '\n') + 1
	buf = buf[:end]
	jf.Size = offset + int64(end)
	jf.End = jf.Size
	// open counts the opens going at pos; held is where the first of
	// them was noted. The offset a reader is given is always one with
	// none going.
	open, held := 0, int64(0)
	for pos := offset; len(buf) > 0; {
		i := bytes.IndexByte(buf, '\n')
		line := string(buf[:i])
		buf = buf[i+1:]
		at := pos
		pos += int64(i) + 1
		if late != nil && late(at, pos) {
			jf.Late = true
			continue
		}
		if line+"\n" == journalEnd {
			jf.Ended = true
			continue
		}
		kind, p, ok := strings.Cut(line, " ")
		if !ok || len(kind) != 1 || !strings.Contains("ctox", kind) {
			return jf, st.Size, fmt.Errorf("journal %s: malformed line %q", name, line)
		}
		p, meta, _ := strings.Cut(p, "\t")
		if p, err = ParsePathLine(p); err != nil {
			return jf, st.Size, fmt.Errorf("journal %s: malformed line %q", name, line)
		}
		if changes {
			c := JournalChange{Path: p, Subtree: kind == "t", Kind: kind[0], End: pos}
			if meta != "" {
				// A line whose detail can't be read still names its path.
				json.Unmarshal([]byte(meta), &c.Change)
			}
			jf.Changes = append(jf.Changes, c)
		}
		switch kind {
		case "o":
			if open == 0 {
				held = at
			}
			open++
		case "x":
			open = max(open-1, 0)
		}
	}
	if open > 0 && jf.Live && !jf.Ended {
		jf.Size = held
	}
	return jf, st.Size, nil
}

// endsClean reports whether the journal file f, size bytes long, ends
// with the end line its writer writes when it closes it.
func endsClean(f *os.File, size int64) bool {
	n := int64(len(journalEnd))
	if size < n {
		return false
	}
	// The end line, and the newline before it (or the start of the
	// file): a line of a change ends in "end" only after a path
	// ("c backend"), never right after a newline, since it starts with
	// its kind.
	buf := make([]byte, n+1)
	from := size - n - 1
	if from < 0 {
		buf, from = buf[1:], 0
	}
	if k, _ := f.ReadAt(buf, from); k != len(buf) {
		return false
	}
	return string(buf[len(buf)-int(n):]) == journalEnd && (len(buf) == int(n) || buf[0] == '\n')
}

// JournalFiles describes every journal file of scope s, as
// Workspace.JournalFiles does, without opening the scope.
func (v *Volume) JournalFiles(s Scope) ([]JournalFile, error) {
	w, err := v.stateOnly(s)
	if err != nil {
		return nil, err
	}
	defer w.state.Close()
	return w.JournalFiles()
}

// RemoveJournal removes journal file name of scope s, as
// Workspace.RemoveJournal does, without opening the scope.
func (v *Volume) RemoveJournal(s Scope, name string) error {
	w, err := v.stateOnly(s)
	if err != nil {
		return err
	}
	defer w.state.Close()
	return w.RemoveJournal(name)
}

// JournalFiles describes every journal file of the scope as it is now:
// its size and whether a writer holds it, without reading it.
func (w *Workspace) JournalFiles() ([]JournalFile, error) {
	current, size := w.flushJournal()
	dfd, names, err := w.journalDir()
	if err != nil {
		return nil, err
	}
	defer unix.Close(dfd)
	w.settled.keep(names)
	var out []JournalFile
	for _, name := range names {
		if name == current {
			out = append(out, JournalFile{Name: name, Live: true, Size: size})
			continue
		}
		if s, ok := w.settled.get(name); ok {
			out = append(out, JournalFile{Name: name, Size: s.size})
			continue
		}
		journalOpens.Add(1)
		fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		jf := JournalFile{Name: name}
		jf.Live, err = lockHeld(fd)
		var st unix.Stat_t
		if err == nil {
			err = unix.Fstat(fd, &st)
		}
		unix.Close(fd)
		if err != nil {
			return nil, fmt.Errorf("journal %s: %w", name, err)
		}
		jf.Size = st.Size
		out = append(out, jf)
	}
	return out, nil
}

// lockHeld reports whether some writer holds a lock on the open file fd.
func lockHeld(fd int) (bool, error) {
	lk := unix.Flock_t{Type: unix.F_RDLCK, Whence: 0, Start: 0, Len: 0}
	if err := unix.FcntlFlock(uintptr(fd), unix.F_OFD_GETLK, &lk); err != nil {
		return false, err
	}
	return lk.Type != unix.F_UNLCK, nil
}

// JournalWriter reads the node and process id that wrote journal file
// name from its name (NODE.PID.RANDOM.log).
func JournalWriter(name string) (node string, pid int) {
	parts := strings.Split(strings.TrimSuffix(name, journalSuffix), ".")
	if len(parts) != 3 {
		return "", 0
	}
	pid, _ = strconv.Atoi(parts[1])
	return parts[0], pid
}
