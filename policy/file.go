package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// A policy file is YAML (SPEC §3.3). Every key is optional; an unknown key
// is refused, so a typo never silently leaves a rule out:
//
//	version: 1              # the only version
//	preset: standard        # start from a built-in policy: open (default) or standard
//	rules:                  # one entry per subtree; the longest matching prefix gives the mode
//	  - path: output/
//	    mode: wo            # rw, ro, wo or hidden; omitted: the enclosing rule's mode
//	    confirm: [delete, overwrite]
//	  - path: reports/
//	    mode: ro
//	    create: false       # don't make the directory at first use (the default is to make it)
//	  - path: tmp/
//	    mode: rw
//	    max_bytes: 512 MiB  # cap on what the subtree holds
//	    max_files: 10000
//	    clear_at_run_end: true
//	  - path: dist/
//	    publish: true       # a run's output: "runs finish --publish" copies it to the object store
//	                        # (no rule says so: output/)
//	symlinks: emulate       # or refuse: programs in the projection can't make symbolic links
//	cache: journal-dirs     # or journal: every opendir and owner-bit check in the daemon; strict: one-second kernel caching, for stores changed behind loomfs's back
//	commands: fresh         # or session: each workspace_command is an exec in the scope's session sandbox
//	agent_merge: false      # true: an agent in a fork may merge it back itself (workspace_merge)
//	archive_before_reclaim: false  # true: gc keeps what the object store has no verified archive of
//	limits:
//	  text_bytes: 2 MiB     # largest file the read and write tools handle
//	  file_bytes: 1 GiB     # largest file through the filesystem
//	  scope_bytes: 5 GiB    # or "unlimited"
//	  scope_files: 100000
//	  session_idle: 10m     # a session sandbox with no process and no call ends (SPEC §5.1)
//	  session_lifetime: 2h  # a session sandbox ends this long after it started, whatever runs
//	  process_output_bytes: 1 MiB  # output kept per process for workspace_process_read
//	  io_bytes_per_s: 50 MiB  # per scope, both doors; over it I/O is delayed, never refused
//	  io_ops_per_s: 5000      # filesystem requests and tool calls per second
//	priority: normal        # class of a scope no run gives one: low, normal or high
//	limits_by_priority:     # a class's limits, laid over limits
//	  high:
//	    scope_bytes: 20 GiB
//	  low:
//	    scope_bytes: 1 GiB
//	volume_reserve_low: 10%      # below this much free room low scopes can't grow
//	volume_reserve_normal: 2 GiB # nor normal ones below this; high ones go on
//	hooks:                  # command hooks of the tool door (Claude Code's shape)
//	  before:
//	    - tools: [workspace_write, workspace_apply_patch]  # omitted: every tool
//	      command: [/usr/local/bin/check-call, --strict]   # no shell unless sh -c
//	      timeout: 5s
//	      rewrite: false     # true: stdout may give the call new arguments
//	  after:
//	    - command: [sh, -c, "cat >> /var/log/calls.jsonl"]
//
// The search limits (list_entries, glob_results, grep_matches, grep_scan,
// grep_line, regex_timeout, grep_budget, walk_entries) and the image limits
// (image_bytes: the most workspace_read_image returns, default 4 MiB;
// image_source_bytes: the largest file it reads, default 64 MiB) may be
// set too. An
// entry of rules replaces the preset's entry for the same path; a limit
// replaces the preset's value. Every rule's path is a directory a scope
// gets at first use (Policy.Layout), unless the rule says create: false.

// MaxFileBytes bounds the size of a policy file.
const MaxFileBytes = 1 << 20

// FileError is a policy file refused at start: the file, the line and the
// reason.
type FileError struct {
	File   string
	Line   int // 0 when the problem is the file as a whole
	Reason string
	Err    error // what reading it failed with, if that was the problem
}

func (e *FileError) Unwrap() error { return e.Err }

func (e *FileError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("policy %s:%d: %s", e.File, e.Line, e.Reason)
	}
	return fmt.Sprintf("policy %s: %s", e.File, e.Reason)
}

// Load reads and parses the policy file at path.
func Load(path string) (*Policy, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, &FileError{File: path, Reason: fmt.Sprintf("can't read it: %v", errors.Unwrap(err)), Err: err}
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, &FileError{File: path, Reason: fmt.Sprintf("can't read it: %v", err), Err: err}
	}
	if len(b) > MaxFileBytes {
		return nil, &FileError{File: path, Reason: fmt.Sprintf("over %s; a policy file is a few lines", Bytes(MaxFileBytes))}
	}
	return Parse(path, b)
}

