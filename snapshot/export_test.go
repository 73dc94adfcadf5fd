package snapshot

import (
	"context"

	"github.com/agentloom/loomfs/store"
)

// WalkNow describes the scope as a full walk finds it now, hashing every
// file, and what the walk would skip: what a snapshot taken now must hold.
func WalkNow(ctx context.Context, ws *store.Workspace) ([]Entry, []Skipped, error) {
	repo, err := OpenRepo(ws.Volume(), ws.Scope(), true)
	if err != nil {
		return nil, nil, err
	}
	defer repo.Close()
	entries, err := repo.live(ctx, ws)
	if err != nil {
		return nil, nil, err
	}
	found, err := scan(ctx, ws.Unfiltered(), &state{})
	if err != nil {
		return nil, nil, err
	}
	return entries, found.skipped, nil
}
