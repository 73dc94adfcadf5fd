package test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TestNodesShareIOLimit: a scope's io_bytes_per_s holds for the scope, not
// for each process: two `loomfs mount` processes of one scope on two nodes,
// each written at once as fast as it takes, admit together no more than
// the scope's rate. Each alone would be held only to the whole rate, and
// both would finish in about half the time. Only a lower bound is
// asserted; bench/warm.sh (SECTIONS=limit) measures how close it holds.
func TestNodesShareIOLimit(t *testing.T) {
	_, a, b := sharedVolume(t)
	const (
		scope = "acme/coder/s1"
		rate  = 4 << 20
		each  = 6 << 20
	)
	pol := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(pol, []byte("limits:\n  io_bytes_per_s: 4 MiB\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ma, _ := a.mountWith(pol, scope)
	mb, _ := b.mountWith(pol, scope)

	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, mnt := range []string{ma, mb} {
		wg.Go(func() { errs[i] = writeSynced(filepath.Join(mnt, fmt.Sprintf("w%d", i)), each) })
	}
	wg.Wait()
	d := time.Since(start)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("writer %d: %v", i, err)
		}
	}
	// Each holder's first 100 ms of rate come at once, and until its first
	// recount (a quarter second) a holder may take the whole rate.
	slack := 2 * (rate/10 + rate/4)
	want := time.Duration(float64(2*each-slack) / rate * float64(time.Second))
	t.Logf("two mounts of one scope wrote %d MiB at a scope rate of %d MiB/s in %v (%.1f MiB/s together)",
		2*each>>20, rate>>20, d.Round(time.Millisecond), float64(2*each)/(1<<20)/d.Seconds())
	if d < want {
		t.Fatalf("two mounts of one scope wrote %d bytes in %v: faster than the scope's %d bytes/s allows (at least %v)", 2*each, d, rate, want)
	}
}

// writeSynced writes n bytes to path in 256 KiB writes and syncs it.
func writeSynced(path string, n int) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	chunk := bytes.Repeat([]byte("w"), 256<<10)
	for w := 0; w < n; w += len(chunk) {
		if _, err := f.Write(chunk); err != nil {
			return err
		}
	}
	return f.Sync()
}
