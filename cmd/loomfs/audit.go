package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/agentloom/loomfs/audit"
)

func init() { addCommand(newAuditCmd) }

// auditDir is the audit directory of the configured volume root.
func auditDir(g *globals) string {
	return audit.Dir(g.storeConfig().RootPath())
}

func newAuditCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Query, follow and verify the audit log",
		Long: `Read the audit log kept under <root>/.agentloom-audit (SPEC §8).

Every tool call, filesystem mutation or refusal, sandbox container event and
admin command is one JSON record. Each writer (one loomfs process on one node)
appends to its own files, <node>-<pid>-<start>.<n>.jsonl, and every record
carries a sequence number and the sha256 of the record before it, so
"loomfs audit verify" finds edited, dropped, inserted or reordered records.

The directory is found from --root, or <--data>/workspaces for the local
backend. These commands only read it.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef("unknown command %q for %q: want query, tail or verify", args[0], cmd.CommandPath())
			}
			return cmd.Help()
		},
	}
	cmd.AddCommand(newAuditQueryCmd(g), newAuditTailCmd(g), newAuditVerifyCmd(g))
	return cmd
}

func newAuditQueryCmd(g *globals) *cobra.Command {
	var ff auditFilterFlags
	cmd := &cobra.Command{
		Use:   "query [filters]",
		Short: "Print the audit records that match filters, oldest first",
		Long: `Print the event records that match every given filter, oldest first, merged
across all writers and rotated files. Checkpoint records are not printed.

With --json each record is printed as one JSON object per line, with the same
fields as on disk; otherwise as a table. Paths with spaces, quotes or control
characters are shown quoted in the table, so one row is always one record.`,
		Example: `  loomfs audit query --scope acme/coder/s1 --since 1h
  loomfs audit query --source fuse --result refused --since 2025-06-01T00:00:00Z
  loomfs --json audit query --op workspace_write --path src/ | jq .sha256`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := ff.filter(time.Now())
			if err != nil {
				return err
			}
			p := newAuditPrinter(cmd.OutOrStdout(), g.json, true)
			if err := audit.Query(auditDir(g), f, p.print); err != nil {
				return err
			}
			return p.done()
		},
	}
	ff.register(cmd)
	return cmd
}

func newAuditTailCmd(g *globals) *cobra.Command {
	var ff auditFilterFlags
	var follow bool
	var lines int
	cmd := &cobra.Command{
		Use:   "tail [-f] [-n N] [filters]",
		Short: "Print the last audit records, and with -f follow new ones",
		Long: `Print the last N event records (default 10) that match the filters, oldest
first. With -f, keep printing records as they are appended, across file
rotations and new writers, until interrupted.

Following works by polling, so it also sees records written by other nodes
on a shared root.`,
		Example: `  loomfs audit tail -f
  loomfs audit tail -n 50 --source sandbox
  loomfs --json audit tail -f --result refused`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if lines < 0 {
				return usagef("-n %d: want 0 or more", lines)
			}
			f, err := ff.filter(time.Now())
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			p := newAuditPrinter(cmd.OutOrStdout(), g.json, false)
			err = audit.Tail(ctx, auditDir(g), f, lines, follow, p.print)
			if errors.Is(err, context.Canceled) {
				err = nil
			}
			return err
		},
	}
	ff.register(cmd)
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing records as they are appended")
	cmd.Flags().IntVarP(&lines, "lines", "n", 10, "print the last N matching records first")
	return cmd
}

func newAuditVerifyCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "verify",
		Short: "Check the hash chains of the audit log",
		Long: `Check every writer's chain in the audit directory: sequence numbers, the hash
each record holds of the one before, the checkpoints written at each rotation
and at shutdown, and that no file of a rotation set is missing.

