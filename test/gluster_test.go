package test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentloom/loomfs/store"
)

// The peer probe's negative control: two clients of a GlusterFS volume
// (scripts/glusterfs), once with Gluster's default options, under which a
// client opens the old content for a while after another client's rename
// and compare-and-swap loses updates, and once with the coherent profile
// DEPLOY.md asks for. Each variable holds the two mount paths, A,B.
const (
	glusterDefaultEnv  = "LOOMFS_GLUSTER_DEFAULT_ROOTS"
	glusterCoherentEnv = "LOOMFS_GLUSTER_COHERENT_ROOTS"
)

// TestPeerProbeGlusterFS: check --probe --peer fails on GlusterFS with
// default client options, which a one-node probe passes, and passes with
// the coherent profile (SPEC §7.4).
func TestPeerProbeGlusterFS(t *testing.T) {
	cases := []struct {
		env    string
		wantOK bool
	}{
		{glusterDefaultEnv, false},
		{glusterCoherentEnv, true},
	}
	for _, tc := range cases {
		t.Run(tc.env, func(t *testing.T) {
			v := os.Getenv(tc.env)
			if v == "" {
				t.Skipf("%s not set: run scripts/glusterfs up and set it to $(scripts/glusterfs roots ...) (.ci/run does)", tc.env)
			}
			ra, rb, ok := strings.Cut(v, ",")
			if !ok || ra == "" || rb == "" {
				t.Fatalf("%s=%q: want two mount paths, A,B", tc.env, v)
			}
			name := "probe-" + strconv.FormatInt(time.Now().UnixNano(), 36)
			root := filepath.Join(ra, name)
			if err := os.Mkdir(root, 0o700); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(root) })
			if err := os.WriteFile(filepath.Join(root, store.VolumeMarker), []byte(nodeVolume+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			n := &node{t: t, root: root, volumeID: nodeVolume, dir: dir}

			// One node alone can't tell: the probe passes either way.
			r := n.run("--json", "check", "--probe")
			var rep store.CheckReport
			if err := json.Unmarshal(r.stdout, &rep); err != nil || r.code != 0 || !rep.OK {
				t.Fatalf("check --probe: exit %d, %s %s", r.code, r.stdout, r.stderr)
			}
			if rep.Filesystem != "fuse.glusterfs" {
				t.Errorf("filesystem %q, want fuse.glusterfs", rep.Filesystem)
			}

			r = n.run("--json", "check", "--probe", "--peer", filepath.Join(rb, name))
			rep = store.CheckReport{}
			if err := json.Unmarshal(r.stdout, &rep); err != nil {
				t.Fatalf("check --probe --peer: exit %d, %s %s", r.code, r.stdout, r.stderr)
			}
			var peer *store.CheckItem
			for i, c := range rep.Checks {
				if c.Name == "probe_peer" {
					peer = &rep.Checks[i]
				}
			}
			if peer == nil {
				t.Fatalf("check --probe --peer made no probe_peer check: %s", r.stdout)
			}
			t.Logf("probe_peer ok=%v: %s", peer.OK, peer.Detail)
			if peer.OK != tc.wantOK || rep.OK != tc.wantOK || (r.code == 0) != tc.wantOK {
				t.Fatalf("check --probe --peer: ok %v, probe_peer ok %v, exit %d; want ok %v", rep.OK, peer.OK, r.code, tc.wantOK)
			}
			for _, c := range rep.Checks {
				if c.Name != "probe_peer" && !c.OK {
					t.Errorf("check %s failed too: %s", c.Name, c.Detail)
				}
			}
		})
	}
}
