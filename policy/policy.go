package policy

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// Mode is what a subtree allows (SPEC §3.3).
type Mode string

const (
	ModeRW     Mode = "rw"     // read and write (the default)
	ModeRO     Mode = "ro"     // read only
	ModeWO     Mode = "wo"     // create and write, never read back
	ModeHidden Mode = "hidden" // not listed, not opened, not created
)

// Rule gives a subtree a mode. Prefix is a cleaned path ("data", "a/b").
type Rule struct {
	Prefix string `json:"prefix" yaml:"prefix"`
	Mode   Mode   `json:"mode" yaml:"mode"`
}

// Op is the kind of access a door is about to make.
type Op int

const (
	OpStat    Op = iota // metadata of one object (lstat)
	OpList              // entries of a directory
	OpRead              // contents of a file
	OpWrite             // contents of an existing file (write, truncate, edit)
	OpCreate            // a new file or directory
	OpDelete            // unlink or rmdir
	OpRename            // either end of a rename
	OpSetattr           // chmod, utimes
)

var opNames = [...]string{"stat", "list", "read", "write", "create", "delete", "rename", "setattr"}

func (o Op) String() string { return opNames[o] }

// mutates reports whether o changes the workspace.
func (o Op) mutates() bool { return o >= OpWrite }

// Policy is one scope's rule set. The zero value is not useful; start from
// Default and adjust.
type Policy struct {
	// MainScope reserves the top-level "subagents" (SPEC §2.1).
	MainScope bool
	Rules     []Rule
	Limits    Limits
	// Readme keeps ReadmeFile at the top of every workspace, generated from
	// this policy (WorkspaceReadme) and read-only, so an agent learns its
	// limits by reading one file (SPEC §6).
	Readme bool
	// Subtrees holds what the policy file says of a subtree besides its
	// mode: caps, confirmation, clearing at run end (subtree.go).
	Subtrees []Subtree
	// Symlinks says whether programs in the projection may make symbolic
	// links (SymlinksEmulate, the default when empty) or not.
	Symlinks Symlinks
	// Cache says how the projection lets the kernel cache
	// (CacheKernelDirs, the default when empty, CacheJournal or
	// CacheStrict).
	Cache Cache
	// Commands says where workspace_command runs (CommandsFresh, the
	// default when empty, or CommandsSession).
	Commands Commands
	// Layout lists the directories a scope gets at first use (layout.go):
	// the standard preset's, and every rule's of a policy file unless it
	// says "create: false". Set it with SetLayout.
	Layout []string
	// Priority is the class of a scope no run gives one (priority.go);
	// "" is normal. ForPriority applies a class.
	Priority Priority
	// LimitsByPriority holds each class's limits when the policy file
	// sets limits_by_priority: the file's limits with the class's keys
	// laid over them.
	LimitsByPriority map[Priority]Limits
	// VolumeReserveLow and VolumeReserveNormal are the free room the
	// volume keeps from low and from normal scopes (CheckVolume).
	VolumeReserveLow, VolumeReserveNormal Watermark
	// Hooks are the command hooks of the tool door (hooks.go).
	Hooks Hooks
	// AgentMerge lets an agent in a fork merge it back into the scope it
	// was forked from itself (the policy file's agent_merge). Off by
	// default: the platform decides when a fork's work comes back.
	AgentMerge bool
	// ArchiveBeforeReclaim (the policy file's archive_before_reclaim)
	// makes gc keep every old session and snapshot until a verified copy
	// of it is in the object store ("loomfs snapshot archive").
	ArchiveBeforeReclaim bool
}

// CheckAgentMerge refuses an agent's own merge of its fork unless the
// policy allows it.
func (p *Policy) CheckAgentMerge() error {
	if !p.AgentMerge {
		return Errorf(PermissionDenied, "this workspace's policy does not let an agent merge its work back (agent_merge is off): the platform merges it; workspace_fork_status shows what a merge would bring back and hold back")
	}
	return nil
}

// Symlinks is the policy file's "symlinks" setting (SPEC §3.2).
type Symlinks string

const (
	// SymlinksEmulate lets a program in the projection make a symbolic
	// link, stored as an inert marked file (LinkMarker), never a symlink.
	SymlinksEmulate Symlinks = "emulate"
	// SymlinksRefuse refuses making links (EPERM); links made earlier are
	// shown but not followed, as a symlink planted in the backing store is.
	SymlinksRefuse Symlinks = "refuse"
)

// EmulatesLinks reports whether links are made and followed in the
// projection.
func (p *Policy) EmulatesLinks() bool { return p.Symlinks != SymlinksRefuse }

