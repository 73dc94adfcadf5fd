package policy

// Cache is the policy file's "cache" setting: how long the projection lets
// the kernel keep what it learned of the workspace.
type Cache string

const (
	// CacheKernelDirs (the default when empty) lets the kernel keep
	// entries, attributes, listings and file pages for long, drops
	// exactly what the scope's change journals say changed, and opens
	// directories itself without asking the projection, checking the
	// owner bits the projection shows as on any disk (FUSE
	// default_permissions): a warm walk of a tree (find, git status)
	// costs nothing per directory, and a directory its owner made
	// unreadable fails at opendir with EACCES. Refusals by those bits
	// are the kernel's and are not audited; every policy refusal (path
	// rules, hidden names, links, special files, quotas, reserved
	// names) stays the projection's and is.
	CacheKernelDirs Cache = "journal-dirs"
	// CacheJournal caches as CacheKernelDirs does, but every opendir and
	// every permission check comes to the projection: for a deployment
	// that wants each of them seen (and each owner-bit refusal audited)
	// at the price of two round trips per directory of a walk.
	CacheJournal Cache = "journal"
	// CacheStrict keeps entries and attributes for one second, caches no
	// failed lookup and drops a file's pages at every open: what a change
	// made behind loomfs's back (not in the journals) needs. Directories
	// and permissions are the projection's, as under CacheJournal.
	CacheStrict Cache = "strict"
)

// KernelOpensDirs reports whether the kernel opens directories itself and
// checks the owner bits (the default, "cache: journal-dirs").
func (p *Policy) KernelOpensDirs() bool { return p.Cache == "" || p.Cache == CacheKernelDirs }

// StrictCache reports whether the projection caches as "cache: strict"
// says.
func (p *Policy) StrictCache() bool { return p.Cache == CacheStrict }