// Parse parses a policy file's content; name is used in errors.
func Parse(name string, data []byte) (*Policy, error) {
	fail := func(line int, format string, args ...any) error {
		return &FileError{File: name, Line: line, Reason: fmt.Sprintf(format, args...)}
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if err == io.EOF {
			return nil, fail(0, "the file is empty; write at least \"preset: open\"")
		}
		return nil, yamlError(name, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err != io.EOF {
		if err != nil {
			return nil, yamlError(name, err)
		}
		return nil, fail(extra.Line, "a second YAML document; a policy file holds one")
	}
	p := &parser{name: name}
	pol, err := p.file(&doc)
	if err != nil {
		return nil, err
	}
	return pol, nil
}

var yamlLine = regexp.MustCompile(`^yaml: (?:line (\d+): )?(.*)$`)

// yamlError turns a YAML syntax error into a FileError with its line.
func yamlError(name string, err error) error {
	msg := err.Error()
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		// The YAML parser names the line where the construct holding the
		// error begins, which can be a line or two above it.
		reason := "not valid YAML: " + m[2]
		if line > 0 {
			reason = "not valid YAML (at or below this line): " + m[2]
		}
		return &FileError{File: name, Line: line, Reason: reason}
	}
	return &FileError{File: name, Reason: "not valid YAML: " + msg}
}

type parser struct{ name string }

func (p *parser) errf(n *yaml.Node, format string, args ...any) error {
	return &FileError{File: p.name, Line: n.Line, Reason: fmt.Sprintf(format, args...)}
}

// mapping walks the keys of a mapping node in order, refusing duplicate
// and unknown keys (with the list of known ones).
func (p *parser) mapping(n *yaml.Node, what string, known []string, fn func(key string, k, v *yaml.Node) error) error {
	n = deref(n)
	if n.Kind != yaml.MappingNode {
		return p.errf(n, "%s must be a mapping of keys to values", what)
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := deref(n.Content[i]), deref(n.Content[i+1])
		key := k.Value
		if k.Kind != yaml.ScalarNode {
			return p.errf(k, "%s: keys must be plain names", what)
		}
		if !contains(known, key) {
			return p.errf(k, "%s: unknown key %q (known: %s)", what, key, strings.Join(known, ", "))
		}
		if seen[key] {
			return p.errf(k, "%s: key %q given twice", what, key)
		}
		seen[key] = true
		if err := fn(key, k, v); err != nil {
			return err
		}
	}
	return nil
}

func deref(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		return deref(n.Content[0])
	}
	return n
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// entry is one item of rules as written.
type entry struct {
	line    int
	mode    Mode // "" when not given
	subtree Subtree
	noMake  bool // create: false
}

func (p *parser) file(doc *yaml.Node) (*Policy, error) {
	root := deref(doc)
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return nil, p.errf(root, "the file is empty; write at least \"preset: open\"")
	}
	var (
		preset     = "open"
		presetNode *yaml.Node
		entries    []entry
		limitsNode *yaml.Node
		readme     *bool
		symlinks   Symlinks
		cache      Cache
		commands   Commands
		priority   Priority
		byPriority *yaml.Node
		reserve    = map[string]Watermark{}
		hooks      Hooks
		agentMerge *bool
		archive    *bool
	)
	known := []string{"version", "preset", "rules", "limits", "readme", "symlinks", "cache", "commands",
		"priority", "limits_by_priority", "volume_reserve_low", "volume_reserve_normal", "hooks", "agent_merge", "archive_before_reclaim"}
	err := p.mapping(root, "the policy file", known, func(key string, k, v *yaml.Node) error {
		switch key {
		case "version":
			if v.Kind != yaml.ScalarNode || v.Value != "1" {
				return p.errf(v, "version %q is not supported; this loomfs reads version 1", v.Value)
			}
		case "preset":
			s, err := p.str(v, "preset")
			if err != nil {
				return err
			}
			preset, presetNode = s, v
		case "rules":
			es, err := p.rules(v)
			if err != nil {
				return err
			}
			entries = es
		case "limits":
			limitsNode = v
		case "readme":
			var b bool
			if v.Kind != yaml.ScalarNode || v.Decode(&b) != nil {
				return p.errf(v, "readme must be true or false")
			}
			readme = &b
		case "agent_merge":
			var b bool
			if v.Kind != yaml.ScalarNode || v.Decode(&b) != nil {
				return p.errf(v, "agent_merge must be true or false")
			}
			agentMerge = &b
		case "archive_before_reclaim":
			var b bool
			if v.Kind != yaml.ScalarNode || v.Decode(&b) != nil {
				return p.errf(v, "archive_before_reclaim must be true or false")
			}
			archive = &b
		case "symlinks":
			s, err := p.str(v, "symlinks")
			if err != nil {
				return err
			}
			symlinks = Symlinks(s)
			if symlinks != SymlinksEmulate && symlinks != SymlinksRefuse {
				return p.errf(v, "symlinks %q is not one of emulate, refuse", s)
			}
		case "cache":
			s, err := p.str(v, "cache")
			if err != nil {
				return err
			}
			cache = Cache(s)
			if cache != CacheJournal && cache != CacheStrict && cache != CacheKernelDirs {
				return p.errf(v, "cache %q is not one of journal-dirs, journal, strict", s)
			}
		case "commands":
			s, err := p.str(v, "commands")
			if err != nil {
				return err
			}
			commands = Commands(s)
			if commands != CommandsFresh && commands != CommandsSession {
				return p.errf(v, "commands %q is not one of fresh, session", s)
			}
		case "priority":
			s, err := p.str(v, "priority")
			if err != nil {
				return err
			}
			if priority, err = ParsePriority(s); err != nil || s == "" {
				return p.errf(v, "priority %q is not one of low, normal, high", s)
			}
		case "limits_by_priority":
			byPriority = v
		case "volume_reserve_low", "volume_reserve_normal":
			s, err := p.str(v, key)
			if err != nil {
				return err
			}
			w, err := ParseWatermark(s)
			if err != nil {
				return p.errf(v, "%s: %v (write e.g. 10%% or 2 GiB)", key, err)
			}
			reserve[key] = w
		case "hooks":
			h, err := p.hooks(v)
			if err != nil {
				return err
			}
			hooks = h
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	pol, ok := Preset(preset)
	if !ok {
		return nil, p.errf(presetNode, "unknown preset %q (known: %s)", preset, strings.Join(PresetNames(), ", "))
	}
	if limitsNode != nil {
		if err := p.limits(limitsNode, &pol.Limits); err != nil {
			return nil, err
		}
	}
	if byPriority != nil {
		if err := p.limitsByPriority(byPriority, pol); err != nil {
			return nil, err
		}
	}
	low, normal := reserve["volume_reserve_low"], reserve["volume_reserve_normal"]
	if (low.Percent > 0) == (normal.Percent > 0) && low.Of(100) < normal.Of(100) {
		return nil, p.errf(root, "volume_reserve_low (%s) is less than volume_reserve_normal (%s): low-priority work must stop first", low, normal)
	}
	pol.VolumeReserveLow, pol.VolumeReserveNormal = low, normal
	pol.Priority = priority
	pol.Hooks = hooks
	if err := p.merge(pol, entries); err != nil {
		return nil, err
	}
	if readme != nil {
		pol.Readme = *readme
	}
	if symlinks != "" {
		pol.Symlinks = symlinks
	}
	if agentMerge != nil {
		pol.AgentMerge = *agentMerge
	}
	if archive != nil {
		pol.ArchiveBeforeReclaim = *archive
	}
	if cache != "" {
		pol.Cache = cache
	}
	if commands != "" {
		pol.Commands = commands
	}
	return pol, nil
}

// limitsByPriority reads limits_by_priority: each class's keys laid over
// the file's limits. A class the file does not name keeps those.
func (p *parser) limitsByPriority(n *yaml.Node, pol *Policy) error {
	by := map[Priority]Limits{}
	for _, c := range Priorities {
		by[c] = pol.Limits
	}
	err := p.mapping(n, "limits_by_priority", []string{"low", "normal", "high"}, func(key string, k, v *yaml.Node) error {
		l := by[Priority(key)]
		if err := p.limits(v, &l); err != nil {
			return err
		}
		by[Priority(key)] = l
		return nil
	})
	pol.LimitsByPriority = by
	return err
}

// hooks reads the hooks section: before and after, each a list of
// command hooks.
func (p *parser) hooks(n *yaml.Node) (Hooks, error) {
	var h Hooks
	err := p.mapping(n, "hooks", []string{"before", "after"}, func(key string, k, v *yaml.Node) error {
		if v.Kind != yaml.SequenceNode {
			return p.errf(v, "hooks.%s must be a list of entries like \"- command: [program, arg]\"", key)
		}
		for _, item := range v.Content {
			c, err := p.hook(deref(item), key)
			if err != nil {
				return err
			}
			if key == "before" {
				h.Before = append(h.Before, c)
			} else {
				h.After = append(h.After, c)
			}
		}
		return nil
	})
	return h, err
}

func (p *parser) hook(n *yaml.Node, when string) (HookCommand, error) {
	var c HookCommand
	known := []string{"tools", "command", "timeout"}
	if when == "before" {
		known = append(known, "rewrite")
	}
	list := func(v *yaml.Node, what string) ([]string, error) {
		if v.Kind != yaml.SequenceNode || len(v.Content) == 0 {
			return nil, p.errf(v, "%s must be a non-empty list, e.g. [workspace_write]", what)
		}
		var out []string
		for _, x := range v.Content {
			s, err := p.str(deref(x), what)
			if err != nil {
				return nil, err
			}
			if s == "" {
				return nil, p.errf(x, "%s: an empty entry", what)
			}
			out = append(out, s)
		}
		return out, nil
	}
	err := p.mapping(n, "a hook", known, func(key string, k, v *yaml.Node) error {
		var err error
		switch key {
		case "tools":
			c.Tools, err = list(v, "tools")
		case "command":
			c.Command, err = list(v, "command")
		case "timeout":
			c.Timeout, err = p.duration(v, "timeout")
		case "rewrite":
			c.Rewrite, err = p.boolean(v, "rewrite")
		}
		return err
	})
	if err != nil {
		return c, err
	}
	if len(c.Command) == 0 {
		return c, p.errf(n, "a hook needs a command, e.g. \"command: [/usr/local/bin/check, --strict]\" (no shell unless you write [sh, -c, ...])")
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultHookTimeout
	}
	return c, nil
}

func (p *parser) str(n *yaml.Node, what string) (string, error) {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		return "", p.errf(n, "%s must be a single value", what)
	}
	return n.Value, nil
}

func (p *parser) rules(n *yaml.Node) ([]entry, error) {
	if n.Kind != yaml.SequenceNode {
		return nil, p.errf(n, "rules must be a list of entries like \"- path: data/\" with \"mode: ro\"")
	}
	var out []entry
	seen := map[string]int{}
	for _, item := range n.Content {
		item = deref(item)
		e := entry{line: item.Line}
		var pathNode *yaml.Node
		known := []string{"path", "mode", "max_bytes", "max_files", "confirm", "clear_at_run_end", "publish", "create"}
		err := p.mapping(item, "a rule", known, func(key string, k, v *yaml.Node) error {
			var err error
			switch key {
			case "path":
				pathNode = v
				e.subtree.Prefix, err = p.str(v, "path")
			case "mode":
				var s string
				if s, err = p.str(v, "mode"); err == nil {
					e.mode = Mode(s)
					switch e.mode {
					case ModeRW, ModeRO, ModeWO, ModeHidden:
					default:
						err = p.errf(v, "mode %q is not one of rw, ro, wo, hidden", s)
					}
				}
			case "max_bytes":
				e.subtree.MaxBytes, err = p.size(v, "max_bytes", true)
			case "max_files":
				e.subtree.MaxFiles, err = p.count(v, "max_files", true)
			case "confirm":
				e.subtree.Confirm, err = p.confirm(v)
			case "clear_at_run_end":
				e.subtree.Temporary, err = p.boolean(v, "clear_at_run_end")
			case "publish":
				e.subtree.Publish, err = p.boolean(v, "publish")
			case "create":
				var mk bool
				mk, err = p.boolean(v, "create")
				e.noMake = !mk
			}
			return err
		})
		if err != nil {
			return nil, err
		}
		if pathNode == nil {
			return nil, p.errf(item, "a rule needs a path, e.g. \"path: data/\"")
		}
		prefix, err := CleanPath(e.subtree.Prefix, false)
		if err != nil {
			return nil, p.errf(pathNode, "path %q: %s", e.subtree.Prefix, AsError(err).Message)
		}
		if prefix == "." && (e.subtree.Capped() || len(e.subtree.Confirm) > 0 || e.subtree.Temporary || e.subtree.Publish) {
			return nil, p.errf(pathNode, "the workspace root takes only a mode; its size is set by limits.scope_bytes and limits.scope_files")
		}
		if first, dup := seen[prefix]; dup {
			return nil, p.errf(pathNode, "path %q has a rule already (line %d); give each subtree one entry", e.subtree.Prefix, first)
		}
		seen[prefix] = item.Line
		e.subtree.Prefix = prefix
		if e.mode == "" && !e.subtree.Capped() && len(e.subtree.Confirm) == 0 && !e.subtree.Temporary && !e.subtree.Publish {
			return nil, p.errf(item, "the rule for %q says nothing: give a mode, a cap, confirm, clear_at_run_end or publish", prefix)
		}
		out = append(out, e)
	}
	return out, nil
}

func (p *parser) confirm(n *yaml.Node) ([]Op, error) {
	if n.Kind != yaml.SequenceNode {
		return nil, p.errf(n, "confirm must be a list, e.g. [delete, overwrite]")
	}
	var ops []Op
	for _, c := range n.Content {
		c = deref(c)
		s, err := p.str(c, "confirm")
		if err != nil {
			return nil, err
		}
		op, ok := ConfirmOp(s)
		if !ok {
			return nil, p.errf(c, "confirm %q: want delete or overwrite", s)
		}
		for _, have := range ops {
			if have == op {
				return nil, p.errf(c, "confirm %q given twice", s)
			}
		}
		ops = append(ops, op)
	}
	return ops, nil
}

func (p *parser) boolean(n *yaml.Node, what string) (bool, error) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!bool" {
		var b bool
		if err := n.Decode(&b); err == nil {
			return b, nil
		}
	}
	return false, p.errf(n, "%s must be true or false, not %q", what, n.Value)
}

