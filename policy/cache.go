package policy

// Cache is the policy file's "cache" setting: how long the projection lets
// the kernel keep what it learned of the workspace.
type Cache string

const (
	// CacheJournal (the default when empty) lets the kernel keep entries,
	// attributes, listings and file pages for long, and drops exactly
	// what the scope's change journals say changed.
	CacheJournal Cache = "journal"
	// CacheStrict keeps entries and attributes for one second, caches no
	// failed lookup and drops a file's pages at every open: what a change
	// made behind loomfs's back (not in the journals) needs.
	CacheStrict Cache = "strict"
	// CacheKernelDirs is CacheJournal, and directories are opened by the
	// kernel without asking the projection, which makes a warm walk of a
	// tree (find, git status) cost nothing per directory. Its price: an
	// opendir is no longer refused, so a directory its owner can't read
	// opens, and only the read of its entries fails (EACCES) — a program
	// that checks only the open (Python's os.fwalk) raises where it would
	// have skipped the directory.
	CacheKernelDirs Cache = "journal-dirs"
)

// KernelOpensDirs reports whether the kernel opens directories itself
// ("cache: journal-dirs").
func (p *Policy) KernelOpensDirs() bool { return p.Cache == CacheKernelDirs }

// StrictCache reports whether the projection caches as "cache: strict"
// says.
func (p *Policy) StrictCache() bool { return p.Cache == CacheStrict }
