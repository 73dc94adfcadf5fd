package tools

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/fork"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// workspace_merge: an agent in a forked scope brings its changes back into
// the scope it was forked from itself, where the policy lets it
// (policy.CheckAgentMerge; off by default, and then every call is
// refused). A call without a preview is a dry run that names its plan; a
// merge must pass that name, and applies nothing unless the plan is still
// the same, so what is merged is what the agent looked at.

func init() {
	handlers[Merge] = handleMerge
	mutating[Merge] = true
	// fork.Merge takes the fork's and the target's scope locks itself.
	selfLocking[Merge] = true
}

func mergeDefinition(pol *policy.Policy, paths string) Definition {
	desc := "Merge this workspace's changes back into the workspace it was forked from. This workspace's policy does not let agents merge (agent_merge is off): every call is refused, and the platform merges your work; workspace_fork_status shows what a merge would do. " + paths
	if pol.AgentMerge {
		desc = fmt.Sprintf("Merge this workspace's changes back into the workspace it was forked from, per file, against the snapshot it was forked from. First call it without preview: a dry run that changes nothing and answers applied (each change a merge would make: path and op), conflicts (paths changed on both sides since the base, typed both_modified, modified_deleted, deleted_modified, both_added or type_changed), refused (changes the other workspace's rules do not take) and preview, the name of that plan. Then call it with that preview to merge: everything is applied or nothing, and only if the plan is still the same (else code conflict: preview again). With conflicts or refusals nothing is merged (merged false, and message says why) unless partial. A change made there since the fork is never overwritten. Hashes of files you may not read are withheld. %s", paths)
	}
	return Definition{Merge, desc, schema(nil, map[string]prop{
		"preview": {"type": "string", "description": "The preview a dry run of this tool answered; omitted, the call is a dry run."},
		"partial": {"type": "boolean", "description": "Apply the changes that conflict with nothing even when others do."},
		"paths":   {"type": "array", "items": map[string]any{"type": "string"}, "description": "Merge only these paths and what is under them; default everything."},
	})}
}

// mergeResult is the answer: the merge's result with the hashes of files
// the agent may not read withheld, and why nothing was merged, if so.
type mergeResult struct {
	*fork.MergeResult
	Message string `json:"message,omitempty"`
}

func handleMerge(ctx context.Context, t *Toolbox, input json.RawMessage) (any, error) {
	var in struct {
		Preview string   `json:"preview"`
		Partial bool     `json:"partial"`
		Paths   []string `json:"paths"`
	}
	if err := decode(input, &in); err != nil {
		return nil, err
	}
	if err := t.WS.Policy().CheckAgentMerge(); err != nil {
		return nil, err
	}
	// The record is read once: it names the target, and the merge uses it.
	rec, err := fork.HoldRecord(t.WS.Volume(), t.WS.Scope())
	if policy.CodeOf(err) == policy.NotFound {
		return nil, policy.Errorf(policy.NotFound, "this workspace is not a fork of another: there is nothing to merge back")
	}
	if err != nil {
		return nil, err
	}
	defer rec.Close()
	target, err := t.WS.Volume().Open(ctx, rec.From, t.WS.Policy().WithScope(rec.From.Main()))
	if err != nil {
		return nil, fmt.Errorf("open the workspace this one was forked from: %w", err)
	}
	defer target.Close()
	dry := in.Preview == ""
	res, err := rec.Merge(ctx, t.WS, target, fork.MergeOptions{
		DryRun: dry, Partial: in.Partial, Paths: in.Paths, Preview: in.Preview,
		Call: CallID(ctx), Source: store.SourceTool,
	})
	if res == nil || (err != nil && res.Preview != in.Preview && !dry) {
		return nil, err
	}
	out := mergeResult{MergeResult: res}
	if err != nil {
		out.Message = policy.Public(err).Message
	}
	if !dry {
		ev := audit.Event{TraceID: t.TraceID, CallID: CallID(ctx), Actor: t.Actor, Scope: target.Scope().Hash(), Source: audit.SourceTool, Op: Merge, Result: "ok",
			Detail: map[string]any{"from": res.From, "into": res.Into, "base": res.Base, "merged": res.Merged, "applied": len(res.Applied), "conflicts": len(res.Conflicts), "refused": len(res.Refused)}}
		if err != nil {
			ev.Result, ev.Code = "refused", string(policy.CodeOf(err))
		}
		// The merge is made: a failed record is in the log's status, as
		// for every change (Toolbox.audited).
		t.sink().Record(ctx, ev)
	}
	withhold(res.Applied, res.Conflicts, t.WS.Policy(), target.Policy())
	return out, nil
}

// withheld stands for the hash of a file its reader may not read.
const withheld = "withheld"

// withhold replaces the hashes of the paths that one of pols does not let
// be read (write-only, hidden): a hash would let an agent confirm a guess
// of content it may not read.
func withhold(applied []fork.Applied, conflicts []fork.Conflict, pols ...*policy.Policy) {
	readable := func(rel string) bool {
		for _, p := range pols {
			if p.Check(policy.OpRead, rel) != nil {
				return false
			}
		}
		return true
	}
	hide := func(h *string) {
		if *h != "" && *h != "dir" {
			*h = withheld
		}
	}
	for i := range applied {
		if a := &applied[i]; !readable(a.Path) {
			hide(&a.Base)
			hide(&a.Fork)
		}
	}
	for i := range conflicts {
		if c := &conflicts[i]; !readable(c.Path) {
			hide(&c.Base)
			hide(&c.Target)
			hide(&c.Fork)
		}
	}
}