// merge lays the file's rules over the preset's: an entry for a path the
// preset also names replaces it whole.
func (p *parser) merge(pol *Policy, entries []entry) error {
	rules := map[string]Rule{}
	subs := map[string]Subtree{}
	var order []string
	for _, r := range pol.Rules {
		rules[r.Prefix] = r
		order = append(order, r.Prefix)
	}
	for _, s := range pol.Subtrees {
		subs[s.Prefix] = s
		if _, ok := rules[s.Prefix]; !ok {
			order = append(order, s.Prefix)
		}
	}
	for _, e := range entries {
		prefix := e.subtree.Prefix
		if _, ok := rules[prefix]; !ok {
			if _, ok := subs[prefix]; !ok {
				order = append(order, prefix)
			}
		}
		delete(rules, prefix)
		delete(subs, prefix)
		if e.mode != "" {
			rules[prefix] = Rule{Prefix: prefix, Mode: e.mode}
		}
		if e.subtree.Capped() || len(e.subtree.Confirm) > 0 || e.subtree.Temporary || e.subtree.Publish {
			subs[prefix] = e.subtree
		}
	}
	layout := map[string]bool{}
	for _, d := range pol.Layout {
		layout[d] = true
	}
	for _, e := range entries {
		layout[e.subtree.Prefix] = !e.noMake && e.subtree.Prefix != "."
	}
	var dirs []string
	for d, ok := range layout {
		if ok {
			dirs = append(dirs, d)
		}
	}
	if err := pol.SetLayout(dirs); err != nil {
		return &FileError{File: p.name, Reason: err.Error()}
	}
	var rs []Rule
	var ss []Subtree
	for _, prefix := range order {
		if r, ok := rules[prefix]; ok {
			rs = append(rs, r)
		}
		if s, ok := subs[prefix]; ok {
			ss = append(ss, s)
		}
	}
	if err := pol.SetRules(rs); err != nil {
		return &FileError{File: p.name, Reason: err.Error()}
	}
	if err := pol.SetSubtrees(ss); err != nil {
		return &FileError{File: p.name, Reason: err.Error()}
	}
	return nil
}

