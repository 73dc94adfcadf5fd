package health

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// TestProbeDir: a probe writes, reads back and deletes its file, leaving
// the directory as it was; a directory it can't write fails it.
func TestProbeDir(t *testing.T) {
	cases := []struct {
		name string
		dir  func(t *testing.T) string
		ok   bool
	}{
		{"a writable directory passes and is left empty", func(t *testing.T) string { return t.TempDir() }, true},
		{"a missing directory fails", func(t *testing.T) string { return filepath.Join(t.TempDir(), "gone") }, false},
		{"a file in place of the directory fails", func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "file")
			os.WriteFile(p, nil, 0o600)
			return p
		}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := c.dir(t)
			err := ProbeDir(context.Background(), dir)
			if (err == nil) != c.ok {
				t.Fatalf("ProbeDir: %v, want ok %v", err, c.ok)
			}
			if c.ok {
				ents, _ := os.ReadDir(dir)
				if len(ents) != 0 {
					t.Errorf("left %d entries behind", len(ents))
				}
			}
		})
	}
}

// TestCheckerLogsChanges: a failure is logged when it starts and the
// recovery when it ends, not at every probe.
func TestCheckerLogsChanges(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	c := &Checker{Log: zap.New(core)}
	bad := errors.New("disk gone")
	for _, err := range []error{nil, bad, bad, bad, nil, nil} {
		c.Report("volume", err, time.Millisecond)
	}
	var msgs []string
	for _, e := range logs.All() {
		msgs = append(msgs, e.Message)
	}
	want := []string{"self-check failed", "self-check passes again"}
	if len(msgs) != len(want) || msgs[0] != want[0] || msgs[1] != want[1] {
		t.Errorf("logged %q, want %q", msgs, want)
	}
}

// TestReadyz: /readyz answers 200 while every condition holds and every
// self-check passes, 503 naming what fails otherwise; /healthz answers
// while the process does.
func TestReadyz(t *testing.T) {
	cases := []struct {
		name   string
		probe  error
		cond   error
		status int
	}{
		{"all passing is ready", nil, nil, http.StatusOK},
		{"a failing self-check is not ready", errors.New("probe: read back 0 bytes"), nil, http.StatusServiceUnavailable},
		{"a failing condition is not ready", nil, errors.New("volume marker missing"), http.StatusServiceUnavailable},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := &Checker{Every: time.Hour}
			c.Add("volume", func(context.Context) error { return tc.probe })
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { c.Run(ctx); close(done) }()
			t.Cleanup(func() { cancel(); <-done })
			deadline := time.Now().Add(5 * time.Second)
			for len(c.Results()) == 0 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			mux := http.NewServeMux()
			c.Handle(mux, func() []Condition {
				return []Condition{{Name: "volume_marker", Check: func(context.Context) error { return tc.cond }}}
			})
			srv := httptest.NewServer(mux)
			defer srv.Close()
			resp, err := http.Get(srv.URL + "/readyz")
			if err != nil {
				t.Fatal(err)
			}
			var rd Readiness
			json.NewDecoder(resp.Body).Decode(&rd)
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Errorf("status %d, want %d (%+v)", resp.StatusCode, tc.status, rd)
			}
			if len(rd.SelfChecks) != 1 || rd.SelfChecks[0].OK != (tc.probe == nil) {
				t.Errorf("self_checks %+v", rd.SelfChecks)
			}
			if tc.cond != nil && rd.Conditions["volume_marker"] != tc.cond.Error() {
				t.Errorf("conditions %v, want the marker's failure named", rd.Conditions)
			}
			resp, err = http.Get(srv.URL + "/healthz")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("/healthz %d", resp.StatusCode)
			}
		})
	}
}

// TestForgetDropsResult: a target removed (its mount gone) is neither
// probed nor reported any more.
func TestForgetDropsResult(t *testing.T) {
	c := &Checker{}
	remove := c.Add("acme/coder/s1", func(context.Context) error { return nil })
	c.round(context.Background(), time.Second)
	if len(c.Results()) != 1 {
		t.Fatalf("results %v", c.Results())
	}
	remove()
	c.round(context.Background(), time.Second)
	if len(c.Results()) != 0 {
		t.Errorf("results after remove: %v", c.Results())
	}
}
