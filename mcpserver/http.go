package mcpserver

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// HTTPHandler serves the tools over the streamable HTTP transport. With a
// token, every request must carry "Authorization: Bearer <token>"; any
// other is answered 401 before it reaches MCP.
func (s *Server) HTTPHandler(token string) http.Handler {
	var h http.Handler = mcp.NewStreamableHTTPHandler(
		func(*http.Request) *mcp.Server { return s.srv },
		&mcp.StreamableHTTPOptions{Logger: s.opts.Logger, MaxRequestBodyBytes: s.maxBytes},
	)
	h = stampHTTP(h, s.maxBytes)
	if token != "" {
		h = requireBearer(token, h)
	}
	return h
}

// requireBearer answers 401 to a request without the bearer token. The
// comparison is of digests, in constant time, so neither the token's bytes
// nor its length leak through timing.
func requireBearer(token string, next http.Handler) http.Handler {
	want := sha256.Sum256([]byte(token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := bearer(r.Header.Get("Authorization"))
		sum := sha256.Sum256([]byte(got))
		if subtle.ConstantTimeCompare(sum[:], want[:]) != 1 || !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="loomfs"`)
			http.Error(w, "unauthorized: a valid bearer token is required", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// RequireBearer is the same rule for another handler served beside the
// tools (loomfs's --metrics address).
func RequireBearer(token string, next http.Handler) http.Handler { return requireBearer(token, next) }

// bearer extracts the token of an "Authorization: Bearer <token>" header.
func bearer(h string) (string, bool) {
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

// ErrTokenRequired is returned by Listen for an address beyond loopback
// without a token.
var ErrTokenRequired = errors.New("a bearer token is required to serve beyond loopback")

// Listen opens a TCP listener for addr ("host:port", ":port" or "port").
// Without a host it binds loopback, never every interface. Unless
// haveToken, it refuses any address that is not loopback, checked on the
// address asked for and again on the one bound.
func Listen(addr string, haveToken bool) (net.Listener, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		if _, perr := net.LookupPort("tcp", addr); perr != nil {
			return nil, fmt.Errorf("listen address %q: want host:port, :port or port", addr)
		}
		host, port = "", addr
	}
	if host == "" {
		host = "127.0.0.1"
	}
	if !haveToken && !loopbackHost(host) {
		return nil, fmt.Errorf("listen on %s: %w", addr, ErrTokenRequired)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, port))
	if err != nil {
		return nil, err
	}
	if tcp, ok := ln.Addr().(*net.TCPAddr); !haveToken && (!ok || !tcp.IP.IsLoopback()) {
		ln.Close()
		return nil, fmt.Errorf("listen on %s: bound %s: %w", addr, ln.Addr(), ErrTokenRequired)
	}
	return ln, nil
}

// loopbackHost reports whether host names loopback: "localhost" or a
// loopback IP. Any other name could resolve anywhere, so it needs a token.
func loopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// ServeHTTP serves the HTTP handler on ln until ctx is done, then stops
// taking requests and waits up to grace for the ones in flight.
func (s *Server) ServeHTTP(ctx context.Context, ln net.Listener, token string, grace time.Duration) error {
	hs := &http.Server{
		Handler:           s.HTTPHandler(token),
		ReadHeaderTimeout: 10 * time.Second,
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve MCP over HTTP: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		hs.Close() // event streams stay open until closed
	}
	<-errc
	return nil
}
