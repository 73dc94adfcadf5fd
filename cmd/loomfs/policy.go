package main

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/agentloom/loomfs/policy"
)

func init() { addCommand(newPolicyCmd) }

const policyHelp = `A policy file (YAML, --policy or AGENT_LOOM_POLICY) sets the path rules,
limits and confirmation rules of every scope; without one the open layout
applies (everything read-write, default limits). The tool descriptions and
the workspace README are generated from the same policy, so what a model
reads is what is enforced. Example:

  version: 1
  preset: standard          # start from a built-in policy: open or standard
  rules:                    # the longest matching prefix gives the mode
    - path: output/
      mode: wo              # rw, ro, wo or hidden
      confirm: [delete, overwrite]
    - path: tmp/
      mode: rw
      max_bytes: 512 MiB    # cap on what the subtree holds
      max_files: 10000
      clear_at_run_end: true
  limits:
    text_bytes: 2 MiB       # files the read and write tools handle
    file_bytes: 1 GiB       # one file through the filesystem
    scope_bytes: 5 GiB      # or "unlimited"
    scope_files: 100000
    io_bytes_per_s: 50 MiB  # per scope, tools and commands together: slowed, never refused
    io_ops_per_s: 5000
  cache: journal-dirs       # or journal: opendir and owner bits checked in the daemon; strict: one-second kernel caching
  commands: fresh           # or session: each workspace_command an exec in the session sandbox
  priority: normal          # class of a scope no run gives one: low, normal or high
  limits_by_priority:       # a class's limits, laid over limits
    high: {scope_bytes: 20 GiB}
    low: {scope_bytes: 1 GiB}
  volume_reserve_low: 10%        # below this much free room, low scopes can't grow
  volume_reserve_normal: 2 GiB   # nor normal ones below this; high ones go on
  hooks:                    # the tool door's hooks: the call as JSON on stdin,
    before:                 # exit 0 allows, 2 denies (stderr is the reason)
      - tools: [workspace_write, workspace_apply_patch]
        command: [/usr/local/bin/check-call]   # no shell unless [sh, -c, ...]
        timeout: 5s
    after:
      - command: [/usr/local/bin/log-call]

The standard preset is the seed-001 layout: src/ rw, data/ ro, output/ wo
(deleting or overwriting there needs confirmation), logs/ rw, tmp/ rw capped
at 512 MiB and 10000 entries and emptied at the end of each run, .meta/
hidden. Unknown keys are refused, as is any invalid value, with its line.`

func newPolicyCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "policy show|check|readme",
		Short: "Check a policy file and show the rules and README it gives",
		Long:  policyHelp,
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			return usagef("policy needs a subcommand: show, check or readme")
		},
	}
	var preset string
	// load reads FILE if given, else --preset, else --policy.
	load := func(args []string) (*policy.Policy, string, error) {
		switch {
		case len(args) == 1:
			pol, err := policy.Load(args[0])
			return pol, args[0], err
		case preset != "":
			pol, ok := policy.Preset(preset)
			if !ok {
				return nil, "", usagef("--preset %q: known presets are %s", preset, strings.Join(policy.PresetNames(), ", "))
			}
			return pol, "preset " + preset, nil
		}
		pol, err := g.loadPolicy()
		src := g.policy
		if src == "" {
			src = "the open layout (no --policy)"
		}
		return pol, src, err
	}
	show := &cobra.Command{
		Use:   "show [FILE]",
		Short: "Print the effective rules, limits and the generated README",
		Long:  "Print the rules, subtrees and limits the policy FILE (or --preset, or\n--policy) puts in force, then the workspace README generated from it.\n\n" + policyHelp,
		Args:  maxArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			pol, src, err := load(args)
			if err != nil {
				return err
			}
			if g.json {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(policyJSON(pol, src))
			}
			printPolicy(cmd.OutOrStdout(), pol, src)
			fmt.Fprintf(cmd.OutOrStdout(), "\n--- README.md ---\n%s", policy.WorkspaceReadme(pol))
			return nil
		},
	}
	check := &cobra.Command{
		Use:   "check FILE",
		Short: "Check a policy file; exit 1 with the line and reason if invalid",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			pol, err := policy.Load(args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: ok (%d path rules, %d subtree rules)\n", args[0], len(pol.Rules), len(pol.Subtrees))
			return nil
		},
	}
	readme := &cobra.Command{
		Use:   "readme [FILE]",
		Short: "Print the workspace README.md generated from the policy",
		Args:  maxArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			pol, _, err := load(args)
			if err != nil {
				return err
			}
			fmt.Fprint(cmd.OutOrStdout(), policy.WorkspaceReadme(pol))
			return nil
		},
	}
	for _, c := range []*cobra.Command{show, readme} {
		c.Flags().StringVar(&preset, "preset", "", "show a built-in policy instead: "+strings.Join(policy.PresetNames(), " or "))
	}
	cmd.AddCommand(show, check, readme)
	return cmd
}

