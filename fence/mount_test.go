package fence

import (
	"context"
	"encoding/binary"
	"net"
	"path/filepath"
	"strings"
	"testing"
)

// TestFromArgs: a ceph-fuse's settings as its command line gives them,
// in the forms ceph takes (--name=value, --name value, '-' for '_').
func TestFromArgs(t *testing.T) {
	mp := map[string]bool{"/mnt/loom": true}
	tests := []struct {
		name     string
		args     []string
		cwd      string
		found    bool
		node     string
		stale    bool
		staleSet bool
	}{
		{"equals forms", []string{"ceph-fuse", "--client_metadata=loomfs_node=n1,loomfs_boot=b", "--client_reconnect_stale=false", "/mnt/loom"}, "/", true, "n1", false, true},
		{"spaced forms and dashes", []string{"ceph-fuse", "--client-metadata", "loomfs_node=n2", "--client-reconnect-stale", "true", "-f", "/mnt/loom"}, "/", true, "n2", true, true},
		{"bare boolean", []string{"ceph-fuse", "--client_reconnect_stale", "/mnt/loom"}, "/", true, "", true, true},
		{"relative mount point", []string{"ceph-fuse", "-c", "/etc/ceph/ceph.conf", "loom"}, "/mnt", true, "", false, false},
		{"another mount", []string{"ceph-fuse", "--client_metadata=loomfs_node=n3", "/mnt/other"}, "/", false, "n3", false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, ok := fromArgs(1, tc.args, tc.cwd, mp)
			if ok != tc.found {
				t.Fatalf("found %v, want %v (%+v)", ok, tc.found, m)
			}
			if m.Metadata[NodeKey] != tc.node || m.ReconnectStale != tc.stale || m.staleSet != tc.staleSet {
				t.Errorf("got node %q stale %v (set %v), want %q %v (%v)", m.Metadata[NodeKey], m.ReconnectStale, m.staleSet, tc.node, tc.stale, tc.staleSet)
			}
		})
	}
}

// TestMissing: what keeps a fence of the node from finding or keeping
// out the mount, and what a command line can't tell.
func TestMissing(t *testing.T) {
	sock := func(meta map[string]string, stale, blocked bool) Mount {
		return Mount{From: "admin socket", Metadata: meta, ReconnectStale: stale, Blocklisted: blocked}
	}
	tests := []struct {
		name    string
		m       Mount
		missing []string // a word each sentence must hold, in order
		unknown int
	}{
		{"ready", sock(map[string]string{NodeKey: "n1"}, false, false), nil, 0},
		{"no metadata", sock(map[string]string{}, false, false), []string{"has no loomfs_node"}, 0},
		{"another node's", sock(map[string]string{NodeKey: "n2"}, false, false), []string{`names node "n2"`}, 0},
		{"reconnects", sock(map[string]string{NodeKey: "n1"}, true, false), []string{"client_reconnect_stale is on"}, 0},
		{"fenced", sock(map[string]string{NodeKey: "n1"}, false, true), []string{"blocklisted"}, 0},
		{"all at once", sock(nil, true, true), []string{"has no loomfs_node", "client_reconnect_stale", "blocklisted"}, 0},
		{"command line without either", Mount{From: fromCmdline, Metadata: map[string]string{}}, nil, 2},
		{"command line with both", Mount{From: fromCmdline, Metadata: map[string]string{NodeKey: "n1"}, staleSet: true}, nil, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.m.Missing("n1")
			if len(got) != len(tc.missing) {
				t.Fatalf("missing %q, want %d sentence(s)", got, len(tc.missing))
			}
			for i, w := range tc.missing {
				if !strings.Contains(got[i], w) {
					t.Errorf("missing[%d] = %q, want it to say %q", i, got[i], w)
				}
			}
			if u := tc.m.Unknown(); len(u) != tc.unknown {
				t.Errorf("unknown %q, want %d", u, tc.unknown)
			}
		})
	}
}

// TestAdminCommand speaks the admin socket's protocol with a stand-in for
// a daemon: the command and a NUL in, a big-endian length and the answer
// out.
func TestAdminCommand(t *testing.T) {
	path := filepath.Join(t.TempDir(), "client.asok")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	got := make(chan string, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		var cmd []byte
		b := make([]byte, 1)
		for {
			if _, err := c.Read(b); err != nil || b[0] == 0 {
				break
			}
			cmd = append(cmd, b[0])
		}
		got <- string(cmd)
		answer := []byte(`{"client_reconnect_stale": "false"}` + "\n")
		binary.Write(c, binary.BigEndian, uint32(len(answer)))
		c.Write(answer)
	}()
	out, err := adminCommand(context.Background(), path, `{"prefix":"config get","var":"client_reconnect_stale"}`)
	if err != nil {
		t.Fatal(err)
	}
	if cmd := <-got; cmd != `{"prefix":"config get","var":"client_reconnect_stale"}` {
		t.Errorf("the daemon read %q", cmd)
	}
	if string(out) != `{"client_reconnect_stale": "false"}` {
		t.Errorf("answer %q", out)
	}
	if _, err := adminCommand(context.Background(), filepath.Join(t.TempDir(), "none.asok"), `{"prefix":"status"}`); err == nil {
		t.Error("a socket nobody listens on answered")
	}
}
