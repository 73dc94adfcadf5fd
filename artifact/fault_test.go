package artifact_test

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/agentloom/loomfs/artifact"
	"github.com/agentloom/loomfs/policy"
)

// Faults in the middle of an upload, on the real RGW: a gateway killed by
// its pid, credentials revoked. A gate between the store and the gateway
// lets the first uploads through and holds the rest until the fault is
// made, so the fault always lands mid-upload.

// rgwConf is the test cluster's ceph.conf (scripts/rgw env).
func rgwConf(t *testing.T) string {
	t.Helper()
	conf := os.Getenv("LOOMFS_RGW_CONF")
	if conf == "" {
		t.Fatal("LOOMFS_RGW_CONF is not set: export what scripts/rgw env prints")
	}
	return conf
}

// gate forwards requests to an S3 gateway; the upload of a blob after the
// first `after` waits until release.
type gate struct {
	proxy   *httputil.ReverseProxy
	after   int
	mu      sync.Mutex
	n       int
	reached chan struct{}
	release chan struct{}
	once    sync.Once // closes reached
	opened  sync.Once // closes release
}

func newGate(t *testing.T, target string, after int) (*gate, string) {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	g := &gate{proxy: httputil.NewSingleHostReverseProxy(u), after: after, reached: make(chan struct{}), release: make(chan struct{})}
	// A gateway that is gone is a cut connection, as without the gate,
	// not an answer of the gate's own.
	g.proxy.ErrorLog = log.New(io.Discard, "", 0)
	g.proxy.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) {
		if conn, _, herr := http.NewResponseController(w).Hijack(); herr == nil {
			conn.Close()
		}
	}
	srv := httptest.NewServer(g)
	t.Cleanup(func() {
		g.open()
		srv.Close()
	})
	return g, srv.URL
}

func (g *gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/blobs/") {
		g.mu.Lock()
		g.n++
		n := g.n
		g.mu.Unlock()
		if n > g.after {
			g.once.Do(func() { close(g.reached) })
			<-g.release
		}
	}
	g.proxy.ServeHTTP(w, r)
}

// open lets the held uploads go on.
func (g *gate) open() { g.opened.Do(func() { close(g.release) }) }

