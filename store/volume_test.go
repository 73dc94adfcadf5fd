package store_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

const volID = "vol-7f3a"

// TestSharedVolumeUnavailable: a shared_posix root is the administrator's;
// loomfs checks it and its marker, stops with volume_unavailable, never
// creates anything and never falls back to a local directory (SPEC §2.2).
func TestSharedVolumeUnavailable(t *testing.T) {
	const (
		noRoot     = "<no root>"
		rootIsFile = "<root is a file>"
		noMarker   = "<no marker>"
		markerDir  = "<marker is a directory>"
	)
	tests := []struct {
		name     string
		marker   string // the marker's content, or one of the cases above
		volumeID string
	}{
		{name: "root missing", marker: noRoot, volumeID: volID},
		{name: "root is a file", marker: rootIsFile, volumeID: volID},
		{name: "marker missing", marker: noMarker, volumeID: volID},
		{name: "marker empty", marker: "", volumeID: volID},
		{name: "marker only a newline", marker: "\n", volumeID: volID},
		{name: "marker different", marker: "vol-other", volumeID: volID},
		{name: "marker differs in case", marker: strings.ToUpper(volID), volumeID: volID},
		{name: "marker with a prefix of the id", marker: volID[:4], volumeID: volID},
		{name: "marker with surrounding spaces", marker: " " + volID + " ", volumeID: volID},
		{name: "marker is a directory", marker: markerDir, volumeID: volID},
		{name: "marker far longer than any id", marker: volID + strings.Repeat("\n", 5000) + "x", volumeID: volID},
		{name: "no volume id configured", marker: volID, volumeID: ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			parent := t.TempDir()
			root := filepath.Join(parent, "root")
			switch tc.marker {
			case noRoot:
			case rootIsFile:
				mkfile(t, root, volID)
			case noMarker:
				mkdir(t, root)
			case markerDir:
				mkdir(t, filepath.Join(root, store.VolumeMarker))
			default:
				mkfile(t, filepath.Join(root, store.VolumeMarker), tc.marker)
			}
			before := treeOf(t, parent)

			err := store.CheckMarker(root, tc.volumeID)
			codeIs(t, "CheckMarker", err, policy.VolumeUnavailable)
			if err != nil && !strings.Contains(err.Error(), "never falls back") {
				t.Errorf("message %q does not say there is no fallback", err)
			}
			cfg := store.Config{Backend: store.BackendSharedPOSIX, Root: root, VolumeID: tc.volumeID, DataDir: filepath.Join(parent, "data")}
			vol, err := store.OpenVolume(context.Background(), cfg)
			if err == nil {
				vol.Close()
			}
			codeIs(t, "OpenVolume", err, policy.VolumeUnavailable)
			if got := treeOf(t, parent); got != before {
				t.Errorf("something was created:\nbefore\n%s\nafter\n%s", before, got)
			}
		})
	}
}

func TestSharedVolumeAvailable(t *testing.T) {
	for _, content := range []string{volID, volID + "\n", volID + "\r\n"} {
		root := t.TempDir()
		mkfile(t, filepath.Join(root, store.VolumeMarker), content)
		if err := store.CheckMarker(root, volID); err != nil {
			t.Errorf("CheckMarker with marker %q: %v", content, err)
		}
	}

	root := filepath.Join(t.TempDir(), "shared")
	mkfile(t, filepath.Join(root, store.VolumeMarker), volID+"\n")
	ctx := context.Background()
	vol, err := store.OpenVolume(ctx, store.Config{Backend: store.BackendSharedPOSIX, Root: root, VolumeID: volID})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vol.Close() })
	ws, err := vol.Open(ctx, mainScope, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	if _, err := ws.WriteFile(ctx, "a.txt", []byte("x"), nil); err != nil {
		t.Fatal(err)
	}

	// The marker changes under a running volume (remounted, swapped): the
	// next change and the next scope opening stop.
	marker := filepath.Join(root, store.VolumeMarker)
	// Rewritten in place with another id of the same length at once
	// (the same size, the same second), it is read again and refused;
	// written back, or replaced by another file holding the id, the
	// volume serves again.
	for _, step := range []struct {
		content string
		replace bool
		want    policy.Code
	}{
		{volID, false, ""}, // without the newline: the size the next one has
		{strings.Repeat("z", len(volID)), false, policy.VolumeUnavailable},
		{volID, false, ""},
		{volID, true, ""},
		{strings.Repeat("y", len(volID)), true, policy.VolumeUnavailable},
		{volID, false, ""},
	} {
		path := marker
		if step.replace {
			path = marker + ".new"
		}
		if err := os.WriteFile(path, []byte(step.content), 0o600); err != nil {
			t.Fatal(err)
		}
		if step.replace {
			if err := os.Rename(path, marker); err != nil {
				t.Fatal(err)
			}
		}
		_, err := ws.WriteFile(ctx, "b.txt", []byte("x"), nil)
		what := fmt.Sprintf("WriteFile after the marker changed to %q (replaced: %v)", step.content, step.replace)
		if step.want == "" {
			if err != nil {
				t.Errorf("%s: %v", what, err)
			}
			continue
		}
		codeIs(t, what, err, step.want)
	}
	for _, content := range []string{"vol-other", ""} {
		if err := os.WriteFile(marker, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := ws.WriteFile(ctx, "b.txt", []byte("x"), nil)
		codeIs(t, "WriteFile after the marker changed to "+content, err, policy.VolumeUnavailable)
		_, err = vol.Open(ctx, childScope, nil)
		codeIs(t, "Open after the marker changed", err, policy.VolumeUnavailable)
	}
	if err := os.Remove(marker); err != nil {
		t.Fatal(err)
	}
	codeIs(t, "Remove after the marker vanished", ws.Remove(ctx, "a.txt", nil), policy.VolumeUnavailable)
	if _, err := os.Stat(filepath.Join(root, childScope.Dir())); !os.IsNotExist(err) {
		t.Errorf("a refused Open created the child scope: %v", err)
	}
}

func TestLocalVolume(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	cfg := store.Config{DataDir: data}
	if got := cfg.RootPath(); got != filepath.Join(data, "workspaces") {
		t.Errorf("RootPath = %q; SPEC §2.2 says $AGENT_LOOM_DATA/workspaces", got)
	}
	if got := (store.Config{}).RootPath(); got != filepath.Join("data", "workspaces") {
		t.Errorf("default RootPath = %q; want ./data/workspaces", got)
	}
	vol, err := store.OpenVolume(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer vol.Close()
	if fi, err := os.Stat(filepath.Join(data, "workspaces")); err != nil || !fi.IsDir() {
		t.Fatalf("the local backend did not create its root: %v", err)
	}
	if _, err := os.Stat(filepath.Join(data, "workspaces", store.VolumeMarker)); !os.IsNotExist(err) {
		t.Errorf("the local backend wrote a shared volume marker (it never claims to be shared): %v", err)
	}
	_, err = store.OpenVolume(context.Background(), store.Config{Backend: "nfs", Root: t.TempDir()})
	codeIs(t, "OpenVolume with an unknown backend", err, policy.InvalidInput)
}
