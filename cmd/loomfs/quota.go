package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"go.uber.org/zap"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// quotaReport is what loomfs check --scope says of a scope's quota account:
// the account as every holder counted it, beside a walk of the scope.
type quotaReport struct {
	Scope   string `json:"scope"`
	Known   bool   `json:"known"` // the account exists (something has changed the scope through loomfs)
	Account counts `json:"account"`
	Walk    counts `json:"walk"`
	Granted counts `json:"granted"` // held by live holders, not spent yet
	Holders int    `json:"holders"` // processes with the scope open for changes now
	Dead    int    `json:"dead"`    // holders gone, not folded in yet (the next grant folds them)
	Match   bool   `json:"match"`
	OK      bool   `json:"ok"`
	Detail  string `json:"detail"`
}

// counts is a policy.Usage as the JSON output names it.
type counts struct {
	Bytes int64 `json:"bytes"`
	Files int64 `json:"files"`
}

func countsOf(u policy.Usage) counts { return counts{u.Bytes, u.Files} }

// checkQuota compares the scope's account with a walk, changing nothing.
// A difference fails the check only when no holder is live: one that is
// writing now may not have told the account yet.
func checkQuota(ctx context.Context, ws *store.Workspace) quotaReport {
	r := quotaReport{Scope: ws.Scope().String()}
	st, err := ws.QuotaState()
	if err != nil {
		r.Detail = fmt.Sprintf("the account can't be read: %v", err)
		return r
	}
	walk, err := ws.CountUsage(ctx)
	if err != nil {
		r.Detail = fmt.Sprintf("the scope can't be walked: %v", policy.Public(err))
		return r
	}
	r.Known, r.Account, r.Walk = st.Known, countsOf(st.Used), countsOf(walk)
	r.Granted, r.Holders, r.Dead = countsOf(st.Granted), st.Holders, st.Dead
	r.Match = !st.Known || st.Used == walk
	switch {
	case !st.Known:
		r.OK, r.Detail = true, "no account yet: the first change counts the scope"
	case r.Match:
		r.OK, r.Detail = true, "the account matches a walk of the scope"
	case st.Holders > 0:
		r.OK, r.Detail = true, fmt.Sprintf("the account differs from the walk while %d holders have the scope open; their reconcile corrects it once they are idle", st.Holders)
	default:
		r.Detail = "the account differs from the walk and no holder is live; the next holder's reconcile corrects it"
	}
	return r
}

func printQuota(w io.Writer, r quotaReport) {
	mark := "ok  "
	if !r.OK {
		mark = "FAIL"
	}
	fmt.Fprintf(w, "  %s  %-21s %s: account %s in %d entries, walk %s in %d entries, %d holders (%s granted); %s\n",
		mark, "quota", r.Scope, policy.Bytes(r.Account.Bytes), r.Account.Files, policy.Bytes(r.Walk.Bytes), r.Walk.Files,
		r.Holders, policy.Bytes(r.Granted.Bytes), r.Detail)
}

// reconcileEvery corrects the scope's account to a walk of the scope
// every interval, while ctx lasts (quota.Account.Reconcile logs each
// correction).
func reconcileEvery(ctx context.Context, ws *store.Workspace, every time.Duration, log *zap.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := ws.Reconcile(ctx, log); err != nil && ctx.Err() == nil {
			log.Warn("quota reconcile", zap.Error(err))
		}
	}
}
