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

	"github.com/agentloom/loomfs/nodeid"

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
		Short: "Query, follow, verify and anchor the audit log; make node keys",
		Long: `Read the audit log kept under <root>/.agentloom-audit (SPEC §8; AUDIT.md has
the threat model and the operator's routine).

Every tool call, filesystem mutation or refusal, sandbox container event and
admin command is one JSON record. All loomfs processes of one node append to
the node's chain, <node>.<day>.<n>.jsonl, taking turns under a lock; every
record carries a sequence number and the sha256 of the record before it, so
"loomfs audit verify" finds edited, dropped, inserted or reordered records.
Each node's ledger, <node>.ledger.jsonl, registers every writer and its close,
so a writer removed whole, a cut tail or a writer that ended without closing
is found too. With a node key (audit keygen, $AGENT_LOOM_AUDIT_KEY) writers
sign the ledger's head; "audit anchor" exports every node's head.

The directory is found from --root, or <--data>/workspaces for the local
backend. These commands only read it.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef("unknown command %q for %q: want query, tail, verify, anchor or keygen", args[0], cmd.CommandPath())
			}
			return cmd.Help()
		},
	}
	cmd.AddCommand(newAuditQueryCmd(g), newAuditTailCmd(g), newAuditVerifyCmd(g), newAuditAnchorCmd(g), newAuditKeygenCmd(g))
	return cmd
}

func newAuditQueryCmd(g *globals) *cobra.Command {
	var ff auditFilterFlags
	cmd := &cobra.Command{
		Use:   "query [filters]",
		Short: "Print the audit records that match filters, oldest first",
		Long: `Print the event records that match every given filter, oldest first, merged
