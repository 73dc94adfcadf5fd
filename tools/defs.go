package tools

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/agentloom/loomfs/policy"
)

// Definition is what a model sees of a tool: its name, what it does, and
// the JSON Schema of its input.
type Definition struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"input_schema"`
}

// Tool names (SPEC §4). They are part of the contract.
const (
	List    = "workspace_list"
	Stat    = "workspace_stat"
	Glob    = "workspace_glob"
	Grep    = "workspace_grep"
	Read    = "workspace_read"
	Write   = "workspace_write"
	Edit    = "workspace_edit"
	Mkdir   = "workspace_mkdir"
	Delete  = "workspace_delete"
	Command = "workspace_command"

	// The agent's other tools (patch.go, image.go, changes.go).
	ApplyPatch = "workspace_apply_patch"
	ReadImage  = "workspace_read_image"
	Changes    = "workspace_changes"
	ForkStatus = "workspace_fork_status" // fork.go
	Merge      = "workspace_merge"       // merge.go
)

// Names lists every tool in a stable order.
var Names = []string{List, Stat, Glob, Grep, Read, Write, Edit, Mkdir, Delete, Command, ApplyPatch, ReadImage, Changes, ForkStatus, Merge}

// mutating tools hold the scope lock and are never replayed blind.
var mutating = map[string]bool{Write: true, Edit: true, Mkdir: true, Delete: true, Command: true, ApplyPatch: true}

// Mutating reports whether the named tool changes the workspace.
func Mutating(name string) bool { return mutating[name] }

type prop map[string]any

func schema(required []string, props map[string]prop) json.RawMessage {
	s := map[string]any{
		"type":                 "object",
		"properties":           props,
		"additionalProperties": false,
	}
	if len(required) > 0 {
		s["required"] = required
	}
	b, err := json.Marshal(s)
	if err != nil {
		panic(err)
	}
	return b
}

var (
	pathProp = func(desc string) prop {
		return prop{"type": "string", "description": desc}
	}
	shaProp = prop{"type": "string", "description": "If set, the file must still have this sha256 (from a previous read or stat); \"\" means the file must not exist yet. On a mismatch the call fails with code conflict and the current sha256.", "pattern": "^([0-9a-f]{64})?$"}
)

// Definitions returns every tool's model-visible definition, with the
// limits and path rules of pol written into the descriptions so what a
// model reads is what is enforced.
func Definitions(pol *policy.Policy) []Definition {
	l := pol.Limits
	paths := "Paths are relative to the workspace root, and one ending in \"/\" names a directory; absolute paths, \"..\", symlinks, hard links and special files are refused."
	if pol.EmulatesLinks() {
		paths = "Paths are relative to the workspace root, and one ending in \"/\" names a directory; absolute paths, \"..\", hard links and special files are refused. Symbolic links made by commands are listed with type \"symlink\" and their target, and never followed: use the target's own path."
	}
	if rules := policy.RulesSummary(pol); rules != "" {
		paths += " Path rules in force: " + rules
	}
	// What a change may use, and what needs confirmation, say the same as
	// the workspace README (policy/readme.go).
	quota := policy.QuotaSummary(pol)
	if c := policy.ConfirmSummary(pol); c != "" {
		quota += " " + c
	}
	text := policy.Bytes(l.TextBytes)
	defs := []Definition{
		{List, fmt.Sprintf("List the entries of a workspace directory (name, type, size, mtime, a symlink's target), sorted by name, at most %d per call; truncated says more exist. %s", l.ListEntries, paths),
			schema(nil, map[string]prop{
				"path":  pathProp("Directory to list; default \".\" (the workspace root)."),
				"limit": {"type": "integer", "minimum": 1, "maximum": l.ListEntries, "description": fmt.Sprintf("Most entries to return (default and maximum %d).", l.ListEntries)},
			})},
		{Stat, fmt.Sprintf("Describe one workspace path: type, size, mode, mtime, a symlink's target, and the sha256 of a regular file up to %s. Symlinks and special files are described, never followed. %s", text, paths),
			schema([]string{"path"}, map[string]prop{"path": pathProp("Path to describe.")})},
		{Glob, fmt.Sprintf("Find workspace paths matching a glob pattern (\"*\", \"?\", \"[a-z]\", and \"**\" for any number of directories), sorted, at most %d, within a %s budget per call; truncated says more exist. Never follows symlinks. %s", l.GlobResults, l.GrepBudget, paths),
			schema([]string{"pattern"}, map[string]prop{
				"pattern": {"type": "string", "description": "Glob relative to path, e.g. \"**/*.go\" or \"src/*.py\"."},
				"path":    pathProp("Directory to search from; default \".\"."),
				"limit":   {"type": "integer", "minimum": 1, "maximum": l.GlobResults, "description": fmt.Sprintf("Most paths to return (default and maximum %d).", l.GlobResults)},
			})},
		{Grep, fmt.Sprintf("Search file contents with a regular expression (RE2 syntax; backreferences and lookaround also work, with a %s per-match limit and a %s budget per call). Returns path, line number and line text for at most %d matching lines; skips binary files and files over %s and says how many; reads at most %s in all; truncated says results were cut, and matches_omitted how many matching lines were left out. %s", l.RegexTimeout, l.GrepBudget, l.GrepMatches, text, policy.Bytes(l.GrepScan), paths),
			schema([]string{"pattern"}, map[string]prop{
				"pattern":     {"type": "string", "description": "Regular expression, matched line by line."},
				"path":        pathProp("File or directory to search; default \".\"."),
				"glob":        {"type": "string", "description": "Only search files matching this glob (a name like \"*.go\", or a path pattern with \"/\" and \"**\")."},
				"ignore_case": {"type": "boolean", "description": "Match case-insensitively."},
				"context":     {"type": "integer", "minimum": 0, "maximum": maxContext, "description": "Lines of context before and after each match."},
				"limit":       {"type": "integer", "minimum": 1, "maximum": l.GrepMatches, "description": fmt.Sprintf("Most matching lines to return (default and maximum %d).", l.GrepMatches)},
			})},
		{Read, fmt.Sprintf("Read a text file by line range. Returns content, the whole file's sha256 (pass it as expected_sha256 to write, edit or delete), total_lines and truncated. Files over %s are refused. %s", text, paths),
			schema([]string{"path"}, map[string]prop{
				"path":   pathProp("File to read."),
				"offset": {"type": "integer", "minimum": 1, "description": "First line to return, 1-based; default 1."},
				"limit":  {"type": "integer", "minimum": 1, "description": fmt.Sprintf("Most lines to return; default %d.", defaultReadLines)},
			})},
		{Write, fmt.Sprintf("Create or replace a file with content, atomically (readers see the old file or the new, never a mix). New files are created 0600 and a replaced file keeps its mode; missing parent directories are created (0700, each as workspace_mkdir would) unless parents is false. At most %s. Returns bytes, sha256, created. %s %s", text, paths, quota),
			schema([]string{"path", "content"}, withConfirm(pol, policy.OpWrite, map[string]prop{
				"path":            pathProp("File to write."),
				"content":         {"type": "string", "description": "The whole new content."},
				"expected_sha256": shaProp,
				"parents":         {"type": "boolean", "description": "Create missing parent directories (default true); false refuses with not_found instead."},
			}))},
		{Edit, fmt.Sprintf("Replace exact text in a file, atomically. old_text must occur exactly once unless replace_all is true; zero matches fail with no_match, several with ambiguous_edit (give more surrounding text). Instead of old_text and new_text, edits lists several replacements applied in order to the same file, each to the text the ones before it left (old_text and new_text, if given too, first), all or none: a failing one names its index and why, and nothing is written. Returns replacements and the new sha256. Files over %s are refused. %s %s", text, paths, quota),
			editSchema(schema([]string{"path"}, withConfirm(pol, policy.OpWrite, map[string]prop{
				"path":            pathProp("File to edit."),
				"old_text":        {"type": "string", "minLength": 1, "description": "Exact text to find (whitespace matters)."},
				"new_text":        {"type": "string", "description": "Replacement text; must differ from old_text."},
				"replace_all":     {"type": "boolean", "description": "Replace every occurrence instead of requiring exactly one."},
				"edits":           editsProp,
				"expected_sha256": shaProp,
			})))},
		{Mkdir, fmt.Sprintf("Create a directory (mode 0700). With parents, missing parent directories are created too and an existing directory is not an error. %s %s", paths, quota),
			schema([]string{"path"}, map[string]prop{
				"path":    pathProp("Directory to create."),
				"parents": {"type": "boolean", "description": "Create missing parents; succeed if it exists."},
			})},
		{Delete, strings.TrimSpace(fmt.Sprintf("Delete one file or one empty directory; never recursive. %s %s", paths, policy.ConfirmSummary(pol))),
			schema([]string{"path"}, withConfirm(pol, policy.OpDelete, map[string]prop{
				"path":            pathProp("File or empty directory to delete."),
				"expected_sha256": shaProp,
			}))},
		{Command, fmt.Sprintf("Run a shell command (sh -c) in %s with the workspace at /workspace (the working directory): no network, read-only system, writable /tmp (nosuid, nodev; programs may run from it), non-root user, umask 077. Returns exit_code, stdout, stderr, timed_out, truncation flags and policy_events: each refusal the command met in the workspace (op, path, errno, code, the message a tool would give, count), the first 50 listed, every one counted in total and dropped. Timeout %d–%d s, default %d s; what the command leaves running is killed when it exits. The command sees the same path rules and limits as the tools. %s %s", commandBox(pol), minTimeout, maxTimeout, defaultTimeout, paths, quota),
			schema([]string{"command"}, map[string]prop{
				"command":   {"type": "string", "minLength": 1, "description": "Shell command line."},
				"timeout_s": {"type": "integer", "minimum": minTimeout, "maximum": maxTimeout, "description": fmt.Sprintf("Seconds before the command is killed; default %d.", defaultTimeout)},
			})},
	}
	defs = append(defs, otherDefinitions(pol, paths, quota)...)
	defs = append(defs, forkStatusDefinition(paths), mergeDefinition(pol, paths))
	return append(defs, processDefinitions(pol)...)
}

// commandBox says where workspace_command runs, as the policy's
// "commands" setting says.
func commandBox(pol *policy.Policy) string {
	if pol.SessionCommands() {
		return "this workspace's session sandbox (the container the workspace_process tools use, kept between calls: files a command leaves in /tmp stay for later commands, and it sees the session's processes)"
	}
	return "a fresh sandbox container"
}

// Command timeouts (SPEC §5).
const (
	minTimeout     = 1
	maxTimeout     = 120
	defaultTimeout = 60
)
