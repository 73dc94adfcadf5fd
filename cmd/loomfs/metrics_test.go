package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// TestMetricsAddressRule: --metrics follows the rule of mcp --http: a
// non-loopback address without a token is a usage error, naming the flag
// that fixes it; a token file without --metrics is one too.
func TestMetricsAddressRule(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"beyond loopback without a token", []string{"--metrics", "0.0.0.0:0"}, "--metrics-token-file"},
		{"a token file without --metrics", []string{"--metrics-token-file", "/nonexistent"}, "--metrics-token-file is for --metrics"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root, mnt := mountDirs(t)
			args := append([]string{"--backend", "local", "--root", root, "mount", "--scope", mountScope}, c.args...)
			_, stderr, code := runLoomfs(t, append(args, mnt)...)
			if code != exitUsage || !strings.Contains(stderr, c.want) {
				t.Errorf("exit %d, stderr %q; want %d naming %q", code, stderr, exitUsage, c.want)
			}
			if isMounted(t, mnt) {
				t.Errorf("%s mounted", mnt)
			}
		})
	}
}

// TestMetricsBearerBeyondLoopback: served on every interface with a token
// file, /metrics and /readyz answer 401 without the token and 200 with it.
func TestMetricsBearerBeyondLoopback(t *testing.T) {
	const token = "0123456789abcdef0123456789abcdef"
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	root, mnt := mountDirs(t)
	p := startMount(t, root, mountScope, mnt, "--metrics", "0.0.0.0:"+strconv.Itoa(port), "--metrics-token-file", tokenFile)
	t.Cleanup(func() { p.cmd.Process.Signal(syscall.SIGTERM); p.wait(t) })
	for _, path := range []string{"/metrics", "/readyz", "/healthz"} {
		url := "http://127.0.0.1:" + strconv.Itoa(port) + path
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s without the token: %d, want 401", path, resp.StatusCode)
		}
		req, _ := http.NewRequest("GET", url, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err = http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s with the token: %d, want 200", path, resp.StatusCode)
		}
	}
}

// TestMCPMetrics: loomfs mcp --metrics counts the tool calls its session
// answers, refusals by code, and the scope's per-scope series.
func TestMCPMetrics(t *testing.T) {
	bin := buildLoomfs(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	srv := startMCPHTTP(t, bin, "--http", "127.0.0.1:0", "--metrics", addr)
	cs, err := mcpClient.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: srv.url, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	for range 3 {
		mcpCall(t, cs, "workspace_write", map[string]any{"path": "a.txt", "content": "x\n"})
	}
	mcpRefused(t, mcpCall(t, cs, "workspace_read", map[string]any{"path": "../etc/passwd"}), policy.InvalidPath)

	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`loomfs_tool_calls_total{code="",result="ok",tool="workspace_write"} 3`,
		`loomfs_tool_calls_total{code="invalid_path",result="refused",tool="workspace_read"} 1`,
		`loomfs_refusals_total{code="invalid_path",door="tool"} 1`,
		`loomfs_scope_operations_total{door="tool",scope="acme/coder/s1"} 4`,
		// The scope's account, read for the scrape (a.txt's 2 bytes).
		`loomfs_scope_quota_used_bytes{scope="acme/coder/s1"} 2`,
		`loomfs_self_check_ok{target="volume"} 1`,
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("exposition lacks %s", want)
		}
	}
}

// TestCheckListsSelfChecks: loomfs check --json lists the last self-check
// each mount of the volume recorded, passed ones included.
func TestCheckListsSelfChecks(t *testing.T) {
	root, mnt := mountDirs(t)
	p := startMount(t, root, mountScope, mnt)
	t.Cleanup(func() { p.cmd.Process.Signal(syscall.SIGTERM); p.wait(t) })
	stdout, stderr, code := runLoomfs(t, "--json", "--backend", "local", "--root", root, "check")
	if code != 0 {
		t.Fatalf("check: exit %d %s", code, stderr)
	}
	var out struct {
		SelfChecks []store.SelfCheck `json:"self_checks"`
	}
	if err := json.Unmarshal([]byte(stdout), &out); err != nil {
		t.Fatal(err)
	}
	if len(out.SelfChecks) != 1 || out.SelfChecks[0].Scope != mountScope || !out.SelfChecks[0].OK || out.SelfChecks[0].PID != p.cmd.Process.Pid {
		t.Errorf("self_checks %+v, want the mount's passing one", out.SelfChecks)
	}
}