across all nodes and rotated files. Checkpoint records are not printed. Only
the files that can hold matches are read (a chain file's name carries its node
and the day of its records), and on a scan longer than a second progress is
printed on stderr.

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
			errw := cmd.ErrOrStderr()
			progress := func(sp audit.ScanProgress) {
				fmt.Fprintf(errw, "loomfs: audit query: %d of %d files, %d of %d MB, %d records read (%s)\n",
					sp.Files, sp.TotalFiles, sp.Bytes>>20, sp.TotalBytes>>20, sp.Records, sp.Elapsed.Round(time.Second))
			}
			if err := audit.QueryWith(auditDir(g), f, progress, p.print); err != nil {
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
	var keysDir, anchorFile string
	var allowCrashed bool
	var newest int
	cmd := &cobra.Command{
		Use:   "verify [--keys DIR] [--anchor FILE] [--allow-crashed]",
		Short: "Check the audit log's chains, ledgers, signatures and anchors",
		Long: `Check every node's chain and ledger: sequence numbers, the hash each record
and ledger entry holds of the one before, the checkpoint at the end of each
rotated file, that every registered writer's records are there up to the head
its node's ledger records, and that every record's writer is registered.
Legacy per-process logs (written before the ledger) are checked as chains.

Exits 0 with a summary such as "3 files, 12034 records, chain intact" when
all is whole. Exits 1 and prints the first problem when a record or ledger
entry was edited, dropped, inserted or reordered, a file or a whole writer was
removed, or a chain's tail was cut. A writer that is gone without closing
(a crash, or its last records and close were cut) is listed on its own and
also exits 1, unless --allow-crashed says you have looked at each one. A line
cut short at the very end of a chain (a crash mid-write) is a warning.

A hash chain has no secret: whoever can rewrite the files can recompute it.
--keys DIR checks every seal (signed checkpoint) against the <node>.pub files
in DIR, so history up to each node's last seal can't be rewritten without
its node key; without --keys the log is only chained, and verify says so.
--anchor FILE checks that the log still extends every head in FILE (written
by "loomfs audit anchor"), so even a replaced audit directory is caught.
--anchor s3://BUCKET/PREFIX reads the newest --anchor-newest anchors written
there by "loomfs audit anchor --to s3://..." (every stored version: a later
object under the same key, or a delete marker, hides none) and checks them
the same way. The endpoint and credentials are those of the object store
(see "loomfs audit anchor --help").`,
		Example: `  loomfs audit verify
  loomfs audit verify --keys /etc/loomfs/audit-trust --anchor /srv/anchors/audit.jsonl
  loomfs --json audit verify --allow-crashed | jq .ended_without_closing
  loomfs audit verify --keys /etc/loomfs/audit-trust --anchor s3://loomfs-anchors/team-v1`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			out, errw := cmd.OutOrStdout(), cmd.ErrOrStderr()
			var opts audit.VerifyOptions
			if keysDir != "" {
				keys, err := audit.LoadTrustedKeys(keysDir)
				if err != nil {
					return usagef("--keys %s: %v", keysDir, err)
				}
				opts.Keys = keys
			}
			if strings.HasPrefix(anchorFile, "s3://") {
				as, err := readS3Anchors(cmd.Context(), anchorFile, newest)
				if err != nil {
					return refuse(cmd, g, err)
				}
				opts.Anchors = as
			} else if anchorFile != "" {
				f, err := os.Open(anchorFile)
				if err != nil {
					return usagef("--anchor: %v", err)
				}
				opts.Anchors, err = audit.ReadAnchors(f)
				f.Close()
				if err != nil {
					return usagef("--anchor %s: %v", anchorFile, err)
				}
			}
			rep, err := audit.VerifyWith(auditDir(g), opts)
			if err != nil {
				return err
			}
			clean := rep.Clean(allowCrashed)
			if g.json {
				enc := json.NewEncoder(out)
				enc.SetEscapeHTML(false)
				if err := enc.Encode(struct {
					OK bool `json:"ok"`
					audit.Report
				}{clean, rep}); err != nil {
					return err
				}
				if !clean {
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
			}
			for _, c := range rep.Crashed {
				fmt.Fprintf(out, "%s\n", auditText(c.String()))
			}
			fmt.Fprintln(out, rep)
			switch {
			case rep.Signed && rep.OK():
				fmt.Fprintln(out, "signed: every node's seals verify against --keys")
			case !rep.Signed:
				fmt.Fprintln(out, "only chained, not signed: give --keys DIR to check the nodes' signatures")
			}
			if rep.Anchored > 0 && rep.OK() {
				fmt.Fprintf(out, "anchored: the log extends all %d anchored heads\n", rep.Anchored)
			}
			if len(rep.Crashed) > 0 && rep.OK() && !allowCrashed {
				fmt.Fprintf(out, "writers that ended without closing: %d; check each (a crash of that process, or its tail was cut), then --allow-crashed\n", len(rep.Crashed))
			}
			if !clean {
				return exitError{exitRefused}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&keysDir, "keys", "", "directory of trusted node public keys (<node>.pub) to check every seal against")
	cmd.Flags().StringVar(&anchorFile, "anchor", "", "file of anchors (loomfs audit anchor), or s3://BUCKET/PREFIX, the log must still extend")
	cmd.Flags().IntVar(&newest, "anchor-newest", 10, "with --anchor s3://..., how many of the newest anchors to check (0: all)")
	cmd.Flags().BoolVar(&allowCrashed, "allow-crashed", false, "exit 0 even if writers ended without closing (once you have looked at each)")
	return cmd
}

func newAuditAnchorCmd(g *globals) *cobra.Command {
	var to, sock, retain string
	cmd := &cobra.Command{
		Use:   "anchor [--to FILE | --to s3://BUCKET/PREFIX --retain DURATION] [--syslog SOCKET]",
		Short: "Print every node's current audit heads, to keep outside the volume",
		Long: `Print one JSON line holding every node's current head: its ledger's last entry
and its chain's last record (seq and hash), and its last seal, signed if the
node has a key. Kept where nobody who can write the shared volume can reach
(another host, a write-once bucket, a remote syslog), it lets
"loomfs audit verify --anchor FILE" prove that the log still extends each
head: a deleted, cut or replaced audit directory is caught.

--to FILE appends the line to FILE (created 0600); --syslog SOCKET sends it
to a syslog unix socket (e.g. /dev/log, or the one your forwarder listens on).
The line is printed on stdout too.

--to s3://BUCKET/PREFIX writes the anchor as a new object under
PREFIX/anchors/ in BUCKET, which must have been created with S3 Object Lock
enabled, in compliance mode until --retain from now (e.g. 2160h or 90d): until
then no one, not the volume's administrator nor the bucket's owner, can delete
or overwrite that version. ` + s3Help,
		Example: `  loomfs audit anchor --to /mnt/anchors/loomfs-audit.jsonl
  loomfs audit anchor --syslog /dev/log
  loomfs audit anchor | ssh auditor@vault 'cat >> loomfs-anchors.jsonl'
  loomfs audit anchor --to s3://loomfs-anchors/team-v1 --retain 400d`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			s3to := strings.HasPrefix(to, "s3://")
			var keep time.Duration
			switch {
			case s3to && retain == "":
				return usagef("--to s3://... needs --retain DURATION: how long no one may delete or replace the anchor")
			case s3to:
				d, err := parseRetention(retain)
				if err != nil {
					return usagef("--retain: %v", err)
				}
				keep = d
			case retain != "":
				return usagef("--retain applies to --to s3://... only")
			}
			a, err := audit.Heads(auditDir(g), time.Now())
			if err != nil {
				return err
			}
			if len(a.Heads) == 0 {
				return fmt.Errorf("no node ledger in the audit directory: nothing to anchor")
			}
			line, err := json.Marshal(a)
			if err != nil {
				return err
			}
			line = append(line, '\n')
			if s3to {
				key, err := putS3Anchor(cmd.Context(), to, a, keep)
				if err != nil {
					return refuse(cmd, g, err)
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "anchored in %s, locked until %s\n", key, time.Now().Add(keep).UTC().Format(time.RFC3339))
			} else if to != "" {
				if err := appendAnchor(to, line); err != nil {
					return err
				}
			}
			if sock != "" {
				if err := audit.SendSyslog(sock, line); err != nil {
					return err
				}
			}
			_, err = cmd.OutOrStdout().Write(line)
			return err
		},
	}
	cmd.Flags().StringVar(&to, "to", "", "append the anchor to FILE, or write it to s3://BUCKET/PREFIX under Object Lock")
	cmd.Flags().StringVar(&retain, "retain", "", "with --to s3://..., the compliance retention: a Go duration or a number of days (90d)")
	cmd.Flags().StringVar(&sock, "syslog", "", "send the anchor to the syslog unix socket SOCKET")
	return cmd
}

func appendAnchor(name string, line []byte) error {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("anchor file: %w", err)
	}
	if _, err := f.Write(line); err != nil {
		f.Close()
		return fmt.Errorf("anchor file: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("anchor file: %w", err)
	}
	return f.Close()
}

func newAuditKeygenCmd(g *globals) *cobra.Command {
	var dir, node string
	cmd := &cobra.Command{
		Use:   "keygen --dir DIR [--node NODE]",
		Short: "Make a node's audit signing key",
		Long: `Make an ed25519 key pair for a node's audit seals: DIR/<node>.key (0600, the
private key: keep it on the node, outside the shared volume, readable by root
only) and DIR/<node>.pub (the public key: copy it to the trusted key
directory of everyone who runs "loomfs audit verify --keys"). An existing key
is never replaced.

Point the node's loomfs processes at the key with AGENT_LOOM_AUDIT_KEY=DIR/<node>.key;
they then sign their node's ledger head at every rotation, at every close and
every few minutes. --node defaults to the host name, the node name the audit
log uses.`,
		Example: `  loomfs audit keygen --dir /etc/loomfs/audit-key
  scp /etc/loomfs/audit-key/$(hostname).pub auditor@vault:/etc/loomfs/audit-trust/`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if dir == "" {
				return usagef("--dir is required: where to write the key (outside the shared volume)")
			}
			if node == "" {
				h, err := nodeid.Name()
				if err != nil {
					return err
				}
				node = h
			}
			priv, pub, err := audit.GenerateKey(dir, node)
			if err != nil {
				return err
			}
			if g.json {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(map[string]string{"node": node, "private": priv, "public": pub})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "private key %s (keep on this node; AGENT_LOOM_AUDIT_KEY=%s)\npublic key  %s (copy to every verifier's --keys directory)\n", priv, priv, pub)
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "directory to write <node>.key and <node>.pub to (created 0700)")
	cmd.Flags().StringVar(&node, "node", "", "node name (default: the host name)")
	return cmd
}

// auditFilterFlags are the filters query and tail share.
type auditFilterFlags struct {
	scope, since, until, source, op, path, result, node, trace string
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
	f.StringVar(&ff.node, "node", "", "records of this node only")
	f.StringVar(&ff.trace, "trace", "", "records of this trace id (32 hex digits) only: a call end to end, through every door")
}

func (ff *auditFilterFlags) filter(now time.Time) (audit.Filter, error) {
	f := audit.Filter{Scope: ff.scope, Source: audit.Source(ff.source), Op: ff.op, Path: ff.path, Result: ff.result, Node: ff.node, Trace: strings.ToLower(ff.trace)}
	if f.Trace != "" && !validTraceID(f.Trace) {
		return f, usagef("--trace %q: want a trace id, 32 hex digits (the second field of a traceparent)", ff.trace)
	}
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

// validTraceID reports whether id is a W3C trace id: 32 lowercase hex
// digits, not all zero.
func validTraceID(id string) bool {
	if len(id) != 32 || strings.Trim(id, "0") == "" {
		return false
	}
	for _, c := range id {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}
