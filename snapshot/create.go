package snapshot

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/newname"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// Options are the labels of a new snapshot and how it is taken.
type Options struct {
	Label string // free text shown by list, e.g. "before refactor"
	Run   string // the run the snapshot belongs to (the end of a run)
	// Locked says the caller already holds the scope lock; otherwise
	// Create takes it, waiting as long as ctx allows.
	Locked bool
	// Time is the creation time to record; zero means now.
	Time time.Time
	// Full walks the whole scope instead of trusting the change
	// journals, to take in changes made to the backing store by
	// something other than loomfs.
	Full bool
}

// Create takes a snapshot of the scope ws opens, hidden subtrees included,
// and returns its manifest. It holds the scope lock throughout, so no tool
// write or command runs meanwhile. A file unchanged since the last
// snapshot (same size, times and inode) is not read again, and content
// already stored is not written again.
func Create(ctx context.Context, ws *store.Workspace, opt Options) (*Manifest, error) {
	start := time.Now()
	if opt.Run != "" {
		if err := store.ValidateID("run", opt.Run); err != nil {
			return nil, err
		}
	}
	if len(opt.Label) > 256 {
		return nil, policy.Errorf(policy.InvalidInput, "label is %d bytes; the limit is 256", len(opt.Label))
	}
	if !opt.Locked {
		unlock, err := ws.Lock(ctx)
		if err != nil {
			return nil, err
		}
		defer unlock()
	}
	// A session sandbox's processes write without the scope lock: a
	// snapshot taken under them would be of no one moment.
	if m, err := ws.SessionMarkerOf(); err != nil || m != nil {
		if err != nil {
			return nil, err
		}
		return nil, policy.Errorf(policy.Conflict, "a session sandbox is running in scope %s (container %s, node %s); stop it first (loomfs processes stop), then take the snapshot", ws.Scope(), m.Container, m.Node)
	}
	repo, err := OpenRepo(ws.Volume(), ws.Scope(), true)
	if err != nil {
		return nil, err
	}
	defer repo.Close()
	now, err := repo.fsNow()
	if err != nil {
		return nil, err
	}
	created := opt.Time
	if created.IsZero() {
		created = start
	}
	sc := ws.Scope()
	m := &Manifest{Version: manifestVersion, ID: newID(created), Scope: sc.String(), ScopeHash: sc.Hash(), Label: opt.Label, Run: opt.Run, Created: created.UTC()}

	// Find what changed: from the change journals when they can be
	// trusted, otherwise by walking the whole scope. Then read and store
	// it.
	view := ws.Unfiltered()
	old := repo.loadState()
	// A mount's lines of an open reach its journal file a little after
	// the open (store.JournalLag): read once every change made before the
	// snapshot began is there.
	if err := store.AwaitJournalLines(ctx, start); err != nil {
		return nil, err
	}
	journals, walk := changes(view, old, opt.Full, created)
	var d *delta
	if walk == "" {
		if d, walk = replay(ctx, view, old, journals); walk != "" {
			journals, _ = view.JournalFiles()
		}
	}
	c := commit{id: m.ID, full: old.full, cursor: cursorOf(journals)}
	var list, upserts []named // the whole scope (a full manifest), or what changed
	var read int
	if walk != "" {
		m.Walk, m.WalkReason = walkFull, walk
		c.full = created.UnixNano()
		found, err := scan(ctx, view, old)
		if err != nil {
			return nil, err
		}
		m.Skipped = found.skipped
		gone, err := repo.storeFiles(ctx, view, found.entries, found.stats, found.todo, m)
		if err != nil {
			return nil, err
		}
		list, read = namedOf(found.entries, found.stats, gone, now), len(found.todo)
	} else {
		m.Walk = walkJournal
		entries, stats := make([]Entry, len(d.upserts)), make([]indexEntry, len(d.upserts))
		for i, u := range d.upserts {
			entries[i], stats[i] = u.entry(u.path), u.indexEntry
		}
		m.Skipped = d.skipped
		gone, err := repo.storeFiles(ctx, view, entries, stats, d.read, m)
		if err != nil {
			return nil, err
		}
		upserts, read = namedOf(entries, stats, gone, now), len(d.read)
		if old.deltaEntries+len(d.removed)+len(upserts) > max(256, len(old.starts)/4) || old.depth+1 > maxDepth || !repo.exists(old.id) {
			// Start a new base: a full manifest, and the index anew.
			list = applyDelta(old.all(), d.removed, upserts, func(n named) string { return n.path })
		} else {
			m.Base, m.Depth = old.id, old.depth+1
			c.files, c.dirs, c.bytes = d.files, d.dirs, d.bytes
			count(upserts, &c)
			c.depth = m.Depth
		}
	}
	if list != nil {
		count(list, &c)
	}
	m.Files, m.Dirs, m.Bytes = c.files, c.dirs, c.bytes
	slices.SortFunc(m.Skipped, func(a, b Skipped) int { return walkOrder(a.Path, b.Path) })
	c.skipped = m.Skipped

	// Make the blobs durable before the manifest that names them: a few
	// were fsynced one by one; many are flushed by one syncfs.
	if m.NewBlobs > 0 && read > syncEachMax {
		if err := unix.Syncfs(int(repo.dir.Fd())); err != nil {
			return nil, fmt.Errorf("sync snapshot: %w", err)
		}
	}
	m.Duration = time.Since(start).Seconds()
	// The manifest is the commit point: written last, after the contents
	// it names are durable, it makes the snapshot exist.
	var removed []string
	if m.Base != "" {
		removed = d.removed
	} else {
		upserts = list
	}
	if err := repo.writeSnapshot(m, entriesOf(upserts), removed, true); err != nil {
		return nil, err
	}
	unix.Fsync(int(repo.mans.Fd()))

	// The snapshot stands whatever happens to the index: without one,
	// the next snapshot walks and reads every file again. Journal files
	// whose writer is gone are read to their end: the index covers them.
	var done []string
	for _, f := range journals {
		if !f.Live {
			done = append(done, f.Name)
			delete(c.cursor, f.Name)
		}
	}
	var err2 error
	if m.Base != "" {
		if err2 = repo.appendState(old, removed, upserts, c); err2 != nil {
			err2 = repo.saveState(applyDelta(old.all(), removed, upserts, func(n named) string { return n.path }), c)
		}
	} else {
		err2 = repo.saveState(list, c)
	}
	if err2 == nil {
		for _, name := range done {
			view.RemoveJournal(name)
		}
	}
	return m, nil
}