func (p *parser) limits(n *yaml.Node, l *Limits) error {
	// The keys Limits.Keys shows, so none is taken and never shown.
	var known []string
	for _, k := range l.Keys() {
		known = append(known, k.Name)
	}
	return p.mapping(n, "limits", known, func(key string, k, v *yaml.Node) error {
		var err error
		switch key {
		case "text_bytes":
			l.TextBytes, err = p.size(v, key, false)
		case "file_bytes":
			l.FileBytes, err = p.size(v, key, true)
		case "scope_bytes":
			l.ScopeBytes, err = p.size(v, key, true)
		case "scope_files":
			l.ScopeFiles, err = p.count(v, key, true)
		case "grep_scan":
			l.GrepScan, err = p.size(v, key, false)
		case "image_bytes":
			l.ImageBytes, err = p.size(v, key, false)
		case "image_source_bytes":
			l.ImageSource, err = p.size(v, key, false)
		case "list_entries", "glob_results", "grep_matches", "walk_entries":
			var c int64
			c, err = p.count(v, key, false)
			dst := map[string]*int{"list_entries": &l.ListEntries, "glob_results": &l.GlobResults, "grep_matches": &l.GrepMatches, "walk_entries": &l.WalkEntries}[key]
			*dst = int(c)
		case "grep_line":
			var c int64
			c, err = p.size(v, key, false)
			l.GrepLine = int(c)
		case "regex_timeout":
			l.RegexTimeout, err = p.duration(v, key)
		case "grep_budget":
			l.GrepBudget, err = p.duration(v, key)
		case "session_idle":
			l.SessionIdle, err = p.duration(v, key)
		case "session_lifetime":
			l.SessionLifetime, err = p.duration(v, key)
		case "process_output_bytes":
			l.ProcessOutput, err = p.size(v, key, false)
		case "io_bytes_per_s":
			l.IOBytesPerSec, err = p.size(v, key, true)
		case "io_ops_per_s":
			l.IOOpsPerSec, err = p.count(v, key, true)
		}
		return err
	})
}