// Default returns the open layout: everything rw, default limits.
func Default() *Policy {
	return &Policy{Limits: DefaultLimits(), Symlinks: SymlinksEmulate}
}

// WithScope returns a copy of p for a main scope or a child scope.
func (p *Policy) WithScope(main bool) *Policy {
	q := *p
	q.MainScope = main
	q.Rules = append([]Rule(nil), p.Rules...)
	return &q
}

// SetRules validates and installs rules; the longest prefix wins.
func (p *Policy) SetRules(rules []Rule) error {
	seen := map[string]bool{}
	out := make([]Rule, 0, len(rules))
	for _, r := range rules {
		prefix, err := CleanPath(r.Prefix, false)
		if err != nil {
			return fmt.Errorf("rule %q: %w", r.Prefix, err)
		}
		switch r.Mode {
		case ModeRW, ModeRO, ModeWO, ModeHidden:
		default:
			return fmt.Errorf("rule %q: unknown mode %q (want rw, ro, wo or hidden)", r.Prefix, r.Mode)
		}
		if seen[prefix] {
			return fmt.Errorf("rule %q: prefix given twice", r.Prefix)
		}
		seen[prefix] = true
		out = append(out, Rule{Prefix: prefix, Mode: r.Mode})
	}
	// The root rule "." is one byte long but the shortest prefix of all;
	// ranked by byte length it could sort before a one-letter rule ("o")
	// and win over it in ModeOf.
	rank := func(prefix string) int {
		if prefix == "." {
			return 0
		}
		return len(prefix)
	}
	sort.Slice(out, func(i, j int) bool { return rank(out[i].Prefix) > rank(out[j].Prefix) })
	p.Rules = out
	return nil
}

// ReadmeFile is where the generated workspace README lives when the
// policy asks for one.
const ReadmeFile = "README.md"

// ModeOf returns the mode in force at the cleaned path rel.
func (p *Policy) ModeOf(rel string) Mode {
	if p.Readme && rel == ReadmeFile {
		return ModeRO
	}
	for _, r := range p.Rules {
		if r.Prefix == "." || rel == r.Prefix || strings.HasPrefix(rel, r.Prefix+"/") {
			return r.Mode
		}
	}
	return ModeRW
}

// Path cleans a model-supplied path and checks that op may be made on it.
func (p *Policy) Path(op Op, raw string) (string, error) {
	t, err := p.Target(op, raw)
	return t.Rel, err
}

// Target is Path remembering whether the spelling names a directory: the
// first question every tool asks, before Target.CheckKind on what is there.
func (p *Policy) Target(op Op, raw string) (Target, error) {
	t, err := CleanTarget(raw, p.MainScope)
	if err != nil {
		return Target{}, err
	}
	return t, p.Check(op, t.Rel)
}

// Check decides whether op may be made at the cleaned path rel under the
// path modes and reserved names. It does not look at the object there; see
// CheckObject.
func (p *Policy) Check(op Op, rel string) error {
	if op == OpCreate || op == OpRename {
		dir, name := Split(rel)
		if rel == "." {
			return Errorf(Exists, "the workspace root already exists")
		}
		if err := CheckName(dir, name, p.MainScope); err != nil {
			return err
		}
	}
	switch p.ModeOf(rel) {
	case ModeHidden:
		return Errorf(NotFound, "%s: no such file or directory", rel)
	case ModeRO:
		if op.mutates() {
			return Errorf(ReadOnly, "%s is read-only (path rule %q); write elsewhere, for example in a rw directory", rel, p.ruleFor(rel))
		}
	case ModeWO:
		if op == OpRead {
			return Errorf(PermissionDenied, "%s is write-only (path rule %q): files there can be written but not read back", rel, p.ruleFor(rel))
		}
	}
	return nil
}

// Listed reports whether the entry at cleaned path rel appears in listings.
func (p *Policy) Listed(rel string) bool {
	_, name := Split(rel)
	return Visible(name) && p.ModeOf(rel) != ModeHidden
}

func (p *Policy) ruleFor(rel string) string {
	if p.Readme && rel == ReadmeFile {
		return ReadmeFile + " ro, generated from the policy"
	}
	for _, r := range p.Rules {
		if r.Prefix == "." || rel == r.Prefix || strings.HasPrefix(rel, r.Prefix+"/") {
			return r.Prefix + "/ " + string(r.Mode)
		}
	}
	return ". rw"
}

// Split splits a cleaned path into its directory and last name.
func Split(rel string) (dir, name string) {
	i := strings.LastIndexByte(rel, '/')
	if i < 0 {
		return ".", rel
	}
	return rel[:i], rel[i+1:]
}

