package policy

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// The texts below describe a policy in plain words. The workspace README
// (SPEC §6) and the tool descriptions are both made from them, so neither
// can say anything the policy does not enforce.

// ModeWords says what a mode allows, for people and models.
func ModeWords(m Mode) string {
	switch m {
	case ModeRO:
		return "read-only"
	case ModeWO:
		return "write-only (files can be created and written, never read back)"
	case ModeHidden:
		return "hidden (not listed; can't be opened or created)"
	}
	return "read-write"
}

// area is one subtree as the texts show it: its mode and what else the
// policy says of it.
type area struct {
	prefix  string
	mode    Mode
	ruled   bool // has a mode rule of its own
	subtree *Subtree
}

func (p *Policy) areas() []area {
	byPrefix := map[string]*area{}
	get := func(prefix string) *area {
		a, ok := byPrefix[prefix]
		if !ok {
			a = &area{prefix: prefix, mode: p.ModeOf(prefix)}
			byPrefix[prefix] = a
		}
		return a
	}
	for _, r := range p.Rules {
		get(r.Prefix).ruled = true
	}
	for i := range p.Subtrees {
		get(p.Subtrees[i].Prefix).subtree = &p.Subtrees[i]
	}
	var out []area
	for _, a := range byPrefix {
		out = append(out, *a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].prefix < out[j].prefix })
	return out
}

// describe is one line about an area: "tmp/ read-write; holds at most
// 512 MiB and 10000 files; emptied at the end of each run".
func (a area) describe() string {
	name := a.prefix + "/"
	if a.prefix == "." {
		name = "everything else:"
	}
	parts := []string{ModeWords(a.mode)}
	if !a.ruled {
		parts[0] += " (as its parent)"
	}
	if s := a.subtree; s != nil {
		switch {
		case s.MaxBytes > 0 && s.MaxFiles > 0:
			parts = append(parts, fmt.Sprintf("holds at most %s and %d files and directories", Bytes(s.MaxBytes), s.MaxFiles))
		case s.MaxBytes > 0:
			parts = append(parts, fmt.Sprintf("holds at most %s", Bytes(s.MaxBytes)))
		case s.MaxFiles > 0:
			parts = append(parts, fmt.Sprintf("holds at most %d files and directories", s.MaxFiles))
		}
		if len(s.Confirm) > 0 {
			parts = append(parts, confirmWords(s.Confirm)+" a file here needs confirmation")
		}
		if s.Temporary {
			parts = append(parts, "emptied at the end of each run")
		}
		if s.Publish {
			parts = append(parts, "kept as the run's output when the run is published")
		}
	}
	return name + " " + strings.Join(parts, "; ")
}

func confirmWords(ops []Op) string {
	var w []string
	for _, op := range ops {
		if op == OpDelete {
			w = append(w, "deleting")
		} else {
			w = append(w, "overwriting")
		}
	}
	return strings.Join(w, " or ")
}

// minutes writes a whole number of minutes as words ("10 minutes").
func minutes(d time.Duration) string {
	if d%time.Minute != 0 || d < time.Minute {
		return d.String()
	}
	if d == time.Minute {
		return "1 minute"
	}
	return fmt.Sprintf("%d minutes", d/time.Minute)
}

// RulesSummary describes every path rule and subtree in one paragraph, or
// "" when everything is read-write with no subtree rules.
func RulesSummary(p *Policy) string {
	var lines []string
	for _, a := range p.areas() {
		lines = append(lines, a.describe())
	}
	if len(lines) == 0 {
		return ""
	}
	s := strings.Join(lines, ". ") + "."
	if p.ModeOf(".") == ModeRW && !hasRoot(p) {
		s += " Everything else is read-write."
	}
	return s
}

func hasRoot(p *Policy) bool {
	for _, r := range p.Rules {
		if r.Prefix == "." {
			return true
		}
	}
	return false
}

// QuotaSummary states the scope limits: total bytes, file count, the
// per-file limit through the filesystem and the text tools' limit.
func QuotaSummary(p *Policy) string {
	l := p.Limits
	var s []string
	switch {
	case l.ScopeBytes > 0 && l.ScopeFiles > 0:
		s = append(s, fmt.Sprintf("The workspace holds at most %s in at most %d files and directories.", Bytes(l.ScopeBytes), l.ScopeFiles))
	case l.ScopeBytes > 0:
		s = append(s, fmt.Sprintf("The workspace holds at most %s (no limit on the number of files).", Bytes(l.ScopeBytes)))
	case l.ScopeFiles > 0:
		s = append(s, fmt.Sprintf("The workspace holds at most %d files and directories (no limit on total size).", l.ScopeFiles))
	default:
		s = append(s, "The workspace has no quota of its own.")
	}
	if l.FileBytes > 0 {
		s = append(s, fmt.Sprintf("One file written by a command is at most %s.", Bytes(l.FileBytes)))
	}
	s = append(s, fmt.Sprintf("The read, write and edit tools handle files up to %s.", Bytes(l.TextBytes)))
	s = append(s, "A write over a limit is refused up front with quota_exceeded or too_large (EDQUOT or EFBIG in commands), naming the limit and the figures.")
	if r := IOSummary(l); r != "" {
		s = append(s, r)
	}
	if w := p.VolumeWatermark(); !w.IsZero() {
		s = append(s, fmt.Sprintf("This workspace has %s priority: while the shared volume has less than %s free it can't grow (volume_reserved, ENOSPC in commands), and reads, deletes and truncations still work.", p.Class(), w))
	}
	return strings.Join(s, " ")
}

