package loom

import (
	"context"
	"fmt"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/fork"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// Fork makes the scope named to a copy of the scope named from as of a
// snapshot (package fork), both named as OpenWorkspace names them, and
// audits it on both scopes as the platform's. A destination that is a
// fork of from already (a platform retrying) answers that fork's record,
// with Existing set, instead of a refusal.
func (n *Node) Fork(ctx context.Context, from, to string, opt fork.Options) (*fork.Result, error) {
	src, doneSrc, err := n.OpenWorkspace(ctx, from)
	if err != nil {
		return nil, err
	}
	defer doneSrc()
	dst, doneDst, err := n.OpenWorkspace(ctx, to)
	if err != nil {
		return nil, err
	}
	defer doneDst()
	res, err := fork.Fork(ctx, src, dst, opt)
	if policy.CodeOf(err) == policy.Exists {
		if done := forkedAlready(dst, src.Scope(), opt.Snapshot); done != nil {
			return done, nil
		}
	}
	if err != nil {
		return nil, err
	}
	log, err := audit.Open(dst.Volume().Path(), audit.Options{})
	if err != nil {
		return res, fmt.Errorf("forked %s to %s, but the audit log is unavailable: %w", res.From, res.To, AuditUnavailable(err))
	}
	defer log.Close()
	detail := map[string]any{"from": res.From, "to": res.To, "snapshot": res.Snapshot, "files": res.Files, "bytes": res.Bytes, "clone": res.Clone}
	for _, r := range []struct {
		op string
		sc store.Scope
	}{{"fork", dst.Scope()}, {"fork_source", src.Scope()}} {
		ev := audit.Event{Actor: Actor(r.sc), Scope: r.sc.Hash(), Source: audit.SourcePlatform, Op: r.op, Result: "ok", Detail: detail}
		if err := log.Record(ctx, ev); err != nil {
			return res, fmt.Errorf("forked %s to %s, but the audit record failed: %w", res.From, res.To, AuditUnavailable(err))
		}
	}
	return res, nil
}

// StartChild starts the child instance of a run from its main scope's
// files: a fork of the run's main scope into RUN/INSTANCE, both opened
// through the run's binding (SPEC §2.3), so a sub-agent that should work
// on main's tree finds it there.
func (n *Node) StartChild(ctx context.Context, runID, instance string, opt fork.Options) (*fork.Result, error) {
	if err := store.ValidateID("instance", instance); err != nil {
		return nil, err
	}
	return n.Fork(ctx, "run:"+runID, "run:"+runID+"/"+instance, opt)
}

// forkedAlready is the result of a fork made earlier from src into dst
// (of snapshot, when one is named), or nil when dst is no such fork.
func forkedAlready(dst *store.Workspace, src store.Scope, snapshot string) *fork.Result {
	rec, err := fork.ReadRecord(dst.Volume(), dst.Scope())
	if err != nil || rec.From != src || (snapshot != "" && rec.Snapshot != snapshot) {
		return nil
	}
	res := &fork.Result{From: src.String(), To: dst.Scope().String(), Snapshot: rec.Snapshot, Clone: rec.Clone, Skipped: rec.Skipped, Existing: true}
	for _, e := range rec.Entries {
		if e.Type == "dir" {
			res.Dirs++
		} else {
			res.Files++
			res.Bytes += e.Size
		}
	}
	return res
}
