// Package changes is the scope's change feed: what changed after a
// cursor, read from the change journals (store/journal.go) that both
// doors write, so it covers the tools and every write a program makes
// in the projection, on every node of the volume. It never reports a
// path the policy hides, and it never leaves a silent gap: a cursor older
// than the journals kept answers Reset.
package changes

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"sort"
	"strings"
	"time"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// Event is one change.
type Event struct {
	Op   string `json:"op"`
	Path string `json:"path"`
	// To is where a rename moved Path.
	To string `json:"to,omitempty"`
	// Subtree says anything beneath Path may have changed (a directory
	// renamed, cleared or restored).
	Subtree bool `json:"subtree,omitempty"`
	// Source is tool, projection or platform (staged by the platform, or
	// the layout an opening made); CallID the tool call or the command
	// that made it, where known.
	Source string `json:"source,omitempty"`
	CallID string `json:"call_id,omitempty"`
	// Node and PID name the process that made it.
	Node string `json:"node,omitempty"`
	PID  int    `json:"pid,omitempty"`
	Time string `json:"time"`
}

// Page is one read of the feed.
type Page struct {
	Changes []Event `json:"changes"`
	// Cursor is where the next read goes on from.
	Cursor string `json:"cursor"`
	// Reset says changes after the cursor given are no longer kept: re-list
	// what matters, then go on from Cursor.
	Reset bool `json:"reset"`
	// Truncated says more changes are waiting after Cursor.
	Truncated bool `json:"truncated"`
}

// Query is what to read.
type Query struct {
	// Since is a cursor from an earlier page; "" starts now.
	Since string
	// Prefix keeps only changes at or under this cleaned path ("." for
	// all).
	Prefix string
	Limit  int
	// Wait, if set, waits up to this long for a change when there is
	// none yet.
	Wait time.Duration
}

// PollEvery is how often a waiting read looks at the journals again. The
// journals are files on the shared volume: a write on another node is
// seen here at the next look, which inotify could not give over FUSE,
// NFS or CephFS.
var PollEvery = 20 * time.Millisecond

// cursor is what a Cursor string holds. Files names each journal file
// not yet read to its end, or still written, with the offset read to;
// Done names each file read whole that changed less than Margin before
// Time (with when it last changed), so it is not read again. A file
// named in neither that no one writes and that last changed more than
// Margin before Time was read whole by an earlier cursor: Time is taken
// before the journals are listed, so any file then complete was listed.
// That keeps a cursor small however many processes wrote the scope.
// Removed is how far the journal removal log had been read
// (store.RemovedJournals): a file removed after that, and not covered
// here, held changes never read. Scope tags the scope whose feed gave
// the cursor (scopeTag): another scope's cursor names none of this one's
// files, and would replay its last Margin as if it were news.
type cursor struct {
	Scope   string           `json:"s,omitempty"`
	Files   map[string]int64 `json:"f,omitempty"`
	Done    map[string]int64 `json:"d,omitempty"`
	Time    int64            `json:"t"`
	Removed int64            `json:"r"`
}

// scopeTag names ws's scope in its cursors: a prefix of the scope hash,
// which is the same on every node and says nothing of a host path.
func scopeTag(ws *store.Workspace) string { return ws.Scope().Hash()[:16] }

// Margin is how long after a journal file last changed a cursor still
// names it: longer than a shared volume may take to show one node's new
// file to another (NFS attribute and directory caching), so a file is
// never taken as read before a reader could list it.
var Margin = time.Minute

func (c cursor) String() string {
	b, _ := json.Marshal(c)
	return base64.RawURLEncoding.EncodeToString(b)
}

func parseCursor(s string) (cursor, error) {
	var c cursor
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err == nil {
		err = json.Unmarshal(b, &c)
	}
	if err != nil || c.Removed < 0 || c.Time <= 0 {
		return c, policy.Errorf(policy.InvalidCursor, "since is not a cursor the change feed gave; leave it out to start now")
	}
	return c, nil
}

// covers reports whether c accounts for journal file name, last changed
// at mtime: named, or complete and older than its margin.
func (c cursor) covers(name string, mtime time.Time) bool {
	if _, ok := c.Files[name]; ok {
		return true
	}
	if _, ok := c.Done[name]; ok {
		return true
	}
	return mtime.Before(c.settled())
}

