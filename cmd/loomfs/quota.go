package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"go.uber.org/zap"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/quota"
	"github.com/agentloom/loomfs/store"
)

// quotaReport is what loomfs check --scope says of a scope's quota account
// and those of its capped subtrees: each account as every holder counted
// it, beside a walk.
type quotaReport struct {
	Scope string `json:"scope"`
	accountReport
	Subtrees []subtreeReport `json:"subtrees,omitempty"`
}

// subtreeReport is the account of one capped subtree (tmp/).
type subtreeReport struct {
	Path string `json:"path"`
	accountReport
}

// accountReport compares one account with a walk of what it counts.
type accountReport struct {
	Known   bool   `json:"known"` // the account exists (something has changed what it counts through loomfs)
	Account counts `json:"account"`
	Walk    counts `json:"walk"`
	Granted counts `json:"granted"`          // held by live holders, not spent yet
	Holders int    `json:"holders"`          // processes with the scope open for changes now
	Dead    int    `json:"dead"`             // holders gone, not folded in yet (the next grant folds them)
	Unsure  bool   `json:"unsure,omitempty"` // a holder on another node died with a grant, counted as spent: counted again once that node's peers are idle
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

// checkQuota compares the scope's account, and that of each capped
// subtree, with a walk, changing nothing.
func checkQuota(ctx context.Context, ws *store.Workspace) quotaReport {
	r := quotaReport{Scope: ws.Scope().String()}
	r.accountReport = compareAccount(ws.QuotaState, func() (policy.Usage, error) { return ws.CountUsage(ctx) }, "the scope")
	for _, s := range ws.Policy().Subtrees {
		if !s.Capped() {
			continue
		}
		state := func() (quota.State, error) { return ws.SubtreeQuotaState(s.Prefix) }
		walk := func() (policy.Usage, error) { return ws.CountSubtree(ctx, s.Prefix) }
		sr := subtreeReport{Path: s.Prefix + "/", accountReport: compareAccount(state, walk, s.Prefix+"/")}
		r.Subtrees = append(r.Subtrees, sr)
	}
	return r
}

// allOK reports whether the scope's account and every subtree's pass.
func (r quotaReport) allOK() bool {
	ok := r.OK
	for _, s := range r.Subtrees {
		ok = ok && s.OK
	}
	return ok
}

// compareAccount reads an account and walks what it counts. A difference
// fails only when no holder is live: one that is writing now may not have
// told the account yet.
func compareAccount(state func() (quota.State, error), walk func() (policy.Usage, error), what string) accountReport {
	var r accountReport
	st, err := state()
	if err != nil {
		r.Detail = fmt.Sprintf("the account can't be read: %v", err)
		return r
	}
	w, err := walk()
	if err != nil {
		r.Detail = fmt.Sprintf("%s can't be walked: %v", what, policy.Public(err))
		return r
	}
	r.Known, r.Account, r.Walk = st.Known, countsOf(st.Used), countsOf(w)
	r.Granted, r.Holders, r.Dead, r.Unsure = countsOf(st.Granted), st.Holders, st.Dead, st.Unsure
	r.Match = !st.Known || st.Used == w
	switch {
	case !st.Known:
		r.OK, r.Detail = true, fmt.Sprintf("no account yet: the first change counts %s", what)
	case r.Match:
		r.OK, r.Detail = true, fmt.Sprintf("the account matches a walk of %s", what)
	case st.Holders > 0:
		r.OK, r.Detail = true, fmt.Sprintf("the account differs from the walk while %d holders have the scope open; their reconcile corrects it once they are idle", st.Holders)
	default:
		r.Detail = "the account differs from the walk and no holder is live; the next holder's reconcile corrects it"
	}
	if st.Unsure && !r.Match {
		r.Detail += " (a holder on another node ended holding a grant, which is counted as spent until the scope is counted again: by the first holder that goes idle while no other node's holder is active)"
	}
	if st.Unlocked {
		r.Detail += " (read without the account's lock, which a holder kept too long: a share being folded in just then may be counted twice or missed)"
	}
	return r
}

func printQuota(w io.Writer, r quotaReport) {
	printAccount(w, "quota", r.Scope, r.accountReport)
	for _, s := range r.Subtrees {
		printAccount(w, "quota "+s.Path, r.Scope, s.accountReport)
	}
}

func printAccount(w io.Writer, name, scope string, r accountReport) {
	mark := "ok  "
	if !r.OK {
		mark = "FAIL"
	}
	fmt.Fprintf(w, "  %s  %-21s %s: account %s in %d entries, walk %s in %d entries, %d holders (%s granted); %s\n",
		mark, name, scope, policy.Bytes(r.Account.Bytes), r.Account.Files, policy.Bytes(r.Walk.Bytes), r.Walk.Files,
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
