package mcpserver

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/tools"
)

// serveToken serves s over HTTP with token on a loopback port and returns
// the endpoint URL.
func serveToken(t *testing.T, s *Server, token string) string {
	t.Helper()
	ln, err := Listen("127.0.0.1:0", token != "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.ServeHTTP(ctx, ln, token, time.Second) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return "http://" + ln.Addr().String()
}

const initBody = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`

// TestBearerToken: with a token file, a request without the token or with
// another is answered 401 before MCP sees it; the token lets a client in.
func TestBearerToken(t *testing.T) {
	const token = "s3cret-token-value"
	tb := newToolbox(t, nil)
	url := serveToken(t, newServer(t, tb, Options{}), token)

	cases := []struct {
		name   string
		header string // Authorization; "" sends none
		want   int
	}{
		{"no token", "", http.StatusUnauthorized},
		{"wrong token", "Bearer wrong-token-value", http.StatusUnauthorized},
		{"token as a prefix", "Bearer " + token + "x", http.StatusUnauthorized},
		{"prefix of the token", "Bearer " + token[:len(token)-1], http.StatusUnauthorized},
		{"empty bearer", "Bearer ", http.StatusUnauthorized},
		{"other scheme", "Basic " + token, http.StatusUnauthorized},
		{"right token", "Bearer " + token, http.StatusOK},
		{"scheme in lower case", "bearer " + token, http.StatusOK},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(initBody))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			if c.header != "" {
				req.Header.Set("Authorization", c.header)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != c.want {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, c.want, body)
			}
			if c.want == http.StatusUnauthorized {
				if !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
					t.Errorf("401 without a Bearer challenge: %q", resp.Header.Get("WWW-Authenticate"))
				}
				if strings.Contains(string(body), "jsonrpc") {
					t.Errorf("refused request reached MCP: %s", body)
				}
			}
		})
	}

	t.Run("client with the token works, without it can't connect", func(t *testing.T) {
		client := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
		ctx := context.Background()
		if cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, MaxRetries: -1}, nil); err == nil {
			cs.Close()
			t.Fatal("connected without a token")
		}
		bad := &http.Client{Transport: bearerClient{"nope", http.DefaultTransport}}
		if cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: bad, MaxRetries: -1}, nil); err == nil {
			cs.Close()
			t.Fatal("connected with a wrong token")
		}
		good := &http.Client{Transport: bearerClient{token, http.DefaultTransport}}
		cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: good, MaxRetries: -1}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		ok(t, callTool(t, cs, tools.Write, map[string]any{"path": "t.txt", "content": "with token"}))
		toolError(t, callTool(t, cs, tools.Read, map[string]any{"path": "../t.txt"}), policy.InvalidPath)
	})
}

// TestListen: without a token only loopback is served, and an address
// without a host means loopback, never every interface.
func TestListen(t *testing.T) {
	cases := []struct {
		addr      string
		token     bool
		wantErr   error // nil: listens
		loopback  bool  // the bound address must be loopback
		needsIPv6 bool
	}{
		{addr: "127.0.0.1:0", loopback: true},
		{addr: ":0", loopback: true},
		{addr: "0", loopback: true},
		{addr: "localhost:0", loopback: true},
		{addr: "[::1]:0", loopback: true, needsIPv6: true},
		{addr: "0.0.0.0:0", wantErr: ErrTokenRequired},
		{addr: "[::]:0", wantErr: ErrTokenRequired},
		{addr: "192.0.2.1:0", wantErr: ErrTokenRequired},
		{addr: "example.com:0", wantErr: ErrTokenRequired},
		{addr: "0.0.0.0:0", token: true},
		{addr: ":0", token: true, loopback: true},
	}
	for _, c := range cases {
		name := c.addr
		if c.token {
			name += " with token"
		}
		t.Run(name, func(t *testing.T) {
			ln, err := Listen(c.addr, c.token)
			if c.wantErr != nil {
				if !errors.Is(err, c.wantErr) {
					t.Fatalf("err %v, want %v", err, c.wantErr)
				}
				return
			}
			if err != nil {
				if c.needsIPv6 {
					t.Skipf("no IPv6 loopback here: %v", err)
				}
				t.Fatal(err)
			}
			defer ln.Close()
			ip := ln.Addr().(*net.TCPAddr).IP
			if c.loopback && !ip.IsLoopback() {
				t.Fatalf("bound %s, want loopback", ln.Addr())
			}
		})
	}
	t.Run("bad address", func(t *testing.T) {
		if ln, err := Listen("no port here", false); err == nil {
			ln.Close()
			t.Fatal("listened on a malformed address")
		}
	})
}
