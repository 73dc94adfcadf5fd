package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/tools"
)

// buildLoomfs builds this command into a temporary directory, so the MCP
// tests talk to the real binary as a client would.
func buildLoomfs(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "loomfs")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// cleanEnv is the environment without AGENT_LOOM_* settings of the caller.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AGENT_LOOM_") {
			env = append(env, kv)
		}
	}
	return env
}

// mcpClient is an MCP client of the SDK the server is built with.
var mcpClient = mcp.NewClient(&mcp.Implementation{Name: "loomfs-test", Version: "1"}, nil)

func mcpCall(t *testing.T, cs *mcp.ClientSession, name string, args any) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return res
}

func mcpText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// mcpStructured decodes a result's structured content into v.
func mcpStructured(t *testing.T, res *mcp.CallToolResult, v any) {
	t.Helper()
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("structured content %s: %v", b, err)
	}
}

// mcpRefused checks res is a tool error with code, in both forms.
func mcpRefused(t *testing.T, res *mcp.CallToolResult, code policy.Code) policy.Error {
	t.Helper()
	var e struct {
		Error policy.Error `json:"error"`
	}
	mcpStructured(t, res, &e)
	if !res.IsError || e.Error.Code != code || !strings.HasPrefix(mcpText(res), string(code)+": ") {
		t.Fatalf("want tool error %s, got isError=%v %+v %q", code, res.IsError, e.Error, mcpText(res))
	}
	return e.Error
}

// mcpSession runs the model's session of the issue against cs: the tool
// list is "loomfs tools", and write, read, a CAS conflict on edit, grep, a
// path escape and an oversize write behave as the tools do.
func mcpSession(t *testing.T, bin string, cs *mcp.ClientSession) {
	listed, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "tools").Output()
	if err != nil {
		t.Fatalf("loomfs tools: %v", err)
	}
	var defs []tools.Definition
	if err := json.Unmarshal(out, &defs); err != nil {
		t.Fatal(err)
	}
	if len(listed.Tools) != len(defs) {
		t.Fatalf("MCP lists %d tools, loomfs tools %d", len(listed.Tools), len(defs))
	}
	byName := map[string]*mcp.Tool{}
	for _, tl := range listed.Tools {
		byName[tl.Name] = tl
	}
	for _, d := range defs {
		got := byName[d.Name]
		if got == nil {
			t.Errorf("MCP does not list %s", d.Name)
			continue
		}
		var want, have any
		json.Unmarshal(d.InputSchema, &want)
		b, _ := json.Marshal(got.InputSchema)
		json.Unmarshal(b, &have)
		if got.Description != d.Description || !reflect.DeepEqual(want, have) {
			t.Errorf("%s: MCP description or input schema differ from loomfs tools", d.Name)
		}
	}

	var w struct {
		SHA256 string `json:"sha256"`
	}
	mcpStructured(t, mcpCall(t, cs, tools.Write, map[string]any{"path": "notes.txt", "content": "one\ntwo\nthree\n"}), &w)
	read := mcpCall(t, cs, tools.Read, map[string]any{"path": "notes.txt"})
	if txt := mcpText(read); read.IsError || !strings.Contains(txt, "     1\tone\n     2\ttwo\n     3\tthree\n") || !strings.Contains(txt, w.SHA256) {
		t.Fatalf("read text:\n%s", txt)
	}
	mcpCall(t, cs, tools.Write, map[string]any{"path": "notes.txt", "content": "one\nTWO\nthree\n", "expected_sha256": w.SHA256})
	conflict := mcpRefused(t, mcpCall(t, cs, tools.Edit, map[string]any{"path": "notes.txt", "old_text": "three", "new_text": "3", "expected_sha256": w.SHA256}), policy.Conflict)
	if len(conflict.SHA256) != 64 || conflict.SHA256 == w.SHA256 {
		t.Fatalf("conflict without the current sha256: %+v", conflict)
	}
	if res := mcpCall(t, cs, tools.Edit, map[string]any{"path": "notes.txt", "old_text": "three", "new_text": "3", "expected_sha256": conflict.SHA256}); res.IsError {
		t.Fatalf("edit with the current sha256: %s", mcpText(res))
	}
	if txt := mcpText(mcpCall(t, cs, tools.Grep, map[string]any{"pattern": "TWO|3"})); !strings.Contains(txt, "notes.txt:2: TWO\nnotes.txt:3: 3\n") {
		t.Fatalf("grep text:\n%s", txt)
	}
	mcpRefused(t, mcpCall(t, cs, tools.Read, map[string]any{"path": "../../../etc/passwd"}), policy.InvalidPath)
	mcpRefused(t, mcpCall(t, cs, tools.Write, map[string]any{"path": "big.txt", "content": strings.Repeat("z", 2<<20+1)}), policy.TooLarge)
	// The scope is the server's: a tool argument can't name another.
	mcpRefused(t, mcpCall(t, cs, tools.Read, map[string]any{"path": "notes.txt", "scope": "other/agent/s1"}), policy.InvalidInput)
}

