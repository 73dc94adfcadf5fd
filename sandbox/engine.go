package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path"
	"strings"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/client"
)

// DefaultHost is the engine address used when AGENT_LOOM_DOCKER_HOST is unset.
const DefaultHost = "unix:///var/run/docker.sock"

// ErrHostNotLocal is returned for an engine address that is not a local unix
// socket. Bind mounts name paths on the engine's own host, so a remote engine
// would mount some other machine's directories (SPEC §5).
var ErrHostNotLocal = errors.New("sandbox: the docker engine must be a local unix:// socket")

// HostFromEnv returns AGENT_LOOM_DOCKER_HOST, or DefaultHost when unset. It
// deliberately ignores DOCKER_HOST and the other DOCKER_* variables.
func HostFromEnv() string {
	if h := os.Getenv("AGENT_LOOM_DOCKER_HOST"); h != "" {
		return h
	}
	return DefaultHost
}

// CheckHost reports whether host names a local unix socket by absolute path.
func CheckHost(host string) error {
	u, err := url.Parse(host)
	if err != nil || u.Scheme != "unix" {
		return fmt.Errorf("%w: %q refused (tcp://, ssh:// and npipe:// engines are not allowed)", ErrHostNotLocal, host)
	}
	if u.Host != "" || u.RawQuery != "" || u.Fragment != "" || !path.IsAbs(u.Path) || path.Clean(u.Path) != u.Path {
		return fmt.Errorf("%w: %q refused: want unix:///absolute/path/to/docker.sock", ErrHostNotLocal, host)
	}
	return nil
}

// dial connects to the engine at host, negotiating the API version, and
// checks that it answers.
func dial(ctx context.Context, host string) (*client.Client, error) {
	if host == "" {
		host = HostFromEnv()
	}
	if err := CheckHost(host); err != nil {
		return nil, err
	}
	cli, err := client.NewClientWithOpts(client.WithHost(host), client.WithAPIVersionNegotiation())
	if err != nil {
		return nil, fmt.Errorf("sandbox: docker client for %s: %w", host, err)
	}
	if _, err := cli.Ping(ctx); err != nil {
		cli.Close()
		return nil, fmt.Errorf("sandbox: docker engine at %s does not answer (is dockerd running?): %w", host, err)
	}
	cli.NegotiateAPIVersion(ctx)
	return cli, nil
}

// answered reports whether err is the engine's own reply to a request, as
// opposed to a transport failure or a deadline after which the request's
// outcome is unknown.
func answered(err error) bool {
	if err == nil {
		return true
	}
	if client.IsErrConnectionFailed(err) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	for _, is := range []func(error) bool{
		cerrdefs.IsInvalidArgument, cerrdefs.IsNotFound, cerrdefs.IsConflict,
		cerrdefs.IsAlreadyExists, cerrdefs.IsPermissionDenied, cerrdefs.IsUnauthorized,
		cerrdefs.IsNotImplemented, cerrdefs.IsFailedPrecondition, cerrdefs.IsInternal,
		cerrdefs.IsUnavailable,
	} {
		if is(err) {
			return true
		}
	}
	return false
}

// validName reports whether s is a conservative identifier: it starts with a
// letter or digit and holds only letters, digits, '.', '_' and '-'.
func validName(s string, max int) bool {
	if s == "" || len(s) > max {
		return false
	}
	for i, c := range s {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case i > 0 && (c == '.' || c == '_' || c == '-'):
		default:
			return false
		}
	}
	return !strings.Contains(s, "..")
}