// IOSummary states the scope's I/O rate limits, or "" when it has none.
func IOSummary(l Limits) string {
	var r []string
	if l.IOBytesPerSec > 0 {
		r = append(r, Bytes(l.IOBytesPerSec)+"/s read and written")
	}
	if l.IOOpsPerSec > 0 {
		r = append(r, fmt.Sprintf("%d operations/s", l.IOOpsPerSec))
	}
	if len(r) == 0 {
		return ""
	}
	return "I/O is limited to " + strings.Join(r, " and ") + " (tools and commands together); over the limit it is slowed down, never refused."
}

// ConfirmSummary explains two-step confirmation when the policy marks any
// operation for it, else "".
func ConfirmSummary(p *Policy) string {
	var where []string
	for _, s := range p.Subtrees {
		if len(s.Confirm) > 0 {
			where = append(where, fmt.Sprintf("%s a file in %s/", confirmWords(s.Confirm), s.Prefix))
		}
	}
	if len(where) == 0 {
		return ""
	}
	return fmt.Sprintf("These operations need confirmation: %s. The first call changes nothing and answers confirmation_required with a one-time confirm_token; repeat the same call with the same arguments plus that confirm_token to do it. A token works once, only for that file as it was when the token was given, for %s. Commands can't confirm: there such a delete or overwrite fails with \"Operation not permitted\".", strings.Join(where, "; "), minutes(ConfirmTTL))
}

// WorkspaceReadme is the self-describing README.md of a workspace (SPEC
// §6, seed 001 §7): layout, modes, quotas and confirmation rules of pol, so
// an agent learns its limits by reading one file.
func WorkspaceReadme(pol *Policy) string {
	var b strings.Builder
	b.WriteString("# About this workspace\n\n")
	b.WriteString("This file is generated from the policy loomfs enforces here; it describes exactly the rules in force.\n\n")
	b.WriteString("Give paths relative to the workspace root (in commands, the root is /workspace).\n\n")
	if pol.Readme {
		fmt.Fprintf(&b, "This %s is read-only; loomfs keeps it up to date. In a command, /workspace/%s appears once the workspace passed its health check.\n\n", ReadmeFile, ReadyFile)
	}

	b.WriteString("## Layout and modes\n\n")
	areas := pol.areas()
	if len(areas) == 0 {
		b.WriteString("Every path is read-write; there are no path rules.\n\n")
	} else {
		for _, a := range areas {
			fmt.Fprintf(&b, "- %s\n", a.describe())
		}
		if !hasRoot(pol) {
			b.WriteString("- everything else: read-write\n")
		}
		b.WriteString("\n")
	}

	b.WriteString("## Limits\n\n")
	fmt.Fprintf(&b, "%s\n\n", QuotaSummary(pol))
	l := pol.Limits
	fmt.Fprintf(&b, "Listing shows at most %d entries and glob at most %d paths per call; grep returns at most %d matching lines, reads at most %s per call, and stops a regular expression after %s per match and %s per call. A result that was cut says truncated.\n\n",
		l.ListEntries, l.GlobResults, l.GrepMatches, Bytes(l.GrepScan), l.RegexTimeout, l.GrepBudget)
	fmt.Fprintf(&b, "An image read (workspace_read_image) returns at most %s and reads files up to %s. Processes (workspace_process_start) run in this workspace's session sandbox, which stops after %s with no running process and no call, and %s after it started in any case; each process keeps its last %s of output.\n\n",
		Bytes(l.ImageBytes), Bytes(l.ImageSource), l.SessionIdle, l.SessionLifetime, Bytes(l.ProcessOutput))

	if c := ConfirmSummary(pol); c != "" {
		b.WriteString("## Confirmation\n\n")
		fmt.Fprintf(&b, "%s\n\n", c)
	}

	if pol.EmulatesLinks() {
		b.WriteString("## Symbolic links\n\n")
		b.WriteString("Commands may make symbolic links (ln -s, virtualenvs, node_modules/.bin); inside a command they work as on any filesystem. The tools list them with type \"symlink\" and their target, and never follow them: read or write the target's own path.\n\n")
	}

	if pol.SessionCommands() {
		b.WriteString("## Commands\n\n")
		b.WriteString("Commands (workspace_command) run in this workspace's session sandbox, one container kept between calls: what a command leaves in /tmp stays for later commands until the sandbox ends, and a command sees the session's processes. What a command leaves running is killed when it exits; start it with workspace_process_start to keep it running.\n\n")
	}

	b.WriteString("## Always refused\n\n")
	links := "symlinks"
	if pol.EmulatesLinks() {
		links = "symlinks not made in the workspace"
	}
	fmt.Fprintf(&b, "Absolute paths and \"..\"; %s, hard links, FIFOs, sockets and devices (shown, never followed or opened); setuid, setgid and sticky bits; names starting with \".agentloom-\"", links)
	if pol.MainScope {
		b.WriteString("; a top-level \"subagents\" (reserved for the files of child agents)")
	}
	b.WriteString(". Files are created 0600 and directories 0700.\n")
	return b.String()
}
