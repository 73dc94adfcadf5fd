package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/agentloom/loomfs/sandbox"
)

func init() { addCommand(newImageCmd) }

func newImageCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "image",
		Short: "Manage the sandbox image",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return usagef("image: missing subcommand (want: build)")
		},
	}
	cmd.AddCommand(newImageBuildCmd(g))
	return cmd
}

func newImageBuildCmd(g *globals) *cobra.Command {
	var opts sandbox.BuildOptions
	cmd := &cobra.Command{
		Use:   "build [--minimal | --dev] [--tag TAG] [--force]",
		Short: "Build the sandbox image locally from Debian packages (no registry)",
		Long: `Build the sandbox image on the local Docker engine from this host's Debian
packages; no image is pulled from any registry, now or when commands run.

The default image holds busybox (sh and the usual utilities) and Python 3 with
its standard library, plus exactly the shared libraries they need, resolved
with apt-cache and fetched with apt-get download. --minimal builds a
busybox-only image for fast tests. --dev builds the development test image:
the default image plus git, make, gcc, libc6-dev, python3-venv, nodejs, npm,
unzip, tar, sqlite3 and golang-go with everything they depend on (about
1 GiB), for tests that run a coding agent's real toolchains.

The tag defaults to $AGENT_LOOM_SANDBOX_IMAGE or loomfs-sandbox:latest
(loomfs-sandbox-min:latest with --minimal, loomfs-sandbox-dev:latest with
--dev). An image already carrying the tag
is kept unless --force is given. The engine is $AGENT_LOOM_DOCKER_HOST
(default unix:///var/run/docker.sock; only local unix sockets are accepted).

Needs apt-get, apt-cache and dpkg-deb, and a current apt index (apt-get update).
Progress goes to stderr; the image's tag and ID go to stdout.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Host = sandbox.HostFromEnv()
			opts.Progress = cmd.ErrOrStderr()
			// An interrupt cancels the build and still removes its work directory.
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			info, err := sandbox.BuildImage(ctx, opts)
			if errors.Is(err, sandbox.ErrInvalidRequest) {
				return usageError{err}
			}
			if err != nil {
				fmt.Fprintln(cmd.ErrOrStderr(), "loomfs:", err)
				return exitError{exitRefused}
			}
			if g.json {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(info)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", info.Tag, info.ID)
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&opts.Minimal, "minimal", false, "build the busybox-only test image")
	f.BoolVar(&opts.Dev, "dev", false, "build the development test image (git, gcc, make, python3-venv, node, npm, go…)")
	f.StringVar(&opts.Tag, "tag", "", "image tag (default $AGENT_LOOM_SANDBOX_IMAGE or loomfs-sandbox:latest; loomfs-sandbox-min:latest with --minimal)")
	f.BoolVar(&opts.Force, "force", false, "rebuild even if the tag already exists")
	f.StringVar(&opts.User, "user", sandbox.DefaultUser, "numeric uid:gid of the image's sandbox user (must match the runner's)")
	return cmd
}
