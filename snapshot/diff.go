package snapshot

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"sort"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// Changes lists the paths that differ between two states of a scope.
type Changes struct {
	From    string   `json:"from"`
	To      string   `json:"to"` // "live" for the scope as it is now
	Added   []string `json:"added"`
	Changed []string `json:"changed"` // content, type or owner permissions differ
	Removed []string `json:"removed"`
}

// Live names the scope as it is now in Diff.
const Live = "live"

// Diff compares snapshot from with snapshot to, or with the scope as it is
// now when to is Live or "". Files unchanged since the last snapshot (by
// the index) are not read again. Diff takes no lock: against the live
// scope it shows a moment of a scope that may be changing.
func Diff(ctx context.Context, ws *store.Workspace, from, to string) (*Changes, error) {
	repo, err := OpenRepo(ws.Volume(), ws.Scope(), false)
	if err != nil {
		return nil, err
	}
	defer repo.Close()
	a, err := repo.Entries(from)
	if err != nil {
		return nil, err
	}
	var b []Entry
	if to == "" || to == Live {
		to = Live
		b, err = repo.live(ctx, ws)
	} else {
		b, err = repo.Entries(to)
	}
	if err != nil {
		return nil, err
	}
	return compare(from, to, a, b), nil
}

func compare(from, to string, a, b []Entry) *Changes {
	c := &Changes{From: from, To: to, Added: []string{}, Changed: []string{}, Removed: []string{}}
	old := make(map[string]Entry, len(a))
	for _, e := range a {
		old[e.Path] = e
	}
	seen := make(map[string]bool, len(b))
	for _, e := range b {
		seen[e.Path] = true
		o, ok := old[e.Path]
		switch {
		case !ok:
			c.Added = append(c.Added, e.Path)
		case o.Type != e.Type || o.SHA256 != e.SHA256 || o.Perm&0o700 != e.Perm&0o700:
			c.Changed = append(c.Changed, e.Path)
		}
	}
	for _, e := range a {
		if !seen[e.Path] {
			c.Removed = append(c.Removed, e.Path)
		}
	}
	sort.Strings(c.Added)
	sort.Strings(c.Changed)
	sort.Strings(c.Removed)
	return c
}

// live describes the scope as it is now, as Create would record it, but
// stores nothing.
func (r *Repo) live(ctx context.Context, ws *store.Workspace) ([]Entry, error) {
	view := ws.Unfiltered()
	s, err := scan(ctx, view, r.loadState())
	if err != nil {
		return nil, err
	}
	gone := map[int]bool{}
	for _, i := range s.todo {
		e := &s.entries[i]
		f, _, err := view.Open(policy.OpRead, e.Path, unix.O_RDONLY)
		if err != nil {
			gone[i] = true // removed or made unusable since the walk saw it
			continue
		}
		h := sha256.New()
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return nil, policy.FromErrno(err, "read", e.Path)
		}
		e.SHA256 = hex.EncodeToString(h.Sum(nil))
	}
	out := s.entries[:0]
	for i, e := range s.entries {
		if !gone[i] {
			out = append(out, e)
		}
	}
	return out, nil
}