Exits 0 with a summary such as "3 files, 12034 records, chain intact" when
every chain is whole. Exits 1 and prints the first bad record when a record
was edited, dropped, inserted or reordered, or a file was removed. A line cut
short at the very end of a chain (a crash mid-write) is a warning, not a
failure; so is a chain that is still open (its writer is running, or died).

A hash chain has no secret: whoever can rewrite the files can recompute it.
The head hashes that --json prints, kept somewhere else, anchor the chains.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			out, errw := cmd.OutOrStdout(), cmd.ErrOrStderr()
			rep, err := audit.Verify(auditDir(g))
			if err != nil {
				return err
			}
			if g.json {
				enc := json.NewEncoder(out)
				enc.SetEscapeHTML(false)
				if err := enc.Encode(struct {
					OK bool `json:"ok"`
					audit.Report
				}{rep.OK(), rep}); err != nil {
					return err
				}
				if !rep.OK() {
					return exitError{exitRefused}
				}
				return nil
			}
			for _, w := range rep.Warnings {
				fmt.Fprintf(errw, "warning: %s\n", auditText(w.String()))
			}
			if !rep.OK() {
				p := rep.Problems[0]
				fmt.Fprintf(out, "audit log BROKEN: %s\n", auditText(p.String()))
				if p.Text != "" {
					fmt.Fprintf(out, "  record: %s\n", auditText(p.Text))
				}
				if n := len(rep.Problems) + rep.Omitted - 1; n > 0 {
					fmt.Fprintf(out, "%d more problems (--json lists them)\n", n)
				}
				fmt.Fprintln(out, rep)
				return exitError{exitRefused}
			}
			fmt.Fprintln(out, rep)
			return nil
		},
	}
}

// auditFilterFlags are the filters query and tail share.
type auditFilterFlags struct {
	scope, since, until, source, op, path, result string
}

func (ff *auditFilterFlags) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&ff.scope, "scope", "", "scope hash, or SPACE/AGENT/SESSION (main) or SPACE/AGENT/SESSION/RUN/INSTANCE")
	f.StringVar(&ff.since, "since", "", "records at or after: RFC 3339 time, date (2006-01-02) or age (90s, 1h, 7d)")
	f.StringVar(&ff.until, "until", "", "records before: RFC 3339 time, date or age")
	f.StringVar(&ff.source, "source", "", "tool, fuse, sandbox, admin or platform")
	f.StringVar(&ff.op, "op", "", "operation, e.g. workspace_write, create, unlink, container_start")
	f.StringVar(&ff.path, "path", "", "path prefix (matches the path or the new path of a rename)")
	f.StringVar(&ff.result, "result", "", "result: ok, refused, error, started")
}

func (ff *auditFilterFlags) filter(now time.Time) (audit.Filter, error) {
	f := audit.Filter{Scope: ff.scope, Source: audit.Source(ff.source), Op: ff.op, Path: ff.path, Result: ff.result}
	if strings.Contains(ff.scope, "/") {
		parts := strings.Split(ff.scope, "/")
		if (len(parts) != 3 && len(parts) != 5) || strings.Contains("/"+ff.scope+"/", "//") {
			return f, usagef("--scope %q: want a scope hash, SPACE/AGENT/SESSION or SPACE/AGENT/SESSION/RUN/INSTANCE", ff.scope)
		}
	}
	switch f.Source {
	case "", audit.SourceTool, audit.SourceFUSE, audit.SourceSandbox, audit.SourceAdmin, audit.SourcePlatform:
	default:
		return f, usagef("--source %q: want tool, fuse, sandbox, admin or platform", ff.source)
	}
	var err error
	if f.Since, err = auditParseTime("since", ff.since, now); err != nil {
		return f, err
	}
	if f.Until, err = auditParseTime("until", ff.until, now); err != nil {
		return f, err
	}
	return f, nil
}

