// Package enginetest serves a container engine through a proxy whose
// requests a test can hold, fail or count: a loaded or stuck engine, made
// on demand in front of the real one.
package enginetest

import (
	"context"
	"net"
	"net/http"
	"net/http/httputil"
	"path/filepath"
	"strings"
	"testing"
)

// Hook sees each request before it is passed on. It may block (a slow
// engine), or answer it itself and return pass false (a stuck or
// failing one); after, if not nil, is called once the engine answered.
type Hook func(w http.ResponseWriter, r *http.Request) (pass bool, after func())

// Proxy serves the engine at host (unix://PATH) through hook and returns
// the proxy's address, which stops at the end of the test.
func Proxy(t testing.TB, host string, hook Hook) string {
	t.Helper()
	sock := strings.TrimPrefix(host, "unix://")
	ln, err := net.Listen("unix", filepath.Join(t.TempDir(), "engine.sock"))
	if err != nil {
		t.Fatal(err)
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) { r.Out.URL.Scheme, r.Out.URL.Host = "http", "engine" },
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}},
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		pass, after := hook(w, r)
		if !pass {
			return
		}
		proxy.ServeHTTP(w, r)
		if after != nil {
			after()
		}
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "unix://" + ln.Addr().String()
}

// IsStart reports whether r asks the engine to start a container.
func IsStart(r *http.Request) bool {
	return r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/start")
}

// IsCreate reports whether r asks the engine to create a container.
func IsCreate(r *http.Request) bool {
	return r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/containers/create")
}