// TestMCPOverStdio: an MCP client starts `loomfs mcp` as a subprocess and
// works the scope over stdin and stdout.
func TestMCPOverStdio(t *testing.T) {
	bin := buildLoomfs(t)
	root := t.TempDir()
	cmd := exec.Command(bin, "--root", root, "mcp", "--scope", "acme/coder/s1")
	cmd.Env = cleanEnv()
	cs, err := mcpClient.Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	mcpSession(t, bin, cs)
	if err := cs.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	if cmd.ProcessState == nil || !cmd.ProcessState.Success() {
		t.Errorf("loomfs mcp did not exit 0 when its client left: %v", cmd.ProcessState)
	}
	// What the session wrote is in the scope, seen by the other door.
	out, err := exec.Command(bin, "--root", root, "tool", tools.Read, "--scope", "acme/coder/s1", "--input", `{"path":"notes.txt"}`).Output()
	if err != nil || !strings.Contains(string(out), `one\nTWO\n3\n`) {
		t.Fatalf("loomfs tool read after the session: %v %s", err, out)
	}
}

// mcpHTTP is a `loomfs mcp --http` child process.
type mcpHTTP struct {
	cmd *exec.Cmd
	url string
}

func startMCPHTTP(t *testing.T, bin string, args ...string) *mcpHTTP {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"--root", t.TempDir(), "mcp", "--scope", "acme/coder/s1"}, args...)...)
	cmd.Env = cleanEnv()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	urlc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			if _, u, ok := strings.Cut(line, " at http://"); ok && strings.HasPrefix(line, "serving ") {
				urlc <- "http://" + u
			}
		}
	}()
	select {
	case u := <-urlc:
		return &mcpHTTP{cmd: cmd, url: u}
	case <-time.After(20 * time.Second):
		t.Fatal("loomfs mcp --http did not report its address")
	}
	return nil
}

type withToken struct{ token string }

func (w withToken) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+w.token)
	return http.DefaultTransport.RoundTrip(r)
}

// TestMCPOverHTTP: `loomfs mcp --http` on a loopback port with a token
// file serves the same session to a client with the token, answers 401
// without it or with another, and stops cleanly on SIGTERM.
func TestMCPOverHTTP(t *testing.T) {
	bin := buildLoomfs(t)
	const token = "0123456789abcdef0123456789abcdef"
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := startMCPHTTP(t, bin, "--http", "127.0.0.1:0", "--token-file", tokenFile)

	for name, auth := range map[string]string{"no token": "", "wrong token": "Bearer fedcba9876543210fedcba9876543210"} {
		t.Run(name+" is refused", func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, srv.url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			if auth != "" {
				req.Header.Set("Authorization", auth)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Fatalf("status %d, want 401", resp.StatusCode)
			}
		})
	}

	cs, err := mcpClient.Connect(context.Background(), &mcp.StreamableClientTransport{
		Endpoint:   srv.url,
		HTTPClient: &http.Client{Transport: withToken{token}},
		MaxRetries: -1,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	mcpSession(t, bin, cs)
	cs.Close()

	srv.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- srv.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("loomfs mcp --http after SIGTERM: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("loomfs mcp --http still running 15 s after SIGTERM")
	}
}

// TestMCPUsage: misconfigurations are refused before anything is served.
func TestMCPUsage(t *testing.T) {
	bin := buildLoomfs(t)
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	os.WriteFile(short, []byte("abc\n"), 0o600)
	good := filepath.Join(dir, "good")
	os.WriteFile(good, []byte("0123456789abcdef0123\n"), 0o600)
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"no scope", []string{"mcp"}, "--scope is required"},
		{"beyond loopback without a token", []string{"mcp", "--scope", "a/b/c", "--http", "0.0.0.0:0"}, "needs --token-file"},
		{"a host name without a token", []string{"mcp", "--scope", "a/b/c", "--http", "example.com:0"}, "needs --token-file"},
		{"token file without --http", []string{"mcp", "--scope", "a/b/c", "--token-file", good}, "--token-file is for --http"},
		{"token too short", []string{"mcp", "--scope", "a/b/c", "--http", "0.0.0.0:0", "--token-file", short}, "at least 16"},
		{"token file missing", []string{"mcp", "--scope", "a/b/c", "--http", ":0", "--token-file", filepath.Join(dir, "none")}, "no such file"},
		{"bad scope", []string{"mcp", "--scope", "a/../b"}, "agent id"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command(bin, append([]string{"--root", dir}, c.args...)...)
			cmd.Env = cleanEnv()
			cmd.Stdin = strings.NewReader("")
			out, err := cmd.CombinedOutput()
			ee, ok := err.(*exec.ExitError)
			if !ok || ee.ExitCode() != exitUsage {
				t.Fatalf("exit %v, want %d: %s", err, exitUsage, out)
			}
			if !strings.Contains(string(out), c.want) {
				t.Fatalf("output lacks %q: %s", c.want, out)
			}
		})
	}
}

