package tools

import (
	"context"
	"encoding/json"
	"time"

	"github.com/agentloom/loomfs/changes"
	"github.com/agentloom/loomfs/policy"
)

// workspace_changes: the scope's change feed (package changes), bounded
// and long-polled.

// maxChangesWait bounds wait_ms.
const maxChangesWait = 60_000

func handleChanges(ctx context.Context, t *Toolbox, input json.RawMessage) (any, error) {
	var in struct {
		Since  string `json:"since"`
		Path   string `json:"path"`
		Limit  int    `json:"limit"`
		WaitMS int    `json:"wait_ms"`
	}
	if err := decode(input, &in); err != nil {
		return nil, err
	}
	limit, err := bound("limit", in.Limit, changes.MaxLimit)
	if err != nil {
		return nil, err
	}
	if in.Limit == 0 {
		limit = changes.DefaultLimit
	}
	if in.WaitMS < 0 || in.WaitMS > maxChangesWait {
		return nil, policy.Errorf(policy.InvalidInput, "wait_ms %d is out of range: allowed 0–%d", in.WaitMS, maxChangesWait)
	}
	prefix := "."
	if in.Path != "" {
		// The prefix names a place, not an object: it need not exist
		// (it may be deleted, or yet to be made), but it must be one the
		// policy lets the caller see.
		tg, err := t.WS.Policy().Target(policy.OpStat, in.Path)
		if err != nil {
			return nil, err
		}
		if tg.Rel != "." && t.WS.Policy().ModeOf(tg.Rel) == policy.ModeHidden {
			return nil, policy.Errorf(policy.NotFound, "%s: no such file or directory", tg.Rel)
		}
		prefix = tg.Rel
	}
	return changes.Read(ctx, t.WS, changes.Query{Since: in.Since, Prefix: prefix, Limit: limit, Wait: time.Duration(in.WaitMS) * time.Millisecond})
}