// size reads a byte size: a number of bytes or "2MiB", "5 GiB", "1.5 GB";
// with unlimited allowed, "unlimited" gives 0.
func (p *parser) size(n *yaml.Node, what string, unlimited bool) (int64, error) {
	s, err := p.str(n, what)
	if err != nil {
		return 0, err
	}
	if unlimited && s == "unlimited" {
		return 0, nil
	}
	v, err := ParseBytes(s)
	if err != nil {
		return 0, p.errf(n, "%s: %v", what, err)
	}
	if v == 0 {
		if unlimited {
			return 0, p.errf(n, "%s: 0 would refuse everything; write \"unlimited\" for no limit", what)
		}
		return 0, p.errf(n, "%s must be more than 0", what)
	}
	return v, nil
}

func (p *parser) count(n *yaml.Node, what string, unlimited bool) (int64, error) {
	s, err := p.str(n, what)
	if err != nil {
		return 0, err
	}
	if unlimited && s == "unlimited" {
		return 0, nil
	}
	v, err := strconv.ParseInt(strings.ReplaceAll(s, "_", ""), 10, 64)
	if err != nil || v < 0 || v > math.MaxInt32 {
		return 0, p.errf(n, "%s: %q is not a whole number from 1 to %d", what, s, math.MaxInt32)
	}
	if v == 0 {
		if unlimited {
			return 0, p.errf(n, "%s: 0 would refuse everything; write \"unlimited\" for no limit", what)
		}
		return 0, p.errf(n, "%s must be more than 0", what)
	}
	return v, nil
}

