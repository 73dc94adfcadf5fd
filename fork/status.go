package fork

import (
	"context"
	"sort"
	"time"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/snapshot"
	"github.com/agentloom/loomfs/store"
)

// Status is what an agent in a fork may know of it: its base, what it
// changed since, what changed in the source since, and what a merge would
// make of it now.
type Status struct {
	From     string    `json:"from"`
	Base     string    `json:"base"`
	ForkedAt time.Time `json:"forked_at"`
	// Mergeable lists what the fork changed since its base that a merge
	// now would bring over: path and op ("create", "write", "delete",
	// "mkdir", "rmdir").
	Mergeable []Applied `json:"mergeable"`
	// SourceChanged lists the paths changed in the source since the
	// fork's snapshot; SourceUnknown says why that can't be told.
	SourceChanged []string `json:"source_changed"`
	SourceUnknown string   `json:"source_unknown,omitempty"`
	// Conflicts are the paths a merge now would hold back.
	Conflicts []Conflict `json:"conflicts"`
	Refused   []Refused  `json:"refused,omitempty"`
	Truncated bool       `json:"truncated"`
}

// ReadStatus tells the status of the fork scope fork, whose source
// scope is open as source (ReadRecord names it). It changes nothing and
// takes no lock. Paths hidden in the fork are never listed, and at most
// limit paths are listed in each list.
func ReadStatus(ctx context.Context, fork, source *store.Workspace, limit int) (*Status, error) {
	h, err := HoldRecord(fork.Volume(), fork.Scope())
	if err != nil {
		return nil, err
	}
	defer h.Close()
	return h.Status(ctx, fork, source, limit)
}

// Status is ReadStatus with the fork's record held already: one read
// serves the caller, the status and the merge's preview.
func (h *HeldRecord) Status(ctx context.Context, fork, source *store.Workspace, limit int) (*Status, error) {
	prev, err := h.Merge(ctx, fork, source, MergeOptions{DryRun: true})
	if err != nil {
		return nil, err
	}
	rec := h.Record
	st := &Status{From: rec.From.String(), Base: rec.Snapshot, ForkedAt: rec.Created,
		Mergeable: prev.Applied, Conflicts: prev.Conflicts, Refused: prev.Refused, SourceChanged: []string{}}
	if d, err := snapshot.Diff(ctx, source, rec.Snapshot, snapshot.Live); err != nil {
		st.SourceUnknown = policy.Public(err).Message
	} else {
		pol := fork.Policy()
		for _, list := range [][]string{d.Added, d.Changed, d.Removed} {
			for _, p := range list {
				if pol.ModeOf(p) != policy.ModeHidden && source.Policy().ModeOf(p) != policy.ModeHidden {
					st.SourceChanged = append(st.SourceChanged, p)
				}
			}
		}
	}
	sort.Strings(st.SourceChanged)
	cut := func(n int) int {
		if n > limit {
			st.Truncated = true
			return limit
		}
		return n
	}
	st.Mergeable = st.Mergeable[:cut(len(st.Mergeable))]
	st.SourceChanged = st.SourceChanged[:cut(len(st.SourceChanged))]
	st.Conflicts = st.Conflicts[:cut(len(st.Conflicts))]
	return st, nil
}
