package snapshot

import (
	"context"
	"maps"
	"slices"
	"strings"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// replay finds the scope's entries without walking it: the previous
// snapshot's, from the index, with every path the change journals name
// looked at again (and, for a subtree change, walked). A change to an
// entry also changes its directory's modification time, so that
// directory is looked at too. It returns why the scope must be walked
// instead when a change can't be followed this way.
func replay(ctx context.Context, view *store.Workspace, old *state, journals []store.JournalFile) (*scanned, string) {
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
	updates := map[string]indexEntry{}
	for _, p := range paths {
		dirs := []string{p}
		if d, _ := policy.Split(p); d != "." {
			dirs = append(dirs, d)
		}
		for _, d := range dirs {
			if _, done := updates[d]; done || drop[d] || underAny(d, dropTree) {
				continue // walked again, or gone
			}
			if e, ok := old.lookup(d); !ok || e.kind != kindDir {
				return nil, "a changed path's directory is not in the last snapshot (" + d + ")"
			}
			info, err := view.Lstat(d)
			if err != nil || info.Kind != policy.KindDir {
				return nil, "a changed path's directory changed too (" + d + ")"
			}
			updates[d] = entryOf(kindDir, info, "")
		}
	}

	// The old entries in walk order, less what went, with the updates,
	// merged with the fresh ones (also in walk order).
	add := fresh.named()
	rehash := map[string]bool{}
	for _, i := range fresh.todo {
		rehash[fresh.entries[i].Path] = true
	}
	s := &scanned{entries: make([]Entry, 0, len(old.list)+len(add)), stats: make([]indexEntry, 0, len(old.list)+len(add))}
	emit := func(n named) {
		if n.kind == kindSkipped {
			s.skipped = append(s.skipped, Skipped{n.path, n.sha})
			return
		}
		if rehash[n.path] {
			s.todo = append(s.todo, len(s.entries))
		}
		s.entries = append(s.entries, n.entry(n.path))
		s.stats = append(s.stats, n.indexEntry)
	}
	for _, n := range old.list {
		replaced := false
		for len(add) > 0 && walkOrder(add[0].path, n.path) <= 0 {
			replaced = replaced || add[0].path == n.path
			emit(add[0])
			add = add[1:]
		}
		if replaced || drop[n.path] || len(dropTree) > 0 && underAny(n.path, dropTree) {
			continue
		}
		if u, ok := updates[n.path]; ok {
			n.indexEntry = u
		}
		emit(n)
	}
	for _, n := range add {
		emit(n)
	}
	return s, ""
}

// named returns s's entries and skipped objects as index entries, in walk
// order; a file's hash is the one found unchanged in the index, if any.
func (s *scanned) named() []named {
	out := make([]named, 0, len(s.entries)+len(s.skipped))
	for i, e := range s.entries {
		st := s.stats[i]
		st.sha = e.SHA256
		out = append(out, named{e.Path, st})
	}
	for _, sk := range s.skipped {
		out = append(out, named{sk.Path, indexEntry{kind: kindSkipped, sha: sk.Reason}})
	}
	slices.SortStableFunc(out, func(a, b named) int { return walkOrder(a.path, b.path) })
	return slices.CompactFunc(out, func(a, b named) bool { return a.path == b.path })
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
