package store_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentloom/loomfs/fence"
	"github.com/agentloom/loomfs/nodeid"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// TestFencedNodeRefused: a shared volume that records this node as fenced
// is refused at every opening, with the fenced message for a model and
// the fence and the way back for the operator; the check fails saying
// so; another node's fence, or this one's on a local root, changes
// nothing; re-admission (IgnoreFence) opens it; and once the record is
// lifted the node serves again.
func TestFencedNodeRefused(t *testing.T) {
	root := filepath.Join(t.TempDir(), "root")
	goodShared(t, root)
	t.Setenv(nodeid.Env, "node-f")
	cfg := store.Config{Backend: store.BackendSharedPOSIX, Root: root, VolumeID: volID}
	ctx := context.Background()
	open := func() error {
		v, err := store.OpenVolume(ctx, cfg)
		if err == nil {
			v.Close()
		}
		return err
	}
	if err := fence.Write(root, fence.Record{Node: "node-other", By: "node-f", Time: time.Now(), Method: fence.MethodExternal}); err != nil {
		t.Fatal(err)
	}
	if err := open(); err != nil {
		t.Fatalf("another node's fence refused this one: %v", err)
	}
	if err := store.FencedNow(ctx, cfg); err != nil {
		t.Errorf("FencedNow before this node's fence: %v", err)
	}

	if err := fence.Write(root, fence.Record{Node: "node-f", By: "node-g", Time: time.Now(), Method: fence.MethodExternal}); err != nil {
		t.Fatal(err)
	}
	err := open()
	if pe := policy.Public(err); !policy.IsFenced(err) || pe.Code != policy.VolumeUnavailable || pe.Message != policy.FencedMessage {
		t.Errorf("opening a fenced node's volume: %v (public %q %q)", err, pe.Code, pe.Message)
	}
	if err == nil || !strings.Contains(err.Error(), "loomfs fence --readmit --node node-f") || strings.Contains(public(err), root) {
		t.Errorf("the operator's refusal %q: want the way back, and no host path for a model", err)
	}
	if err := store.FencedNow(ctx, cfg); !policy.IsFenced(err) {
		t.Errorf("FencedNow after this node's fence: %v", err)
	}
	r := store.Check(ctx, store.CheckOptions{Backend: store.BackendSharedPOSIX, Root: root, VolumeID: volID})
	if r.OK || !failedItem(r, "fenced") {
		t.Errorf("check on a fenced node: ok %v, %+v; want it failed, naming the fence", r.OK, r.Checks)
	}
	readmit := cfg
	readmit.IgnoreFence = true
	if v, err := store.OpenVolume(ctx, readmit); err != nil {
		t.Errorf("re-admission's opening: %v", err)
	} else {
		v.Close()
	}
	local := store.Config{Backend: store.BackendLocal, Root: root}
	if v, err := store.OpenVolume(ctx, local); err != nil {
		t.Errorf("a local root with a fence record: %v", err)
	} else {
		v.Close()
	}

	if err := fence.Remove(root, "node-f"); err != nil {
		t.Fatal(err)
	}
	if err := open(); err != nil {
		t.Errorf("after re-admission: %v", err)
	}
	// A record that can't be read refuses too: it may be this node's fence.
	if err := os.WriteFile(filepath.Join(root, fence.Dir, "node-f.json"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := open(); policy.CodeOf(err) != policy.VolumeUnavailable || errors.Is(err, os.ErrNotExist) {
		t.Errorf("an unreadable fence record of this node: %v", err)
	}
}

// public is what a model reads of err.
func public(err error) string { return policy.Public(err).Message }

func failedItem(r *store.CheckReport, name string) bool {
	for _, c := range r.Checks {
		if c.Name == name && !c.OK {
			return true
		}
	}
	return false
}
