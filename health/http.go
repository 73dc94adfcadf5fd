package health

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"time"
)

// Condition is one thing /readyz asks: nil means it holds.
type Condition struct {
	Name  string // "volume", "engine"
	Check func(context.Context) error
}

// Readiness is /readyz's answer.
type Readiness struct {
	Ready      bool              `json:"ready"`
	Conditions map[string]string `json:"conditions"` // name → "ok" or what is wrong
	SelfChecks []Result          `json:"self_checks"`
}

// Ready asks each condition (each within timeout) and the checker's last
// results: ready when every condition holds and every self-check passes.
func (c *Checker) Ready(ctx context.Context, conds []Condition, timeout time.Duration) Readiness {
	r := Readiness{Ready: true, Conditions: map[string]string{}, SelfChecks: c.Results()}
	for _, cond := range conds {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		done := make(chan error, 1)
		go func() { done <- cond.Check(cctx) }()
		var err error
		select {
		case err = <-done:
		case <-cctx.Done():
			err = cctx.Err()
		}
		cancel()
		if err != nil {
			r.Ready = false
			r.Conditions[cond.Name] = err.Error()
		} else {
			r.Conditions[cond.Name] = "ok"
		}
	}
	if slices.ContainsFunc(r.SelfChecks, func(res Result) bool { return !res.OK }) {
		r.Ready = false
	}
	return r
}

// Handle adds /healthz (the process answers) and /readyz (Ready over the
// conditions conds gives when asked, 200 or 503 with the Readiness as
// JSON) to mux.
func (c *Checker) Handle(mux *http.ServeMux, conds func() []Condition) {
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		rd := c.Ready(r.Context(), conds(), 5*time.Second)
		w.Header().Set("Content-Type", "application/json")
		if !rd.Ready {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		json.NewEncoder(w).Encode(rd)
	})
}
