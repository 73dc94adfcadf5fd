package tools

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/agentloom/loomfs/fork"
	"github.com/agentloom/loomfs/policy"
)

// workspace_fork_status: an agent in a forked scope (package fork) sees
// its base, what a merge would bring back now and what it would hold back,
// and what changed in the source since. It changes nothing; whether an
// agent may merge is the policy's decision (workspace_merge). The hashes
// of files the agent may not read are withheld.

const (
	defaultForkStatusLimit = 200
	maxForkStatusLimit     = 2000
)

func forkStatusDefinition(paths string) Definition {
	return Definition{ForkStatus, fmt.Sprintf("Tell whether this workspace is a fork of another (a copy made for you from a snapshot of it, to be merged back by the platform) and, if so: from (the workspace it was copied from), base (its snapshot), forked_at, mergeable (each file you changed since that a merge now would bring back: path and op), conflicts (paths changed both here and there since the base, with type both_modified, modified_deleted, deleted_modified, both_added or type_changed and the three sha256), refused (changes the other workspace's rules do not take), source_changed (paths changed there since the base) and truncated. forks lists the workspaces forked from this one (sub-agents' copies) with what merging each here would do now: scope, base, mergeable (how many changes), conflicts and refused (how many). A merge applies the mergeable changes only if nothing conflicts; to clear a conflict, make the file here what you want it to be given the other side's version, or leave it as it was at the base. Changes nothing. Each list holds at most limit paths (default %d). %s", defaultForkStatusLimit, paths),
		schema(nil, map[string]prop{
			"limit": {"type": "integer", "minimum": 1, "maximum": maxForkStatusLimit, "description": fmt.Sprintf("Most paths per list (default %d).", defaultForkStatusLimit)},
		})}
}

// forkStatusResult is the answer: the scope's own fork status, if it is
// a fork, and a merge preview of each scope forked from it.
type forkStatusResult struct {
	Forked bool `json:"forked"`
	*fork.Status
	Forks []forkPreview `json:"forks"`
}

// forkPreview is what merging one fork into this scope would do now.
type forkPreview struct {
	Scope     string          `json:"scope"`
	Base      string          `json:"base"`
	Mergeable int             `json:"mergeable"`
	Conflicts []fork.Conflict `json:"conflicts"`
	Refused   int             `json:"refused"`
}

func handleForkStatus(ctx context.Context, t *Toolbox, input json.RawMessage) (any, error) {
	var in struct {
		Limit int `json:"limit"`
	}
	if err := decode(input, &in); err != nil {
		return nil, err
	}
	limit, err := bound("limit", in.Limit, maxForkStatusLimit)
	if err != nil {
		return nil, err
	}
	if in.Limit == 0 {
		limit = defaultForkStatusLimit
	}
	res := forkStatusResult{Forks: []forkPreview{}}
	// The record is read once: it names the source, and the status uses it.
	rec, err := fork.HoldRecord(t.WS.Volume(), t.WS.Scope())
	switch policy.CodeOf(err) {
	case policy.NotFound:
	case "":
		defer rec.Close()
		src, err := t.WS.Volume().Open(ctx, rec.From, t.WS.Policy().WithScope(rec.From.Main()))
		if err != nil {
			return nil, fmt.Errorf("open the workspace this one was forked from: %w", err)
		}
		defer src.Close()
		if res.Status, err = rec.Status(ctx, t.WS, src, limit); err != nil {
			return nil, err
		}
		withhold(res.Mergeable, res.Status.Conflicts, t.WS.Policy(), src.Policy())
		res.Forked = true
	default:
		return nil, err
	}
	forks, err := fork.Forks(t.WS.Volume(), t.WS.Scope())
	if err != nil {
		return nil, err
	}
	for _, sc := range forks {
		if len(res.Forks) == limit {
			break
		}
		ws, err := t.WS.Volume().Open(ctx, sc, t.WS.Policy().WithScope(sc.Main()))
		if err != nil {
			return nil, fmt.Errorf("open the fork %s: %w", sc, err)
		}
		m, err := fork.Merge(ctx, ws, t.WS, fork.MergeOptions{DryRun: true})
		ws.Close()
		if err != nil {
			return nil, fmt.Errorf("preview the merge of %s: %w", sc, err)
		}
		withhold(nil, m.Conflicts, t.WS.Policy(), ws.Policy())
		res.Forks = append(res.Forks, forkPreview{Scope: m.From, Base: m.Base, Mergeable: len(m.Applied), Conflicts: m.Conflicts, Refused: len(m.Refused)})
	}
	return res, nil
}