// dockerPS lists the sandbox containers of scope, running or not, with
// their call label.
func dockerPS(t *testing.T, scope string) []string {
	t.Helper()
	out, err := exec.Command("docker", "ps", "-a", "--filter", "label=io.loomfs.scope="+scope, "--format", `{{.Label "io.loomfs.call"}}`).Output()
	if err != nil {
		t.Fatalf("docker ps: %v", err)
	}
	return strings.Fields(string(out))
}

// TestMCPCommandInSandbox: through `loomfs mcp` over stdio, a command runs
// in a real sandbox container under the request's call id; a long one
// reports progress, and the client's cancellation kills and removes its
// container, after which the scope takes commands again.
func TestMCPCommandInSandbox(t *testing.T) {
	bin := buildLoomfs(t)
	root := t.TempDir()
	scope := fmt.Sprintf("mcp-e2e/agent/s%d", time.Now().UnixNano())
	probe := exec.Command(bin, "--root", root, "tool", tools.Command, "--scope", scope, "--input", `{"command":"true"}`)
	probe.Env = cleanEnv()
	if out, err := probe.Output(); err != nil {
		// scripts/setup provides the engine and image; without them this
		// is a failure, not a skip.
		t.Fatalf("probe command (is the Docker engine up? run scripts/setup): %v %s", err, out)
	}

	progress := make(chan float64, 100)
	client := mcp.NewClient(&mcp.Implementation{Name: "loomfs-test", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			progress <- r.Params.Progress
		},
	})
	cmd := exec.Command(bin, "--root", root, "mcp", "--scope", scope)
	cmd.Env = cleanEnv()
	cs, err := client.Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()

	res := mcpCall(t, cs, tools.Command, map[string]any{"command": "echo hi > out.txt && cat out.txt"})
	var r tools.CommandResult
	mcpStructured(t, res, &r)
	if res.IsError || r.ExitCode != 0 || r.Stdout != "hi\n" || !strings.HasPrefix(mcpText(res), "exit code 0") {
		t.Fatalf("command: %+v %q", r, mcpText(res))
	}
	if calls := dockerPS(t, scope); len(calls) != 0 {
		t.Fatalf("containers left after a finished command: %v", calls)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	params := &mcp.CallToolParams{Name: tools.Command, Arguments: map[string]any{"command": "sleep 100", "timeout_s": 120}}
	params.SetProgressToken("sleep")
	errc := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(ctx, params)
		errc <- err
	}()
	select {
	case p := <-progress:
		if p <= 0 {
			t.Errorf("progress %v", p)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no progress notification within 20 s of a running command")
	}
	calls := dockerPS(t, scope)
	if len(calls) != 1 || !strings.HasPrefix(calls[0], "mcp-") {
		t.Fatalf("running command's container has call labels %v, want one mcp-<session>-<request id>", calls)
	}
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("cancelled command reported success")
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(dockerPS(t, scope)) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("container of the cancelled command still exists 30 s on: %v", dockerPS(t, scope))
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Not quarantined, lock released: the scope takes the next command.
	res = mcpCall(t, cs, tools.Command, map[string]any{"command": "cat out.txt"})
	mcpStructured(t, res, &r)
	if res.IsError || r.Stdout != "hi\n" {
		t.Fatalf("command after the cancel: %q", mcpText(res))
	}

	// What the policy refused the command is in the result and the text.
	res = mcpCall(t, cs, tools.Command, map[string]any{"command": "ln out.txt hard"})
	r = tools.CommandResult{}
	mcpStructured(t, res, &r)
	ev := r.PolicyEvents
	if ev.Total != 1 || len(ev.Events) != 1 || ev.Events[0].Op != "link" || ev.Events[0].Path != "hard" || ev.Events[0].Code != "link_unsupported" {
		t.Fatalf("policy_events of a refused ln: %+v", ev)
	}
	if text := mcpText(res); !strings.Contains(text, "refused by the workspace policy: 1 operation") || !strings.Contains(text, "link hard: EXDEV (link_unsupported)") {
		t.Fatalf("the text does not tell the refusal: %q", text)
	}
}