// settled is the time before which an unnamed file counts as read.
func (c cursor) settled() time.Time { return time.UnixMilli(c.Time).Add(-Margin) }

// keep adds f, read to end, to c.
func (c *cursor) keep(f store.JournalFile, end int64) {
	switch {
	case f.Skipped:
	case end < f.End || f.Live:
		if c.Files == nil {
			c.Files = map[string]int64{}
		}
		c.Files[f.Name] = end
	case !f.ModTime.Before(c.settled()):
		if c.Done == nil {
			c.Done = map[string]int64{}
		}
		c.Done[f.Name] = f.ModTime.UnixMilli()
	}
}

// Read reads the feed of ws's scope.
func Read(ctx context.Context, ws *store.Workspace, q Query) (Page, error) {
	if q.Since == "" {
		c, err := now(ws)
		if err != nil {
			return Page{}, err
		}
		q.Since = c.String()
	}
	from, err := parseCursor(q.Since)
	if err != nil {
		return Page{}, err
	}
	switch from.Scope {
	case scopeTag(ws):
	case "":
		// A cursor from before cursors named their scope: most likely
		// this one's, but it can't be told, so its changes are not
		// replayed as this scope's.
		return reset(ws)
	default:
		return Page{}, policy.Errorf(policy.InvalidCursor, "since is a cursor of another workspace's change feed; pass a cursor this workspace's feed gave, or leave it out to start now")
	}
	var deadline time.Time
	if q.Wait > 0 {
		deadline = time.Now().Add(q.Wait)
	}
	for {
		p, err := read(ws, from, q)
		if err != nil || len(p.Changes) > 0 || p.Reset || q.Wait <= 0 || !time.Now().Before(deadline) {
			return p, err
		}
		// Nothing yet: the next look starts from where this one got.
		if from, err = parseCursor(p.Cursor); err != nil {
			return Page{}, err
		}
		t := time.NewTimer(min(PollEvery, time.Until(deadline)))
		select {
		case <-ctx.Done():
			t.Stop()
			return p, nil
		case <-t.C:
		}
	}
}

// now is a cursor at the end of every journal.
func now(ws *store.Workspace) (cursor, error) {
	c := cursor{Scope: scopeTag(ws), Time: time.Now().UnixMilli()}
	_, r, err := ws.RemovedJournals(0)
	if err != nil {
		return c, journalErr(err)
	}
	c.Removed = r
	files, err := ws.JournalOffsets()
	if err != nil {
		return c, journalErr(err)
	}
	for _, f := range files {
		c.keep(f, f.End)
	}
	return c, nil
}

type line struct {
	file  int
	c     store.JournalChange
	start int64 // offset of the line in its file
	time  int64
}

