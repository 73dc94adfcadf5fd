package fence

// These test what fence reads of ceph's answers and how it keeps its
// record; the fence itself is tested on a real CephFS in the test
// package (TestNodeFenceTakeover).

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A client list as an MDS of Ceph 16.2 answers it, cut to what matters.
const clientLs = `[{"id":4146,"inst":"client.4146 127.0.0.1:0/117416006","reconnecting":false,
"client_metadata":{"client_features":{"feature_bits":"0x7ffff"},"hostname":"vm","loomfs_boot":"5f1c","loomfs_node":"node-a","pid":"14090","root":"/"}},
{"id":4144,"inst":"client.4144 127.0.0.1:0/2433773291","reconnecting":true,
"client_metadata":{"hostname":"vm","root":"/"}}]`

func TestParseClients(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    []Instance
		wantErr bool
	}{
		{"two", clientLs, []Instance{
			{ID: 4146, Addr: "127.0.0.1:0/117416006", Node: "node-a", Boot: "5f1c", Hostname: "vm"},
			{ID: 4144, Addr: "127.0.0.1:0/2433773291", Hostname: "vm", Reconnecting: true},
		}, false},
		{"none", `[]`, []Instance{}, false},
		{"instance of another client", `[{"id":1,"inst":"client.2 127.0.0.1:0/5"}]`, nil, true},
		{"no nonce", `[{"id":1,"inst":"client.1 127.0.0.1:0"}]`, nil, true},
		{"not json", `Error ENOENT: problem getting command descriptions`, nil, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseClients([]byte(tc.in))
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %d instances %+v, want %+v", len(got), got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("instance %d = %+v, want %+v", i, got[i], tc.want[i])
				}
			}
		})
	}
}

func TestParseOSDMap(t *testing.T) {
	out := `{"epoch":27,"fsid":"f","blocklist":{"127.0.0.1:0/4076426759":"2031-12-05T07:30:39.508981+0000"},"range_blocklist":{}}`
	epoch, list, err := parseOSDMap([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	want := time.Date(2031, 12, 5, 7, 30, 39, 508981000, time.UTC)
	if until := list["127.0.0.1:0/4076426759"]; epoch != 27 || len(list) != 1 || !until.Equal(want) {
		t.Errorf("parseOSDMap = %d %v, want 27 and the entry until %s", epoch, list, want)
	}
	if _, _, err := parseOSDMap([]byte(`{"epoch":3,"blocklist":{"a":"soon"}}`)); err == nil {
		t.Error("an expiry that is not a time was read")
	}
}

func TestParseBlocklist(t *testing.T) {
	// The entries, then the range entries (an empty array) right after.
	out := "\n" + `[{"addr":"127.0.0.1:0/4076426759","until":"2031-12-05T07:30:39.508981+0000"}][]`
	got, err := parseBlocklist([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	want := time.Date(2031, 12, 5, 7, 30, 39, 508981000, time.UTC)
	if len(got) != 1 || !got["127.0.0.1:0/4076426759"].Equal(want) {
		t.Errorf("got %v, want the one entry until %v", got, want)
	}
	if _, err := parseBlocklist([]byte(`[{"addr":"x","until":"soon"}]`)); err == nil {
		t.Error("an unreadable expiry was accepted")
	}
}

func TestCheckNode(t *testing.T) {
	for _, n := range []string{"node-a", "worker7.example.com", "N_1", "a.", "7", strings.Repeat("a", 253)} {
		if err := CheckNode(n); err != nil {
			t.Errorf("CheckNode(%q) = %v", n, err)
		}
	}
	for _, n := range []string{"", ".", "..", "../x", "a/b", "-a", "_a", "a,loomfs_boot=x", "a=b", "a b", "nœud", "a\x00", strings.Repeat("a", 254)} {
		if err := CheckNode(n); err == nil {
			t.Errorf("CheckNode(%q) accepted it", n)
		}
	}
}

func TestRecordRoundTrip(t *testing.T) {
	root := t.TempDir()
	if _, err := Read(root, "node-a"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Read before any fence = %v, want not exist", err)
	}
	r := Record{Node: "node-a", Reason: "partitioned", By: "node-b", Time: time.Now().UTC().Round(0), Method: MethodCeph,
		Instances: []Instance{{ID: 7, Addr: "10.0.0.1:0/9", Node: "node-a", Boot: "b"}}, OSDEpoch: 22, Barrier: 22, Took: time.Second}
	if err := Write(root, r); err != nil {
		t.Fatal(err)
	}
	got, err := Read(root, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	if got.Node != r.Node || !got.Time.Equal(r.Time) || len(got.Instances) != 1 || got.Instances[0] != r.Instances[0] || got.Barrier != 22 {
		t.Errorf("read back %+v, want %+v", got, r)
	}
	ents, err := os.ReadDir(filepath.Join(root, Dir))
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 1 || ents[0].Name() != "node-a.json" {
		t.Errorf("the fence directory holds %v, want node-a.json alone", ents)
	}
	if err := Write(root, Record{Node: "../escape"}); err == nil {
		t.Error("a record named outside the fence directory was written")
	}
	// Re-admission lifts the record; there is then nothing to lift.
	if err := Remove(root, "node-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(root, "node-a"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Read after Remove = %v, want not exist", err)
	}
	if err := Remove(root, "node-a"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a second Remove = %v, want not exist", err)
	}
	if err := Remove(root, "../escape"); err == nil || errors.Is(err, os.ErrNotExist) {
		t.Errorf("Remove of a name outside the fence directory = %v, want it refused", err)
	}
}