func printPolicy(w io.Writer, pol *policy.Policy, src string) {
	fmt.Fprintf(w, "policy: %s\n\n", src)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PATH\tMODE\tCAP\tCONFIRM\tAT RUN END")
	rows := map[string][]string{}
	for _, r := range pol.Rules {
		rows[r.Prefix] = []string{string(r.Mode), "-", "-", "-"}
	}
	for _, s := range pol.Subtrees {
		row, ok := rows[s.Prefix]
		if !ok {
			row = []string{string(pol.ModeOf(s.Prefix)) + " (inherited)", "-", "-", "-"}
		}
		if s.Capped() {
			var c []string
			if s.MaxBytes > 0 {
				c = append(c, policy.Bytes(s.MaxBytes))
			}
			if s.MaxFiles > 0 {
				c = append(c, fmt.Sprintf("%d files", s.MaxFiles))
			}
			row[1] = strings.Join(c, ", ")
		}
		if len(s.Confirm) > 0 {
			var c []string
			for _, op := range s.Confirm {
				c = append(c, policy.ConfirmName(op))
			}
			row[2] = strings.Join(c, ", ")
		}
		switch {
		case s.Temporary && s.Publish:
			row[3] = "emptied, published"
		case s.Temporary:
			row[3] = "emptied"
		case s.Publish:
			row[3] = "published"
		}
		rows[s.Prefix] = row
	}
	var prefixes []string
	for p := range rows {
		prefixes = append(prefixes, p)
	}
	sort.Strings(prefixes)
	for _, p := range prefixes {
		fmt.Fprintf(tw, "%s/\t%s\n", p, strings.Join(rows[p], "\t"))
	}
	if _, ok := rows["."]; !ok {
		fmt.Fprintln(tw, "(everything else)\trw\t-\t-\t-")
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, k := range pol.Limits.Keys() {
		fmt.Fprintf(tw, "%s\t%s\n", k.Name, k.Text)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nsymlinks: %s\ncache: %s\ncommands: %s\n", symlinksOf(pol), cacheOf(pol), commandsOf(pol))
	printPriority(w, pol)
	if len(pol.Layout) > 0 {
		fmt.Fprintf(w, "made at first use (0700): %s\n", strings.Join(pol.Layout, " "))
	}
}

func policyJSON(pol *policy.Policy, src string) any {
	type subtree struct {
		Path          string   `json:"path"`
		MaxBytes      int64    `json:"max_bytes,omitempty"`
		MaxFiles      int64    `json:"max_files,omitempty"`
		Confirm       []string `json:"confirm,omitempty"`
		ClearAtRunEnd bool     `json:"clear_at_run_end,omitempty"`
		Publish       bool     `json:"publish,omitempty"`
	}
	type rule struct {
		Path string      `json:"path"`
		Mode policy.Mode `json:"mode"`
	}
	out := struct {
		Source   string    `json:"source"`
		Rules    []rule    `json:"rules"`
		Subtrees []subtree `json:"subtrees"`
		Limits   any       `json:"limits"`
		Symlinks string    `json:"symlinks"`
		Cache    string    `json:"cache"`
		Commands string    `json:"commands"`
		Layout   []string  `json:"layout"`
		Readme   string    `json:"readme"`
		// Priority, its limits and watermarks, and the hooks (issue 48).
		Priority            policy.Priority       `json:"priority"`
		LimitsByPriority    map[string]any        `json:"limits_by_priority,omitempty"`
		VolumeReserveLow    string                `json:"volume_reserve_low"`
		VolumeReserveNormal string                `json:"volume_reserve_normal"`
		Hooks               map[string][]hookJSON `json:"hooks"`
	}{Priority: pol.Class(), VolumeReserveLow: pol.VolumeReserveLow.String(), VolumeReserveNormal: pol.VolumeReserveNormal.String(),
		Hooks:  map[string][]hookJSON{"before": hooksJSON(pol.Hooks.Before), "after": hooksJSON(pol.Hooks.After)},
		Source: src, Rules: []rule{}, Subtrees: []subtree{}, Symlinks: string(symlinksOf(pol)), Cache: string(cacheOf(pol)), Commands: string(commandsOf(pol)), Layout: append([]string{}, pol.Layout...), Readme: policy.WorkspaceReadme(pol)}
	for _, r := range pol.Rules {
		out.Rules = append(out.Rules, rule{r.Prefix, r.Mode})
	}
	for _, s := range pol.Subtrees {
		st := subtree{Path: s.Prefix, MaxBytes: s.MaxBytes, MaxFiles: s.MaxFiles, ClearAtRunEnd: s.Temporary, Publish: s.Publish}
		for _, op := range s.Confirm {
			st.Confirm = append(st.Confirm, policy.ConfirmName(op))
		}
		out.Subtrees = append(out.Subtrees, st)
	}
	limits := map[string]any{}
	for _, k := range pol.Limits.Keys() {
		limits[k.Name] = k.Value
	}
	out.Limits = limits
	if len(pol.LimitsByPriority) > 0 {
		out.LimitsByPriority = map[string]any{}
		for c, l := range pol.LimitsByPriority {
			m := map[string]any{}
			for _, k := range l.Keys() {
				m[k.Name] = k.Value
			}
			out.LimitsByPriority[string(c)] = m
		}
	}
	return out
}

type hookJSON struct {
	Tools   []string `json:"tools"`
	Command []string `json:"command"`
	Timeout string   `json:"timeout"`
	Rewrite bool     `json:"rewrite,omitempty"`
}

func hooksJSON(hs []policy.HookCommand) []hookJSON {
	out := []hookJSON{}
	for _, h := range hs {
		tools := h.Tools
		if tools == nil {
			tools = []string{}
		}
		out = append(out, hookJSON{Tools: tools, Command: h.Command, Timeout: h.Timeout.String(), Rewrite: h.Rewrite})
	}
	return out
}

// printPriority prints the policy's default class, each class's limits
// that differ from the policy's, the volume watermarks and the hooks.
func printPriority(w io.Writer, pol *policy.Policy) {
	fmt.Fprintf(w, "priority: %s\nvolume_reserve_low: %s\nvolume_reserve_normal: %s\n", pol.Class(), pol.VolumeReserveLow, pol.VolumeReserveNormal)
	for _, c := range policy.Priorities {
		l, ok := pol.LimitsByPriority[c]
		if !ok {
			continue
		}
		base := map[string]string{}
		for _, k := range pol.Limits.Keys() {
			base[k.Name] = k.Text
		}
		var diff []string
		for _, k := range l.Keys() {
			if base[k.Name] != k.Text {
				diff = append(diff, k.Name+" "+k.Text)
			}
		}
		if len(diff) == 0 {
			continue
		}
		fmt.Fprintf(w, "limits of %s priority: %s\n", c, strings.Join(diff, ", "))
	}
	for _, h := range []struct {
		when string
		list []policy.HookCommand
	}{{"before", pol.Hooks.Before}, {"after", pol.Hooks.After}} {
		for _, c := range h.list {
			tools := "every tool"
			if len(c.Tools) > 0 {
				tools = strings.Join(c.Tools, ", ")
			}
			rw := ""
			if c.Rewrite {
				rw = ", may rewrite arguments"
			}
			fmt.Fprintf(w, "hook %s %s: %q (timeout %s%s)\n", h.when, tools, c.Command, c.Timeout, rw)
		}
	}
	if pol.Hooks.Empty() {
		fmt.Fprintln(w, "hooks: none")
	}
}

// symlinksOf is the policy's symlinks setting as the file would say it.
func symlinksOf(pol *policy.Policy) policy.Symlinks {
	if pol.EmulatesLinks() {
		return policy.SymlinksEmulate
	}
	return policy.SymlinksRefuse
}

// cacheOf is the policy's cache setting as the file would say it.
func cacheOf(pol *policy.Policy) policy.Cache {
	switch {
	case pol.StrictCache():
		return policy.CacheStrict
	case pol.KernelOpensDirs():
		return policy.CacheKernelDirs
	}
	return policy.CacheJournal
}

// commandsOf is the policy's commands setting as the file would say it.
func commandsOf(pol *policy.Policy) policy.Commands {
	if pol.SessionCommands() {
		return policy.CommandsSession
	}
	return policy.CommandsFresh
}

// maxArgs is cobra.MaximumNArgs reporting a usage error.
func maxArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) > n {
			return usagef("%s takes at most %d argument(s), got %d; see --help", cmd.CommandPath(), n, len(args))
		}
		return nil
	}
}
