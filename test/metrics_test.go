package test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentloom/loomfs/tools"
)

// freeAddr is a loopback address no one listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// prometheus is a real Prometheus server (Debian's prometheus package)
// scraping the given jobs every second, on loopback, with its data in the
// test's own directory; it is stopped by its pid at the end of the test.
type prometheus struct {
	t    *testing.T
	addr string
}

func startPrometheus(t *testing.T, jobs map[string]string) *prometheus {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatal("prometheus not found: install Debian's prometheus package (scripts/setup does)")
	}
	dir := t.TempDir()
	var cfg strings.Builder
	cfg.WriteString("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n")
	for job, target := range jobs {
		fmt.Fprintf(&cfg, "  - job_name: %s\n    static_configs:\n      - targets: ['%s']\n", job, target)
	}
	conf := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(conf, []byte(cfg.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	p := &prometheus{t: t, addr: freeAddr(t)}
	out := &syncBuffer{}
	cmd := exec.Command(bin, "--config.file="+conf, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+p.addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("prometheus:\n%s", out.String())
		}
	})
	waitFor(t, "prometheus to be ready", func() bool {
		resp, err := http.Get("http://" + p.addr + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return p
}

// query answers an instant PromQL query: the value of its one series,
// false when it has none.
func (p *prometheus) query(q string) (float64, bool) {
	p.t.Helper()
	resp, err := http.Get("http://" + p.addr + "/api/v1/query?query=" + url.QueryEscape(q))
	if err != nil {
		p.t.Fatal(err)
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		p.t.Fatal(err)
	}
	if r.Status != "success" {
		p.t.Fatalf("query %s: %s", q, r.Error)
	}
	switch len(r.Data.Result) {
	case 0:
		return 0, false
	case 1:
	default:
		p.t.Fatalf("query %s: %d series, want one", q, len(r.Data.Result))
	}
	s, _ := r.Data.Result[0].Value[1].(string)
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		p.t.Fatalf("query %s: value %q", q, s)
	}
	return v, true
}

// await waits until q's value is want (scrapes are a second apart) and
// fails naming the last value otherwise.
func (p *prometheus) await(q string, want float64) {
	p.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		v, ok := p.query(q)
		if ok && v == want {
			return
		}
		if time.Now().After(deadline) {
			p.t.Errorf("%s = %v (present %v), want %v", q, v, ok, want)
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// promtoolCheck lints what addr serves at /metrics with promtool.
func promtoolCheck(t *testing.T, addr string) []byte {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	cmd := exec.Command("promtool", "check", "metrics")
	cmd.Stdin = bytes.NewReader(body)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics on %s: %v\n%s", addr, err, out)
	}
	return body
}

// TestPrometheusScrapesMountAndServe: a real Prometheus scrapes a loomfs
// mount and a loomfs serve while a workload runs in each, and what it
// stored is what the workload did: the mount's FUSE create and unlink
// requests one for one (and their rate), its refused hard links, the
// session sandbox's creates and refused link through serve's projection,
// and every self-check passing. promtool accepts both expositions.
func TestPrometheusScrapesMountAndServe(t *testing.T) {
	const files, links = 120, 3

	// The mount: its self-check loop off, so its only probe is the one
	// before it is served (one create, one unlink of its own).
	c := newCLI(t)
	mnt := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	mountAddr := freeAddr(t)
	mcmd, mout := c.start("mount", "--scope", "acme/coder/m1", "--self-check", "0", "--metrics", mountAddr, "--volume-check", "1s", mnt)
	waitFor(t, "loomfs mount", func() bool { return strings.Contains(mout.String(), "mounted ") })
	t.Cleanup(func() { mcmd.Process.Signal(syscall.SIGTERM); mcmd.Wait() })

	// serve self-checks the volume at once and then hourly: the session
	// sandbox's projection, self-checked from the next round on, is
	// then probed only once, before its container starts.
	serveAddr := freeAddr(t)
	s := newServeEnvArgs(t, "--metrics", serveAddr, "--volume-check", "1h")
	prom := startPrometheus(t, map[string]string{"mount": mountAddr, "serve": serveAddr})

	// Both scraped before the workload starts, which then runs over a few
	// scrapes, so the rate is seen.
	prom.await(`up{job="mount"}`, 1)
	prom.await(`up{job="serve"}`, 1)

	// The mount's workload: create, write, stat and unlink, and hard
	// links the policy refuses.
	for i := range files {
		time.Sleep(25 * time.Millisecond)
		p := filepath.Join(mnt, fmt.Sprintf("f%d", i))
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(p); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(mnt, "kept"), []byte("x"), 0o600)
	for i := range links {
		if err := os.Link(filepath.Join(mnt, "kept"), filepath.Join(mnt, fmt.Sprintf("l%d", i))); err == nil {
			t.Fatal("a hard link was made through the mount")
		}
	}
	// The session sandbox's workload, through serve's projection.
	var out tools.ProcessOutput
	script := "for i in $(seq 1 40); do echo x > s$i; done; ln s1 hard 2>/dev/null; echo done"
	if r := s.tool(tools.ProcessStart, "acme/coder/p1", map[string]any{"command": script, "yield_ms": 20000}, &out); r.code != 0 || out.Status != tools.StatusExited {
		t.Fatalf("process: %d %s %s", r.code, r.stdout, r.stderr)
	}

	// files + 1 (the kept file) + 1 (the mount's own probe).
	prom.await(`loomfs_fuse_requests_total{job="mount",op="CREATE",errno="0"}`, files+2)
	prom.await(`loomfs_fuse_requests_total{job="mount",op="UNLINK",errno="0"}`, files+1)
	prom.await(`loomfs_refusals_total{job="mount",door="fuse",code="link_unsupported"}`, links)
	// A rate needs two samples of the series in its window.
	rate := `rate(loomfs_fuse_requests_total{job="mount",op="CREATE",errno="0"}[1m])`
	waitFor(t, rate+" above 0", func() bool { v, ok := prom.query(rate); return ok && v > 0 })
	prom.await(`loomfs_self_check_ok{job="mount",target="volume"}`, 1)
	prom.await(`loomfs_self_check_ok{job="mount",target="acme/coder/m1"}`, 1)
	prom.await(`loomfs_scopes_active{job="mount"}`, 1)

	// 40 files from the script, and the projection's probe before the
	// sandbox started.
	prom.await(`loomfs_fuse_requests_total{job="serve",op="CREATE",errno="0"}`, 41)
	prom.await(`loomfs_refusals_total{job="serve",door="fuse",code="link_unsupported"}`, 1)
	prom.await(`loomfs_session_sandboxes{job="serve"}`, 1)
	prom.await(`loomfs_sandbox_start_duration_seconds_count{job="serve"}`, 1)
	prom.await(`loomfs_self_check_ok{job="serve",target="volume"}`, 1)

	// The mount follows its journals every poll (500 ms by default).
	if v, ok := prom.query(`loomfs_journal_follow_lag_seconds{job="mount"}`); !ok || v > 5 {
		t.Errorf("journal follow lag %v (present %v), want under 5 s", v, ok)
	}
	body := promtoolCheck(t, mountAddr)
	if !bytes.Contains(body, []byte(`loomfs_scope_quota_used_bytes{scope="acme/coder/m1"} 1`)) {
		t.Errorf("the mount's quota use (the kept byte) is not exposed:\n%s", grepLines(body, "loomfs_scope_quota"))
	}
	// The session sandbox's scope, opened by serve for its process: its
	// account is read for the scrape.
	if body := promtoolCheck(t, serveAddr); !bytes.Contains(body, []byte(`loomfs_scope_quota_used_bytes{scope="acme/coder/p1"}`)) {
		t.Errorf("serve's scope's quota use is not exposed:\n%s", grepLines(body, "loomfs_scope_"))
	}
	for _, addr := range []string{mountAddr, serveAddr} {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s/readyz: %d %s", addr, resp.StatusCode, b)
		}
	}
}

func grepLines(b []byte, prefix string) string {
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// newServeEnvArgs is newServeEnv with more arguments to loomfs serve.
func newServeEnvArgs(t *testing.T, args ...string) *serveEnv {
	dir := t.TempDir()
	s := &serveEnv{cli: newCLI(t), socket: filepath.Join(dir, "sock", "serve.sock"), mountDir: filepath.Join(dir, "mnt")}
	t.Cleanup(func() { detachUnder(s.mountDir) })
	s.serveAs("node-a", args...)
	return s
}

// TestServeSelfChecksSessionProjection: loomfs serve self-checks the
// projection of each session sandbox it runs, under the scope's name,
// and stops once the sandbox is gone.
func TestServeSelfChecksSessionProjection(t *testing.T) {
	addr := freeAddr(t)
	s := newServeEnvArgs(t, "--metrics", addr, "--volume-check", "200ms")
	const scope = "acme/coder/p2"
	var out tools.ProcessOutput
	if r := s.tool(tools.ProcessStart, scope, map[string]any{"command": "sleep 60", "yield_ms": 0}, &out); r.code != 0 {
		t.Fatalf("process: %d %s %s\nSERVE: %s", r.code, r.stdout, r.stderr, s.out.String())
	}
	scrape := func() string {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	line := `loomfs_self_check_ok{target="` + scope + `"} 1`
	waitFor(t, line, func() bool { return strings.Contains(scrape(), line) })
	if r := s.loomfs("", "processes", "stop", "--scope", scope); r.code != 0 {
		t.Fatalf("processes stop: %d %s %s", r.code, r.stdout, r.stderr)
	}
	waitFor(t, "the stopped sandbox's self-check to go", func() bool {
		return !strings.Contains(scrape(), `target="`+scope+`"`)
	})
}
