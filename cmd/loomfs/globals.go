package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// globals holds the flags every subcommand shares. Each flag defaults to its
// AGENT_LOOM_* variable (SPEC §2.4); an explicit flag wins. No .env is read.
type globals struct {
	backend  string
	root     string
	volumeID string
	data     string
	policy   string
	json     bool
	logLevel string

	log *zap.Logger
	obs *observability // --metrics; nil when off
}

func envOr(name, def string) string {
	if v, ok := os.LookupEnv(name); ok && v != "" {
		return v
	}
	return def
}

func (g *globals) register(root *cobra.Command) {
	f := root.PersistentFlags()
	f.StringVar(&g.backend, "backend", envOr("AGENT_LOOM_WORKSPACE_BACKEND", "local"), "workspace backend: local or shared_posix ($AGENT_LOOM_WORKSPACE_BACKEND)")
	f.StringVar(&g.root, "root", envOr("AGENT_LOOM_WORKSPACE_ROOT", ""), "workspace root (default $AGENT_LOOM_DATA/workspaces for local) ($AGENT_LOOM_WORKSPACE_ROOT)")
	f.StringVar(&g.volumeID, "volume-id", envOr("AGENT_LOOM_WORKSPACE_VOLUME_ID", ""), "volume id the shared root's marker must hold ($AGENT_LOOM_WORKSPACE_VOLUME_ID)")
	f.StringVar(&g.data, "data", envOr("AGENT_LOOM_DATA", "./data"), "data directory of the local backend ($AGENT_LOOM_DATA)")
	f.StringVar(&g.policy, "policy", envOr("AGENT_LOOM_POLICY", ""), "policy file with path rules and limits ($AGENT_LOOM_POLICY)")
	f.BoolVar(&g.json, "json", false, "machine-readable JSON output")
	f.StringVar(&g.logLevel, "log-level", envOr("AGENT_LOOM_LOG_LEVEL", "warn"), "log level: debug, info, warn, error ($AGENT_LOOM_LOG_LEVEL)")
}

// complete validates the shared flags and builds the logger.
func (g *globals) complete(cmd *cobra.Command) error {
	switch g.backend {
	case "local", "shared_posix":
	default:
		return usagef("--backend %q: want local or shared_posix", g.backend)
	}
	var lvl zapcore.Level
	if err := lvl.Set(g.logLevel); err != nil {
		return usagef("--log-level %q: %v", g.logLevel, err)
	}
	cfg := zap.NewProductionConfig()
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	cfg.OutputPaths = []string{"stderr"}
	cfg.Sampling = nil
	log, err := cfg.Build()
	if err != nil {
		return fmt.Errorf("build logger: %w", err)
	}
	g.log = log
	return nil
}

// isCobraUsage reports whether err is one of cobra's own usage complaints.
func isCobraUsage(err error) bool {
	msg := err.Error()
	for _, p := range []string{"unknown command", "unknown flag", "unknown shorthand", "accepts ", "requires ", "invalid argument", "flag needs an argument", "required flag"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}