// spareGateway starts a radosgw of the test's own on the test cluster (the
// same users and buckets as the shared one) and returns its endpoint and a
// func that kills it with SIGKILL by its pid.
func spareGateway(t *testing.T) (string, func()) {
	t.Helper()
	conf := rgwConf(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	dir := t.TempDir()
	cmd := exec.Command("radosgw", "-c", conf, "-f", "-n", "client.rgw.fault"+randHex(4),
		"--ms-mon-client-mode=crc secure", "--ms-client-mode=crc secure",
		"--rgw-frontends=beast endpoint="+addr, "--rgw-dns-name=127.0.0.1", "--rgw-zonegroup-root-pool=.rgw.root",
		"--rgw-data="+dir, "--log-file="+filepath.Join(dir, "log"), "--admin-socket="+filepath.Join(dir, "asok"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start radosgw: %v", err)
	}
	pid := cmd.Process.Pid
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	kill := func() {
		syscall.Kill(pid, syscall.SIGKILL)
		<-done
	}
	t.Cleanup(kill)
	endpoint := "http://" + addr
	for start := time.Now(); ; time.Sleep(50 * time.Millisecond) {
		if resp, err := http.Get(endpoint + "/"); err == nil {
			resp.Body.Close()
			break
		}
		select {
		case <-done:
			t.Fatalf("radosgw exited: %s", out.String())
		default:
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("radosgw not answering on %s after 30 s: %s", endpoint, out.String())
		}
	}
	return endpoint, kill
}

// blobsIn counts the contents under the store's prefix.
func blobsIn(t *testing.T, raw *s3.Client, st *artifact.Store) int {
	t.Helper()
	bucket, prefix := st.Config().Bucket, st.Config().Prefix+"blobs/"
	out, err := raw.ListObjectsV2(context.Background(), &s3.ListObjectsV2Input{Bucket: &bucket, Prefix: &prefix})
	if err != nil {
		t.Fatal(err)
	}
	return len(out.Contents)
}

// waitBlobs waits until n contents are in the store.
func waitBlobs(t *testing.T, raw *s3.Client, st *artifact.Store, n int) {
	t.Helper()
	for start := time.Now(); blobsIn(t, raw, st) < n; time.Sleep(20 * time.Millisecond) {
		if time.Since(start) > 30*time.Second {
			t.Fatalf("%d contents uploaded after 30 s, want %d", blobsIn(t, raw, st), n)
		}
	}
}

// TestUploadInterrupted: a publish cut midway (its gateway killed, or its
// credentials revoked) fails, leaves the contents it sent and no manifest,
// shows no secret, and the next try sends only the rest and publishes.
func TestUploadInterrupted(t *testing.T) {
	const files, through = 24, 4
	cases := []struct {
		name string
		// setup returns the endpoint the cut publish goes to, a fault to
		// make once the first uploads are in, and what the error says.
		setup func(t *testing.T) (endpoint string, fault func(), want string)
	}{
		{"credentials revoked", func(t *testing.T) (string, func(), string) {
			conf := rgwConf(t)
			ak := "FAULT" + strings.ToUpper(randHex(7))
			sk := "Revoked" + randHex(16)
			admin := func(args ...string) {
				out, err := exec.Command("radosgw-admin", append([]string{"-c", conf}, args...)...).CombinedOutput()
				if err != nil {
					t.Fatalf("radosgw-admin %v: %v: %s", args, err, out)
				}
			}
			admin("key", "create", "--uid=loomfs", "--key-type=s3", "--access-key="+ak, "--secret-key="+sk)
			t.Cleanup(func() {
				exec.Command("radosgw-admin", "-c", conf, "key", "rm", "--uid=loomfs", "--key-type=s3", "--access-key="+ak).Run()
			})
			t.Setenv("AWS_ACCESS_KEY_ID", ak)
			t.Setenv("AWS_SECRET_ACCESS_KEY", sk)
			return os.Getenv("LOOMFS_S3_ENDPOINT"), func() {
				admin("key", "rm", "--uid=loomfs", "--key-type=s3", "--access-key="+ak)
			}, "InvalidAccessKeyId"
		}},
		{"gateway killed by pid", func(t *testing.T) (string, func(), string) {
			endpoint, kill := spareGateway(t)
			return endpoint, kill, "request send failed"
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st, raw := openStore(t)
			ctx := context.Background()
			content := map[string][]byte{}
			for i := range files {
				b := make([]byte, 64<<10)
				crand.Read(b)
				content[fmt.Sprintf("output/f%02d.bin", i)] = b
			}
			fr := finishRun(t, t.TempDir(), "r1", "alice", content)

			endpoint, fault, want := c.setup(t)
			g, via := newGate(t, endpoint, through)
			cfg := st.Config()
			cfg.Endpoint = via
			cut, err := artifact.Open(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			secret := os.Getenv("AWS_SECRET_ACCESS_KEY")
			result := make(chan error, 1)
			go func() {
				_, _, err := cut.Publish(ctx, fr.run, fr.snaps, artifact.PublishOptions{})
				result <- err
			}()
			select {
			case <-g.reached:
			case err := <-result:
				t.Fatalf("publish ended before the gate: %v", err)
			case <-time.After(30 * time.Second):
				t.Fatal("no upload reached the gate in 30 s")
			}
			waitBlobs(t, raw, st, through)
			fault()
			g.open()
			err = <-result
			if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), secret) {
				t.Fatalf("a publish cut by the fault: %v; want an error saying %q, without the secret", err, want)
			}
			sent := blobsIn(t, raw, st)
			if sent < through || sent >= files {
				t.Fatalf("%d contents in the store after the cut, want from %d to %d", sent, through, files-1)
			}
			if _, err := st.Manifest(ctx, "r1"); policy.CodeOf(err) != policy.NotFound {
				t.Fatalf("manifest after a cut upload: %v, want not_found", err)
			}
			if _, _, err := st.Get(ctx, "r1", "alice", "output/f00.bin"); policy.CodeOf(err) != policy.NotFound {
				t.Fatalf("a file of a run whose upload was cut: %v, want not_found", err)
			}

			// The next try (the shared gateway, good credentials) sends
			// only what is missing.
			m, again, err := st.Publish(ctx, fr.run, fr.snaps, artifact.PublishOptions{})
			if err != nil || !again.Manifest || again.Present != sent || again.Blobs != files-sent {
				t.Fatalf("retry: %+v, %v; want %d sent, %d present and the manifest", again, err, files-sent, sent)
			}
			if _, err := st.Verify(ctx, "r1", true); err != nil {
				t.Fatalf("verify after the retry: %v", err)
			}
			if len(m.Files) != files {
				t.Fatalf("published %d files, want %d", len(m.Files), files)
			}
			if _, b, err := st.Get(ctx, "r1", "alice", "output/f07.bin"); err != nil || !bytes.Equal(b, content["output/f07.bin"]) {
				t.Fatalf("a file after the retry: %d bytes, %v", len(b), err)
			}
		})
	}
}