// Limits bound what one call or one scope may use (SPEC §3.3). Zero means
// unlimited for the quota fields.
type Limits struct {
	TextBytes  int64 // largest file the text tools read or write
	FileBytes  int64 // largest file through the filesystem
	ScopeBytes int64 // total bytes of regular files in a scope
	ScopeFiles int64 // number of files and directories in a scope

	ListEntries  int           // entries one workspace_list returns
	GlobResults  int           // paths one workspace_glob returns
	GrepMatches  int           // matching lines one workspace_grep returns
	GrepScan     int64         // bytes one workspace_grep reads in all
	GrepLine     int           // longest line handed to a backtracking regex
	RegexTimeout time.Duration // per-match limit of a backtracking regex
	GrepBudget   time.Duration // whole-call limit of workspace_grep
	WalkEntries  int           // entries one glob or grep visits

	IOBytesPerSec int64 // bytes read and written per second, both doors; 0 is no limit
	IOOpsPerSec   int64 // filesystem operations and tool calls per second; 0 is no limit
	// ImageBytes caps the image workspace_read_image returns (after
	// downscaling and encoding); ImageSource the file it reads.
	ImageBytes  int64
	ImageSource int64

	// A scope's session sandbox (SPEC §5.1) ends after SessionIdle
	// without a running process or a call, and after SessionLifetime in
	// any case; each process keeps its last ProcessOutput bytes of output.
	SessionIdle     time.Duration
	SessionLifetime time.Duration
	ProcessOutput   int64
}

// DefaultLimits are the limits of the open layout.
func DefaultLimits() Limits {
	return Limits{
		TextBytes:    2 << 20,
		FileBytes:    1 << 30,
		ScopeBytes:   5 << 30,
		ScopeFiles:   100_000,
		ListEntries:  1000,
		GlobResults:  1000,
		GrepMatches:  500,
		GrepScan:     256 << 20,
		GrepLine:     64 << 10,
		RegexTimeout: 100 * time.Millisecond,
		GrepBudget:   10 * time.Second,
		WalkEntries:  200_000,
		ImageBytes:   4 << 20,
		ImageSource:  64 << 20,

		SessionIdle:     10 * time.Minute,
		SessionLifetime: 2 * time.Hour,
		ProcessOutput:   1 << 20,
	}
}

// CheckText refuses a file of size bytes for the text tools.
func (l Limits) CheckText(rel string, size int64) error {
	if l.TextBytes > 0 && size > l.TextBytes {
		return Errorf(TooLarge, "%s is %s; the text limit of read and write tools is %s (use workspace_command for larger files)", rel, Bytes(size), Bytes(l.TextBytes))
	}
	return nil
}

// CheckFileSize refuses growing a file to size bytes through the filesystem.
func (l Limits) CheckFileSize(rel string, size int64) error {
	if l.FileBytes > 0 && size > l.FileBytes {
		return Errorf(TooLarge, "file too large: %s would be %s; the per-file limit is %s", rel, Bytes(size), Bytes(l.FileBytes))
	}
	return nil
}

// Usage is what a scope holds now.
type Usage struct {
	Bytes int64 // apparent size of regular files (sparse files count in full)
	Files int64 // files and directories
}

// CheckQuota refuses a change that adds addBytes and addFiles to used.
// Shrinking changes always pass, so a full scope can be cleaned up.
func (l Limits) CheckQuota(used Usage, addBytes, addFiles int64) error {
	if addBytes > 0 && l.ScopeBytes > 0 && used.Bytes+addBytes > l.ScopeBytes {
		return Errorf(QuotaExceeded, "quota exceeded: workspace total %s (used %s, write of %s refused)", Bytes(l.ScopeBytes), Bytes(used.Bytes), Bytes(addBytes))
	}
	if addFiles > 0 && l.ScopeFiles > 0 && used.Files+addFiles > l.ScopeFiles {
		return Errorf(QuotaExceeded, "quota exceeded: workspace file count %d (used %d, %d new refused)", l.ScopeFiles, used.Files, addFiles)
	}
	return nil
}

// Bytes formats n for people: "2 MiB", "4.99 GiB", "512 B".
func Bytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	v := float64(n) / float64(div)
	s := fmt.Sprintf("%.2f", v)
	if s == "1024.00" && exp < 4 {
		// Rounded up into the next unit: say "1 MiB", not "1024 KiB".
		s, exp = "1", exp+1
	}
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s + " " + string("KMGTP"[exp]) + "iB"
}