func (p *parser) duration(n *yaml.Node, what string) (time.Duration, error) {
	s, err := p.str(n, what)
	if err != nil {
		return 0, err
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, p.errf(n, "%s: %q is not a positive duration like \"100ms\" or \"10s\"", what, s)
	}
	return d, nil
}

var sizeUnits = map[string]float64{
	"": 1, "b": 1,
	"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
	"ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30, "ti": 1 << 40,
	"kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
}

var sizePattern = regexp.MustCompile(`^([0-9][0-9_]*(?:\.[0-9]+)?) ?([A-Za-z]*)$`)

// ParseBytes reads a size: "2097152", "2MiB", "5 GiB", "1.5 GB". Binary
// units are KiB, MiB, GiB, TiB (or Ki…); KB, MB, GB, TB are powers of 1000.
// A bare K, M or G is refused as ambiguous.
func ParseBytes(s string) (int64, error) {
	m := sizePattern.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return 0, fmt.Errorf("%q is not a size (write e.g. 2 MiB, 5 GiB or a number of bytes)", s)
	}
	unit, ok := sizeUnits[strings.ToLower(m[2])]
	if !ok {
		return 0, fmt.Errorf("%q: unknown unit %q (use B, KiB, MiB, GiB, TiB, or KB, MB, GB, TB)", s, m[2])
	}
	num, err := strconv.ParseFloat(strings.ReplaceAll(m[1], "_", ""), 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a size", s)
	}
	v := num * unit
	if v >= math.MaxInt64/2 {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return int64(v), nil
}