// maxDepth is the most deltas a manifest may stand on; the next snapshot
// is written in full.
const maxDepth = 64

// namedOf returns entries with their stat, less those gone, as index
// entries: a file with its hash, racy when changed at or after now.
func namedOf(entries []Entry, stats []indexEntry, gone map[int]bool, now int64) []named {
	out := make([]named, 0, len(entries))
	for i, e := range entries {
		if gone[i] {
			continue
		}
		st := stats[i]
		if e.hasContent() {
			st.sha, st.size = e.SHA256, e.Size
			if st.ctime >= now {
				st.kind = kindRacy
			}
		}
		out = append(out, named{e.Path, st})
	}
	return out
}

func entriesOf(list []named) []Entry {
	out := make([]Entry, len(list))
	for i, n := range list {
		out[i] = n.entry(n.path)
	}
	return out
}

// count adds the entries of list to the totals of c.
func count(list []named, c *commit) {
	for _, n := range list {
		if n.kind == kindDir {
			c.dirs++
		} else {
			c.files++
			c.bytes += n.size
		}
	}
}

// How a snapshot found what changed (Manifest.Walk).
const (
	walkJournal = "journal" // the paths the change journals name
	walkFull    = "full"    // a walk of the whole scope
)

// FullEvery is how old the last full walk may be before a snapshot walks
// the whole scope again although the change journals are trusted: it
// bounds how long a change made to the backing store by something other
// than loomfs can stay unseen.
const FullEvery = time.Hour

// changes returns the journal files to read the changes from and, when
// they can't be trusted, why the scope must be walked instead.
func changes(view *store.Workspace, old *state, full bool, now time.Time) (journals []store.JournalFile, walk string) {
	switch {
	case full:
		walk = "asked for"
	case old.id == "":
		walk = "no snapshot to build on (none yet, a restore since, or journals trimmed by gc)"
	case now.Sub(time.Unix(0, old.full)) >= FullEvery:
		walk = fmt.Sprintf("the last full walk is more than %v old", FullEvery)
	}
	if walk == "" {
		files, err := view.ReadJournal(old.cursor)
		switch {
		case err != nil:
			walk = "change journal: " + err.Error()
		default:
			for _, f := range files {
				if !f.Trusted() {
					walk = "a process that changed the scope ended without closing its change journal (" + f.Name + ")"
					break
				}
			}
		}
		if walk == "" {
			return files, ""
		}
	}
	// Where the journals stand before the walk starts: a change made
	// during it, or through an open still going, is looked at again by
	// the next snapshot. A journal that can't be read is taken at its
	// end.
	files, err := view.JournalOffsets()
	if err != nil {
		files, _ = view.JournalFiles()
	}
	return files, walk
}

