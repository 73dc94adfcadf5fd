// Package health runs loomfs's periodic self-check (SPEC §6: write, read
// back and delete a small file through the path agents use, on each
// mounted scope and on the volume) and answers /healthz and /readyz.
//
// It keeps the last outcome of each target and logs each change of one;
// it never repairs, unmounts or refuses anything itself.
package health

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/agentloom/loomfs/policy"
)

// Result is the last self-check of one target.
type Result struct {
	Target string        `json:"target"` // "volume", or the scope a mount serves
	OK     bool          `json:"ok"`
	Error  string        `json:"error,omitempty"`
	Time   time.Time     `json:"time"` // when the probe ended
	Took   time.Duration `json:"took_ns,omitempty"`
}

// Checker probes its targets every Every and keeps their last results.
// Targets whose owner probes them itself (a mount's own self-check loop)
// hand their outcomes in with Report. It is safe for concurrent use.
type Checker struct {
	Every time.Duration // 0: DefaultEvery
	Log   *zap.Logger   // nil: discarded

	mu      sync.Mutex
	probes  map[string]func(context.Context) error
	results map[string]Result
}

// DefaultEvery is the self-check period unless one is given.
const DefaultEvery = 30 * time.Second

// Add probes target with probe from the next round on; remove stops it and
// forgets its result.
func (c *Checker) Add(target string, probe func(context.Context) error) (remove func()) {
	c.mu.Lock()
	if c.probes == nil {
		c.probes = map[string]func(context.Context) error{}
	}
	c.probes[target] = probe
	c.mu.Unlock()
	return func() { c.Forget(target) }
}

// Forget drops target and its last result.
func (c *Checker) Forget(target string) {
	c.mu.Lock()
	delete(c.probes, target)
	delete(c.results, target)
	c.mu.Unlock()
}

// Report keeps the outcome of a probe of target made elsewhere.
func (c *Checker) Report(target string, err error, took time.Duration) {
	r := Result{Target: target, OK: err == nil, Time: time.Now().UTC(), Took: took}
	if err != nil {
		r.Error = err.Error()
	}
	c.mu.Lock()
	if c.results == nil {
		c.results = map[string]Result{}
	}
	prev, seen := c.results[target]
	c.results[target] = r
	c.mu.Unlock()
	log := c.Log
	if log == nil {
		return
	}
	switch {
	case !r.OK && (!seen || prev.OK):
		log.Error("self-check failed", zap.String("target", target), zap.String("error", r.Error))
	case r.OK && seen && !prev.OK:
		log.Info("self-check passes again", zap.String("target", target))
	}
}

// Run probes every target at once and then every Every until ctx ends.
func (c *Checker) Run(ctx context.Context) {
	every := c.Every
	if every <= 0 {
		every = DefaultEvery
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		c.round(ctx, every)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// round probes each target once, each within the period.
func (c *Checker) round(ctx context.Context, every time.Duration) {
	c.mu.Lock()
	targets := make(map[string]func(context.Context) error, len(c.probes))
	for k, v := range c.probes {
		targets[k] = v
	}
	c.mu.Unlock()
	for target, probe := range targets {
		pctx, cancel := context.WithTimeout(ctx, every)
		start := time.Now()
		err := probe(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		c.mu.Lock()
		_, still := c.probes[target]
		c.mu.Unlock()
		if still {
			c.Report(target, err, time.Since(start))
		}
	}
}

// Results returns the last result of every target, sorted by target.
func (c *Checker) Results() []Result {
	c.mu.Lock()
	out := make([]Result, 0, len(c.results))
	for _, r := range c.results {
		out = append(out, r)
	}
	c.mu.Unlock()
	slices.SortFunc(out, func(a, b Result) int { return strings.Compare(a.Target, b.Target) })
	return out
}

// Failing returns an error naming the targets whose last probe failed.
func (c *Checker) Failing() error {
	var bad []string
	for _, r := range c.Results() {
		if !r.OK {
			bad = append(bad, r.Target+": "+r.Error)
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("self-check failing: %s", strings.Join(bad, "; "))
	}
	return nil
}

// ProbeFile is the prefix of a probe file's name: loomfs's own reserved
// name, the one the projection's readiness probe gives its file.
const ProbeFile = policy.ProbePrefix

// ProbeDir writes a small file in dir (a directory of loomfs's own on the
// volume, never a scope's), syncs it, reads it back without following a
// link and deletes it. ctx bounds the wait, not the system calls: storage
// that does not answer leaves them blocked in a goroutine.
func ProbeDir(ctx context.Context, dir string) error {
	var b [8]byte
	rand.Read(b[:])
	path := filepath.Join(dir, ProbeFile+hex.EncodeToString(b[:]))
	want := []byte("loomfs probe " + hex.EncodeToString(b[:]) + "\n")
	done := make(chan error, 1)
	go func() { done <- probeFile(path, want) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("probe %s: no answer: %w", filepath.Base(path), ctx.Err())
	}
}

func probeFile(path string, want []byte) (err error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	defer func() {
		if rerr := os.Remove(path); err == nil && rerr != nil {
			err = fmt.Errorf("probe: %w", rerr)
		}
	}()
	_, err = f.Write(want)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	r, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	got, err := io.ReadAll(io.LimitReader(r, int64(len(want))+1))
	r.Close()
	if err != nil {
		return fmt.Errorf("probe: read back: %w", err)
	}
	if !bytes.Equal(got, want) {
		return fmt.Errorf("probe: read back %d bytes that differ from the %d written", len(got), len(want))
	}
	return nil
}
