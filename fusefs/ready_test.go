package fusefs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// TestReadySentinel: .workspace_ready appears only once a health probe
// passed, is read-only, can't be taken by anything else, and answers
// lookup and stat without being listed.
func TestReadySentinel(t *testing.T) {
	e := newEnv(t)
	ready := filepath.Join(e.mnt, policy.ReadyFile)
	if _, err := os.Stat(ready); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("sentinel before any probe: %v", err)
	}
	if err := os.WriteFile(ready, []byte("x"), 0o600); !errors.Is(err, syscall.EPERM) {
		t.Fatalf("creating the sentinel: %v, want EPERM", err)
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
	if listed {
		t.Fatal("sentinel listed at the top of the mount: git add -A, tar and cp -r would take it")
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

// TestUnmountSummarisesClosedFiles: the kernel sends RELEASE after
// close(2) returns, asynchronously, and drops what is still pending when
// the mount goes; a file closed just before the unmount still gets exactly
// one release record with the bytes written.
func TestUnmountSummarisesClosedFiles(t *testing.T) {
	e := newEnv(t)
	for i := range 20 {
		name := fmt.Sprintf("f%d.txt", i)
		if err := os.WriteFile(filepath.Join(e.mnt, name), []byte("12345"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.m.Unmount(); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		name := fmt.Sprintf("f%d.txt", i)
		if evs := e.sink.find("release", "ok", name); len(evs) != 1 || evs[0].Bytes != 5 {
			t.Errorf("%s: release records %+v, want one of 5 bytes", name, evs)
		}
	}
}

// TestUnmountSummarisesOpenFiles: a file still open when the mount is
// taken away (its session aborted, so the kernel never sends RELEASE)
// still gets its release record, marked as ended by the unmount.
func TestUnmountSummarisesOpenFiles(t *testing.T) {
	base := t.TempDir()
	os.Chmod(base, 0o700)
	ctx := context.Background()
	vol, err := store.OpenVolume(ctx, store.Config{Root: filepath.Join(base, "volume")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vol.Close() })
	ws, err := vol.Open(ctx, testScope, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	mnt := filepath.Join(base, "mnt")
	os.Mkdir(mnt, 0o755)
	sink := &recorder{}
	m, err := Mount(ctx, ws, mnt, Options{Audit: sink})
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(mnt, "open.txt"), os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		m.Unmount()
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("12345")); err != nil {
		t.Fatal(err)
	}
	if err := m.Unmount(); !errors.Is(err, ErrDetached) {
		t.Fatalf("unmount with a file open: %v, want ErrDetached", err)
	}
	f.Close()
	evs := sink.find("release", "ok", "open.txt")
	if len(evs) != 1 || evs[0].Bytes != 5 || evs[0].Detail["ended_by"] != "unmount" {
		t.Fatalf("release records: %+v", evs)
	}
}