func cursorOf(files []store.JournalFile) map[string]int64 {
	c := make(map[string]int64, len(files))
	for _, f := range files {
		c[f.Name] = f.Size
	}
	return c
}

// openContent opens what the entry e holds: a file's content, or a
// link's target (an emulated link is never opened as a file).
func openContent(view *store.Workspace, e Entry) (io.Reader, store.Info, error) {
	if e.Type == typeLink {
		target, info, err := view.ReadLink(e.Path)
		return strings.NewReader(target), info, err
	}
	f, info, err := view.Open(policy.OpRead, e.Path, unix.O_RDONLY)
	if err == nil && info.Kind != policy.KindRegular {
		f.Close()
		err = policy.Errorf(policy.Conflict, "%s is no longer a regular file", e.Path)
	}
	if err != nil {
		return nil, info, err
	}
	return f, info, nil
}

// storeFiles reads the files at todo (indexes into entries), stores their
// content and fills in their hash, size and stat. Files removed since the
// walk are marked gone; files that became unusable are skipped.
func (r *Repo) storeFiles(ctx context.Context, view *store.Workspace, entries []Entry, stats []indexEntry, todo []int, m *Manifest) (gone map[int]bool, err error) {
	gone = map[int]bool{}
	if len(todo) == 0 {
		return gone, nil
	}
	var (
		mu       sync.Mutex
		firstErr error
		next     = make(chan int)
		wg       sync.WaitGroup
	)
	// More workers than CPUs: for a few files the time goes to fsync.
	workers := min(8, len(todo))
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				e := &entries[i]
				src, info, err := openContent(view, *e)
				if err != nil {
					mu.Lock()
					switch {
					case policy.Refused(err):
						m.Skipped = append(m.Skipped, Skipped{e.Path, string(policy.CodeOf(err))})
					case policy.CodeOf(err) != policy.NotFound && firstErr == nil:
						// The storage failed (descriptors, I/O): a
						// snapshot said taken must hold every file.
						firstErr = fmt.Errorf("read %s: %w", e.Path, err)
					}
					gone[i] = true
					mu.Unlock()
					continue
				}
				sha, n, isNew, err := r.storeBlob(src, len(todo) <= syncEachMax)
				if c, ok := src.(io.Closer); ok {
					c.Close()
				}
				mu.Lock()
				if err != nil {
					if firstErr == nil {
						firstErr = fmt.Errorf("store %s: %w", e.Path, err)
					}
				} else {
					e.SHA256, e.Size, e.Perm, e.MTime = sha, n, info.Perm, info.Stat.Mtim.Nano()
					stats[i] = entryOf(kindFile, info, "")
					m.Hashed++
					if isNew {
						m.NewBlobs++
						m.NewBytes += n
					}
				}
				mu.Unlock()
			}
		}()
	}
	for _, i := range todo {
		if ctx.Err() != nil {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	if ctx.Err() != nil {
		return nil, policy.Errorf(policy.Cancelled, "snapshot cancelled; nothing was recorded")
	}
	return gone, nil
}

// syncEachMax is the most files a snapshot reads for which it fsyncs each
// new blob; above it one syncfs flushes them all.
const syncEachMax = 256

// storeBlob copies src into a blob named by its sha256, fsyncing it if
// sync is set. isNew is false when that content was stored already (the
// copy is then dropped).
func (r *Repo) storeBlob(src io.Reader, sync bool) (sha string, n int64, isNew bool, err error) {
	bfd := int(r.blobs.Fd())
	tmp := tmpName()
	fd, err := unix.Openat(bfd, tmp, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o400)
	if err != nil {
		return "", 0, false, err
	}
	dst := os.NewFile(uintptr(fd), tmp)
	h := sha256.New()
	buf := bufPool.Get().(*[]byte)
	n, err = io.CopyBuffer(io.MultiWriter(dst, h), src, *buf)
	bufPool.Put(buf)
	if err == nil && sync {
		err = dst.Sync()
	}
	dst.Close()
	if err != nil {
		unix.Unlinkat(bfd, tmp, 0)
		return "", 0, false, err
	}
	sha = hex.EncodeToString(h.Sum(nil))
	if err := unix.Mkdirat(bfd, sha[:2], policy.DirPerm); err != nil && err != unix.EEXIST {
		unix.Unlinkat(bfd, tmp, 0)
		return "", 0, false, err
	}
	err = newname.Place(bfd, tmp, blobPath(sha))
	if err == unix.EEXIST {
		unix.Unlinkat(bfd, tmp, 0)
		return sha, n, false, nil
	}
	if err != nil {
		unix.Unlinkat(bfd, tmp, 0)
		return "", 0, false, err
	}
	return sha, n, true, nil
}

// blobPath names a blob relative to the blobs directory.
func blobPath(sha string) string { return sha[:2] + "/" + sha }

var bufPool = sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}

