// Command loomfs serves policed agent workspaces: tool handlers, a FUSE
// projection, sandbox containers and an audit log over one shared root.
//
// Each subcommand lives in its own file and registers itself with
// addCommand from an init function, so adding one never edits this file.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
)

// Exit codes (SPEC §10).
const (
	exitOK      = 0
	exitRefused = 1
	exitUsage   = 2
)

// usageError marks an error as the caller's misuse of the command line.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// exitError carries an exit code for a failure already reported to the user.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit %d", e.code) }

var commands []func(*globals) *cobra.Command

// addCommand registers a subcommand constructor; called from init functions.
func addCommand(newCmd func(*globals) *cobra.Command) {
	commands = append(commands, newCmd)
}

func newRootCmd() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:           "loomfs",
		Short:         "Policed workspaces for AI agents: tools, FUSE projection, sandbox, audit",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			return g.complete(cmd)
		},
	}
	g.register(root)
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return usageError{err}
	})
	for _, newCmd := range commands {
		root.AddCommand(newCmd(g))
	}
	return root
}

func main() {
	limitMemoryToCgroup()
	stopTracing := startTracing()
	code := run(os.Args[1:], os.Stdout, os.Stderr)
	stopTracing()
	os.Exit(code)
}

// run executes the command line and returns the exit code main exits with.
// Tests call it in-process.
func run(args []string, stdout, stderr io.Writer) int {
	root := newRootCmd()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.Execute()
	if err == nil {
		return exitOK
	}
	var ee exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	fmt.Fprintln(stderr, "loomfs:", err)
	var ue usageError
	if errors.As(err, &ue) || isCobraUsage(err) {
		return exitUsage
	}
	return exitRefused
}
