package fusefs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/agentloom/loomfs/policy"
)

// TestReadySentinel: .workspace_ready appears only once a health probe
// passed, is read-only, and can't be taken by anything else.
func TestReadySentinel(t *testing.T) {
	e := newEnv(t)
	ready := filepath.Join(e.mnt, policy.ReadyFile)
	if _, err := os.Stat(ready); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("sentinel before any probe: %v", err)
	}
	if err := os.WriteFile(ready, []byte("x"), 0o600); !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.EPERM) && !errors.Is(err, syscall.EACCES) {
		t.Fatalf("creating the sentinel: %v", err)
	}
	if err := e.m.Probe(context.Background()); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(ready)
	if err != nil || !strings.HasPrefix(string(b), "ready ") {
		t.Fatalf("sentinel after the probe: %q %v", b, err)
	}
	ents, err := os.ReadDir(e.mnt)
	if err != nil {
		t.Fatal(err)
	}
	listed := false
	for _, d := range ents {
		listed = listed || d.Name() == policy.ReadyFile
	}
	if !listed {
		t.Fatal("sentinel not listed at the top of the mount")
	}
	if err := os.WriteFile(ready, []byte("x"), 0o600); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("writing the sentinel: %v, want EROFS", err)
	}
	if _, err := os.Stat(filepath.Join(e.backing, policy.ReadyFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("the sentinel reached the backing store")
	}
	// A failing probe hides it again.
	e.m.fsys.setReady(false)
	if _, err := os.Stat(ready); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("sentinel after a failed probe: %v", err)
	}
}