func read(ws *store.Workspace, from cursor, q Query) (Page, error) {
	// A file the cursor never saw that was removed after it: its changes
	// are gone unread. The log is read before the journals, so a file
	// removed after this look is seen by the next.
	readAt := time.Now().UnixMilli()
	removed, removedTo, err := ws.RemovedJournals(from.Removed)
	if err != nil {
		return Page{}, journalErr(err)
	}
	for _, r := range removed {
		_, partly := from.Files[r.Name]
		if partly || !from.covers(r.Name, r.ModTime) {
			return reset(ws)
		}
	}
	// Files read whole are skipped; those the cursor does not name and
	// that changed too late to be covered are read from the start.
	skip := make(map[string]int64, len(from.Files)+len(from.Done))
	for name, off := range from.Files {
		skip[name] = off
	}
	for name := range from.Done {
		skip[name] = -1
	}
	files, err := ws.ReadJournalAfter(skip, from.settled())
	if errors.Is(err, store.ErrJournalGone) {
		return reset(ws)
	}
	if err != nil {
		return Page{}, journalErr(err)
	}
	var lines []line
	for i, f := range files {
		last, start := int64(0), max(from.Files[f.Name], 0)
		for _, c := range f.Changes {
			// Per file, time never goes back, so a cut keeps each file's
			// lines in order.
			last = max(last, c.Time)
			lines = append(lines, line{file: i, c: c, start: start, time: last})
			start = c.End
		}
	}
	sort.SliceStable(lines, func(a, b int) bool {
		if lines[a].time != lines[b].time {
			return lines[a].time < lines[b].time
		}
		return lines[a].file < lines[b].file
	})
	limit := q.Limit
	if limit <= 0 {
		limit = DefaultLimit
	}
	pol := ws.Policy()
	next := cursor{Scope: from.Scope, Time: readAt, Removed: removedTo}
	for name, mtime := range from.Done {
		// Still named while within its margin (a file removed since is
		// harmless to name: it is skipped, not missed).
		if !time.UnixMilli(mtime).Before(next.settled()) {
			if next.Done == nil {
				next.Done = map[string]int64{}
			}
			next.Done[name] = mtime
		}
	}
	ends := make([]int64, len(files))
	for i, f := range files {
		ends[i] = f.End
	}
	page := Page{Changes: []Event{}}
	for k, l := range lines {
		ev, ok := eventOf(pol, files[l.file].Name, l.c, l.time)
		if ok && !under(ev, q.Prefix) {
			ok = false
		}
		if ok && len(page.Changes) == limit {
			page.Truncated = true
			// The rest of each file is read next time.
			for _, rest := range lines[k:] {
				ends[rest.file] = min(ends[rest.file], rest.start)
			}
			break
		}
		if ok {
			page.Changes = append(page.Changes, ev)
		}
	}
	for i, f := range files {
		next.keep(f, ends[i])
	}
	page.Cursor = next.String()
	return page, nil
}

// DefaultLimit and MaxLimit bound the changes one read returns.
const (
	DefaultLimit = 500
	MaxLimit     = 5000
)

func reset(ws *store.Workspace) (Page, error) {
	c, err := now(ws)
	if err != nil {
		return Page{}, err
	}
	return Page{Changes: []Event{}, Cursor: c.String(), Reset: true}, nil
}

// eventOf makes the event a journal line tells, if it tells one: an open
// noted by its end ("x", op write) rather than its start, a rename once
// (on its old path's line), and nothing hidden by the policy.
func eventOf(pol *policy.Policy, file string, c store.JournalChange, ms int64) (Event, bool) {
	if c.Source == store.SourceLoomfs {
		return Event{}, false
	}
	node, pid := store.JournalWriter(file)
	ev := Event{Op: c.Op, Path: c.Path, Subtree: c.Subtree, Source: c.Source, CallID: c.Call, Node: node, PID: pid, Time: time.UnixMilli(ms).UTC().Format(time.RFC3339Nano)}
	switch c.Kind {
	case 'o':
		if c.Op != store.OpCreate {
			return ev, false // its end says write
		}
	case 'x':
		ev.Op = store.OpWrite
	}
	if ev.Op == "" {
		// A line of a writer that said no more than the path.
		ev.Op = store.OpWrite
		if c.Subtree {
			ev.Op = store.OpTree
		}
	}
	if ev.Op == store.OpRename {
		if c.From != "" {
			// The new path's line: shown by the old path's, unless the
			// old was hidden, when it is a creation here.
			if visible(pol, c.From) {
				return ev, false
			}
			ev.Op = store.OpCreate
			return ev, visible(pol, c.Path)
		}
		ev.To = c.To
		switch {
		case !visible(pol, c.To):
			ev.Op, ev.To = store.OpDelete, ""
		case !visible(pol, c.Path):
			return ev, false // told by the new path's line
		}
	}
	return ev, visible(pol, ev.Path)
}

// visible reports whether the policy shows rel at all.
func visible(pol *policy.Policy, rel string) bool {
	if rel == "." {
		return true
	}
	return pol.ModeOf(rel) != policy.ModeHidden
}

func under(ev Event, prefix string) bool {
	in := func(p string) bool {
		return prefix == "" || prefix == "." || p == "." || p == prefix || strings.HasPrefix(p, prefix+"/")
	}
	return in(ev.Path) || ev.To != "" && in(ev.To) || ev.Subtree && strings.HasPrefix(prefix, ev.Path+"/")
}

func journalErr(err error) error {
	return &policy.Error{Code: policy.VolumeUnavailable, Message: "the scope's change journals can't be read; retry later", Err: err}
}