// writeEntries writes entries as a JSON array, one entry a line. It is the
// hot path of an incremental snapshot, so it avoids reflection.
func writeEntries(w *bufio.Writer, entries []Entry) error {
	w.WriteString("[\n")
	var b []byte
	for i, e := range entries {
		b = b[:0]
		b = append(b, `{"path":`...)
		b = appendJSONString(b, e.Path)
		b = append(b, `,"type":"`...)
		b = append(b, e.Type...)
		b = append(b, '"')
		if e.Size != 0 {
			b = append(b, `,"size":`...)
			b = strconv.AppendInt(b, e.Size, 10)
		}
		b = append(b, `,"perm":`...)
		b = strconv.AppendUint(b, uint64(e.Perm), 10)
		b = append(b, `,"mtime_ns":`...)
		b = strconv.AppendInt(b, e.MTime, 10)
		if e.SHA256 != "" {
			b = append(b, `,"sha256":"`...)
			b = append(b, e.SHA256...)
			b = append(b, '"')
		}
		b = append(b, '}')
		if i < len(entries)-1 {
			b = append(b, ',')
		}
		b = append(b, '\n')
		if _, err := w.Write(b); err != nil {
			return err
		}
	}
	_, err := w.WriteString("]\n")
	return err
}

func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= 0x80 {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// scanned is a scope as a walk or a replay found it: its entries in walk
// order with their lstat, the hash of each file the index knows
// unchanged, and the files that must be read (indexes into entries).
type scanned struct {
	entries []Entry
	stats   []indexEntry // what lstat said, for the next index
	todo    []int
	skipped []Skipped
}

// add appends the object at rel, as lstat found it, or its reason to be
// skipped. It returns store.SkipDir for a directory whose contents must
// not be walked.
func (s *scanned) add(rel string, info store.Info, dev uint64, old *state) error {
	skip := func(reason string) { s.skipped = append(s.skipped, Skipped{rel, reason}) }
	switch {
	case !utf8.ValidString(rel):
		// Only someone writing to the backing store directly makes
		// such a name; JSON could not carry it back exactly.
		skip(string(policy.InvalidPath))
		if info.Kind == policy.KindDir {
			return store.SkipDir
		}
		return nil
	case info.OtherMount || info.Stat.Dev != dev:
		skip("other_filesystem")
		if info.Kind == policy.KindDir {
			return store.SkipDir
		}
		return nil
	case info.Kind == policy.KindDir:
		s.entries = append(s.entries, Entry{Path: rel, Type: typeDir, Perm: info.Perm, MTime: info.Stat.Mtim.Nano()})
		s.stats = append(s.stats, entryOf(kindDir, info, ""))
		return nil
	}
	typ := typeFile
	if info.Kind == policy.KindLink && info.Nlink == 1 {
		typ = typeLink // kept, with its target as its content
	} else if err := policy.CheckObject(policy.OpRead, rel, info.Object()); err != nil {
		skip(string(policy.CodeOf(err)))
		return nil
	}
	e := Entry{Path: rel, Type: typ, Size: info.Size, Perm: info.Perm, MTime: info.Stat.Mtim.Nano()}
	if ie, ok := old.lookup(rel); ok && ie.matches(&info.Stat) {
		e.SHA256 = ie.sha
	} else {
		s.todo = append(s.todo, len(s.entries))
	}
	s.entries = append(s.entries, e)
	s.stats = append(s.stats, entryOf(kindFile, info, ""))
	return nil
}

// scan walks the whole scope (view is unfiltered) once, in walk order:
// every directory before what it holds, names sorted. (Reading
// directories in parallel was tried: on a local disk it was slower, each
// directory then being resolved again from the scope root.)
func scan(ctx context.Context, view *store.Workspace, old *state) (*scanned, error) {
	n := len(old.starts) + len(old.over) + len(old.starts)/8 + 64
	s := &scanned{entries: make([]Entry, 0, n), stats: make([]indexEntry, 0, n)}
	root, err := view.Lstat(".")
	if err != nil {
		return nil, err
	}
	err = view.Walk(ctx, ".", func(rel string, info store.Info) error {
		return s.add(rel, info, root.Stat.Dev, old)
	})
	return s, err
}
