package snapshot

import (
	"context"
	"maps"
	"slices"
	"strings"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// delta is what changed since the last snapshot, as replay found it.
type delta struct {
	removed []string // entries to drop with all beneath them, walk order
	upserts []named  // entries new or changed, walk order
	read    []int    // upserts whose file must be read (indexes)
	skipped []Skipped
	// Totals of what stays of the last snapshot, upserts not counted.
	files, dirs int
	bytes       int64
}

// replay finds what changed without walking the scope: every path the
// change journals name is looked at again (a file read again if its
// lstat differs from the index, a moved or new directory walked), and so
// is its directory, whose times changed with it. It returns why the scope
// must be walked instead when a change can't be followed this way.
func replay(ctx context.Context, view *store.Workspace, old *state, journals []store.JournalFile) (*delta, string) {
	touched := map[string]bool{} // path → the subtree under it changed
	for _, f := range journals {
		for _, c := range f.Changes {
			if c.Path == "." {
				return nil, "the whole scope changed (a restore)"
			}
			touched[c.Path] = touched[c.Path] || c.Subtree
		}
	}
	root, err := view.Lstat(".")
	if err != nil {
		return nil, "the scope root: " + err.Error()
	}
	paths := slices.SortedFunc(maps.Keys(touched), walkOrder)

	// What each path is now. Its old entry goes (drop), and with it the
	// old subtree (dropTree) where that was a directory or the journal
	// says the subtree changed; a directory that stays one, with its
	// contents, is only refreshed.
	now := make(map[string]*store.Info, len(paths))
	drop, dropTree := map[string]bool{}, map[string]bool{}
	d := &delta{files: old.files, dirs: old.dirs, bytes: old.bytes}
	uncount := func(e indexEntry) {
		if e.kind == kindDir {
			d.dirs--
		} else {
			d.files--
			d.bytes -= e.size
		}
	}
	for _, p := range paths {
		info, err := view.Lstat(p)
		switch {
		case policy.CodeOf(err) == policy.NotFound:
		case err != nil:
			// A directory on the way replaced by a symlink, say: the walk
			// records it for what it is.
			return nil, "a changed path can't be looked at (" + p + "): " + err.Error()
		default:
			now[p] = &info
		}
		was, ok := old.lookup(p)
		dirNow := now[p] != nil && now[p].Kind == policy.KindDir
		if ok && was.kind == kindDir && dirNow && !touched[p] {
			continue
		}
		drop[p] = true
		if touched[p] || ok && was.kind == kindDir {
			dropTree[p] = true
		}
		if ok && !underAny(p, dropTree) {
			d.removed = append(d.removed, p)
			uncount(was)
			if was.kind == kindDir {
				old.under(p, func(n named) { uncount(n.indexEntry) })
			}
		}
	}

	// What is there now: a file as it is, a new or moved directory with
	// everything in it.
	fresh := &scanned{}
	walked := map[string]bool{}
	for _, p := range paths {
		info := now[p]
		if info == nil || !drop[p] || underAny(p, walked) {
			continue
		}
		err := fresh.add(p, *info, root.Stat.Dev, old)
		if err == nil && info.Kind == policy.KindDir {
			walked[p] = true
			err = view.Walk(ctx, p, func(rel string, info store.Info) error {
				return fresh.add(rel, info, root.Stat.Dev, old)
			})
		}
		if err != nil && err != store.SkipDir {
			return nil, "a changed directory can't be walked (" + p + "): " + err.Error()
		}
	}
	if ctx.Err() != nil {
		return nil, "cancelled"
	}

	// Directories whose entries changed, and those kept whole, are
	// looked at again for their times and mode.
	updates := map[string]named{}
	for _, p := range paths {
		dirs := []string{p}
		if dir, _ := policy.Split(p); dir != "." {
			dirs = append(dirs, dir)
		}
		for _, dir := range dirs {
			if _, done := updates[dir]; done || drop[dir] || underAny(dir, dropTree) || underAny(dir, walked) {
				continue // walked again, or gone
			}
			e, ok := old.lookup(dir)
			if !ok || e.kind != kindDir {
				return nil, "a changed path's directory is not in the last snapshot (" + dir + ")"
			}
			info, err := view.Lstat(dir)
			if err != nil || info.Kind != policy.KindDir {
				return nil, "a changed path's directory changed too (" + dir + ")"
			}
			uncount(e)
			updates[dir] = named{dir, entryOf(kindDir, info, "")}
		}
	}

	// The upserts: the fresh entries and the updates, in walk order.
	for i, e := range fresh.entries {
		st := fresh.stats[i]
		st.sha = e.SHA256
		d.upserts = append(d.upserts, named{e.Path, st})
	}
	for _, u := range updates {
		d.upserts = append(d.upserts, u)
	}
	rehash := map[string]bool{}
	for _, i := range fresh.todo {
		rehash[fresh.entries[i].Path] = true
	}
	slices.SortFunc(d.upserts, func(a, b named) int { return walkOrder(a.path, b.path) })
	d.upserts = slices.CompactFunc(d.upserts, func(a, b named) bool { return a.path == b.path })
	for i, u := range d.upserts {
		if rehash[u.path] {
			d.read = append(d.read, i)
		}
	}

	// The objects skipped: those still there, and those found now.
	for _, sk := range old.skipped {
		if !drop[sk.Path] && !underAny(sk.Path, dropTree) {
			d.skipped = append(d.skipped, sk)
		}
	}
	d.skipped = append(d.skipped, fresh.skipped...)
	return d, ""
}

// underAny reports whether path lies beneath one of dirs.
func underAny(path string, dirs map[string]bool) bool {
	for i := strings.LastIndexByte(path, '/'); i > 0; i = strings.LastIndexByte(path[:i], '/') {
		if dirs[path[:i]] {
			return true
		}
	}
	return false
}

// walkOrder orders paths as a walk visits them: depth first, names
// sorted, so a directory comes right before what it holds. That is the
// byte order of the paths with "/" taken as lower than any byte a name
// can hold.
func walkOrder(a, b string) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		x, y := a[i], b[i]
		if x == y {
			continue
		}
		if x == '/' {
			return -1
		}
		if y == '/' {
			return 1
		}
		if x < y {
			return -1
		}
		return 1
	}
	return len(a) - len(b)
}

// applyDelta returns base (in walk order) with each path of removed and
// everything beneath it taken out, and upserts (in walk order) put in,
// replacing an entry of the same path.
func applyDelta[T any](base []T, removed []string, upserts []T, path func(T) string) []T {
	gone := make(map[string]bool, len(removed))
	for _, p := range removed {
		gone[p] = true
	}
	out := make([]T, 0, len(base)+len(upserts))
	for _, b := range base {
		p := path(b)
		for len(upserts) > 0 && walkOrder(path(upserts[0]), p) < 0 {
			out = append(out, upserts[0])
			upserts = upserts[1:]
		}
		if len(upserts) > 0 && path(upserts[0]) == p {
			out = append(out, upserts[0])
			upserts = upserts[1:]
			continue
		}
		if len(gone) > 0 && (gone[p] || underAny(p, gone)) {
			continue
		}
		out = append(out, b)
	}
	return append(out, upserts...)
}
