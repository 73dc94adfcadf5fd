package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentloom/loomfs/mcpserver"
	"github.com/agentloom/loomfs/store"
)

func init() { addCommand(newMCPCmd) }

// minTokenBytes is the shortest bearer token accepted: a guessable token
// on a network address is no protection.
const minTokenBytes = 16

func newMCPCmd(g *globals) *cobra.Command {
	var scope, httpAddr, tokenFile string
	var mf metricsFlags
	cmd := &cobra.Command{
		Use:   "mcp --scope S [--http ADDR [--token-file FILE]]",
		Short: "Serve a scope's workspace tools to MCP clients over stdio or HTTP",
		Long: `Serve the workspace tools of one scope to MCP clients: over stdin and stdout
by default, or over the streamable HTTP transport with --http. The tools,
their descriptions and input schemas are those "loomfs tools" prints.

The scope is fixed by --scope; no tool argument can change it. Refusals are
MCP tool errors carrying the loomfs error code and message. A request's
JSON-RPC id is its call id (mcp-<session>-<id>), so a change repeated in
the same session gets the recorded result (a read is read again). A client's cancellation cancels
the call, and a running command's container with it. The process tools
(workspace_process_*) reach this node's "loomfs serve", so every MCP session
of the node, and the CLI, see the same processes.

--http ADDR serves on ADDR (host:port, :port or port). Without a host it
binds 127.0.0.1, never every interface. Any address beyond loopback needs
--token-file: a file holding the bearer token every request must carry as
"Authorization: Bearer <token>"; others get 401. "serving SCOPE at URL" is
printed on stderr once the listener is up. SIGINT or SIGTERM stop the server.

On a shared volume it asks every ` + store.FenceCheckEvery.String() + ` whether this node was fenced
("loomfs fence --help"); once it was, every call is refused with
volume_unavailable "this node was fenced", unaudited, until it is stopped.

` + metricsHelp,
		Example: `  loomfs mcp --scope acme/coder/s1
  loomfs mcp --scope acme/coder/s1 --http :8765
  loomfs mcp --scope acme/coder/s1 --http 0.0.0.0:8765 --token-file /etc/loomfs/mcp-token`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			stopMetrics, err := g.startMetrics(ctx, mf)
			if err != nil {
				return err
			}
			defer stopMetrics()
			return runMCP(ctx, g, scope, httpAddr, tokenFile)
		},
	}
	f := cmd.Flags()
	f.StringVar(&scope, "scope", "", "scope to serve: SPACE/AGENT/SESSION or SPACE/AGENT/SESSION/RUN/INSTANCE, or run:RUN[/INSTANCE] through the run's binding (required)")
	f.StringVar(&httpAddr, "http", "", "serve streamable HTTP on ADDR instead of stdio (loopback unless a token is given)")
	f.StringVar(&tokenFile, "token-file", "", "file holding the bearer token HTTP requests must carry (required beyond loopback)")
	addMetricsFlags(f, &mf)
	return cmd
}

func runMCP(ctx context.Context, g *globals, scope, httpAddr, tokenFile string) error {
	if tokenFile != "" && httpAddr == "" {
		return usagef("--token-file is for --http; over stdio the client starts the server itself")
	}
	token, err := readToken(tokenFile)
	if err != nil {
		return err
	}
	s, err := g.openSession(ctx, scope)
	if err != nil {
		return err
	}
	defer s.close()
	s.node.SweepStaleMounts()
	// A node fenced from the volume serves nothing more from it: every
	// call is refused with the fence from then on.
	var fence atomic.Pointer[error]
	s.tools.Fenced = func() error {
		if p := fence.Load(); p != nil {
			return *p
		}
		return nil
	}
	wctx, endWatch := context.WithCancel(ctx)
	defer endWatch()
	obs := g.obs
	go func() {
		cfg := g.storeConfig()
		watch := func(ctx context.Context) error { return store.WatchFence(ctx, cfg, store.FenceCheckEvery) }
		if err := obs.watchFence(wctx, cfg, watch); err != nil {
			fmt.Fprintf(os.Stderr, "loomfs mcp: FENCED: %v; every call is refused from now on\n", err)
			fence.Store(&err)
		}
	}()
	srv, err := mcpserver.New(s.tools, mcpserver.Options{Logger: g.slogger()})
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	if httpAddr == "" {
		err := srv.ServeStdio(ctx)
		if errors.Is(err, context.Canceled) {
			return nil
		}
		return err
	}
	ln, err := mcpserver.Listen(httpAddr, token != "")
	if errors.Is(err, mcpserver.ErrTokenRequired) {
		return usagef("--http %s is not a loopback address: serving beyond loopback needs --token-file", httpAddr)
	}
	if err != nil {
		return fmt.Errorf("--http %s: %w", httpAddr, err)
	}
	fmt.Fprintf(os.Stderr, "serving %s at http://%s/\n", s.ws.Scope(), ln.Addr())
	return srv.ServeHTTP(ctx, ln, token, 5*time.Second)
}

// readToken reads the bearer token of file ("" if no file is named).
func readToken(file string) (string, error) {
	if file == "" {
		return "", nil
	}
	fi, err := os.Stat(file)
	if err != nil {
		return "", usagef("--token-file: %v", err)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", usagef("--token-file: %v", err)
	}
	token := strings.TrimSpace(string(b))
	if len(token) < minTokenBytes || strings.ContainsAny(token, " \t\r\n") {
		return "", usagef("--token-file %s: want one token of at least %d characters without spaces (for example 32 random bytes in hex)", file, minTokenBytes)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		fmt.Fprintf(os.Stderr, "loomfs mcp: warning: %s is readable by other users (mode %04o); make it 0600\n", file, fi.Mode().Perm())
	}
	return token, nil
}

// slogger is the SDK's logger at the level of --log-level.
func (g *globals) slogger() *slog.Logger {
	var lvl slog.Level
	switch g.logLevel {
	case "debug":
		lvl = slog.LevelDebug
	case "info":
		lvl = slog.LevelInfo
	case "error", "dpanic", "panic", "fatal":
		lvl = slog.LevelError
	default:
		lvl = slog.LevelWarn
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
}