// auditParseTime reads an RFC 3339 time, a date, or an age before now
// (a Go duration, or whole days as "7d").
func auditParseTime(flag, s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t, nil
	}
	if days, ok := strings.CutSuffix(s, "d"); ok {
		if n, err := strconv.Atoi(days); err == nil && n >= 0 {
			return now.AddDate(0, 0, -n), nil
		}
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, usagef("--%s %q: want an RFC 3339 time, a date (2006-01-02) or an age (90s, 1h, 7d)", flag, s)
}

// auditPrinter prints records as JSON lines, or as a table (query) or one
// plain line each (tail, whose lines must appear as they come).
type auditPrinter struct {
	out   io.Writer
	json  *json.Encoder
	tw    *tabwriter.Writer
	rows  int
	table bool
}

func newAuditPrinter(out io.Writer, asJSON, table bool) *auditPrinter {
	p := &auditPrinter{out: out, table: table}
	if asJSON {
		p.json = json.NewEncoder(out)
		p.json.SetEscapeHTML(false)
	} else if table {
		p.tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	}
	return p
}

var auditHeader = []string{"TIME", "NODE", "SOURCE", "OP", "RESULT", "ACTOR", "PATH", "BYTES", "DURATION"}

func (p *auditPrinter) print(r audit.Record) error {
	if p.json != nil {
		return p.json.Encode(r)
	}
	row := auditRow(r)
	if !p.table {
		_, err := fmt.Fprintln(p.out, strings.Join(row, "  "))
		return err
	}
	if p.rows == 0 {
		fmt.Fprintln(p.tw, strings.Join(auditHeader, "\t"))
	}
	p.rows++
	fmt.Fprintln(p.tw, strings.Join(row, "\t"))
	if p.rows%1000 == 0 { // bound what the table holds in memory
		return p.tw.Flush()
	}
	return nil
}

func (p *auditPrinter) done() error {
	if p.tw == nil {
		return nil
	}
	if p.rows == 0 {
		fmt.Fprintln(p.out, "no matching records")
	}
	return p.tw.Flush()
}

func auditRow(r audit.Record) []string {
	result := r.Result
	if r.Code != "" {
		result += ":" + r.Code
	}
	path := auditCell(r.Path)
	if r.NewPath != "" {
		path += " -> " + auditCell(r.NewPath)
	}
	size, dur := "-", "-"
	if r.Bytes != 0 {
		size = strconv.FormatInt(r.Bytes, 10)
	}
	if r.Duration != 0 {
		dur = r.Duration.Round(time.Microsecond).String()
	}
	return []string{
		r.Time.UTC().Format("2006-01-02T15:04:05.000Z"),
		auditCell(r.Node), auditCell(string(r.Source)), auditCell(r.Op), auditCell(result),
		auditCell(auditActor(r.Actor)), path, size, dur,
	}
}

// auditActor names the scope an actor acted in, and its container if any.
func auditActor(a audit.Actor) string {
	s := strings.Join([]string{a.Space, a.Agent, a.Session}, "/")
	if s == "//" {
		s = ""
	}
	if a.Instance != "" {
		s += "/" + a.Run + "/" + a.Instance
	}
	if a.Container != "" {
		s += "@" + a.Container
	}
	if a.Operator != "" {
		s += " by " + a.Operator
	}
	return s
}

// auditCell quotes a value that could be mistaken for more than one cell or
// line: empty, or holding spaces, quotes, control or invalid characters.
func auditCell(s string) string {
	if s == "" {
		return "-"
	}
	if !utf8.ValidString(s) || strings.IndexFunc(s, func(r rune) bool {
		return r == ' ' || r == '"' || r == '\\' || !unicode.IsPrint(r)
	}) >= 0 {
		return strconv.Quote(s)
	}
	return s
}

// auditText makes text from a damaged log safe to print on a terminal.
func auditText(s string) string {
	if utf8.ValidString(s) && strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) && r != ' ' }) < 0 {
		return s
	}
	q := strconv.Quote(s)
	return q[1 : len(q)-1]
}
