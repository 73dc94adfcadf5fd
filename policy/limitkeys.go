package policy

import (
	"strconv"
	"time"
)

// LimitKey is one key of a policy file's limits section with its value in
// a policy. Limits.Keys lists them all, in one place, so what shows a
// policy's limits (loomfs policy show) names every key the file takes,
// and the file takes no key it does not show.
type LimitKey struct {
	Name string
	// Value is the limit as JSON shows it: bytes and counts as numbers (0
	// for "unlimited" where the key takes it), durations as Go writes
	// them ("10m0s").
	Value any
	// Text is the limit as a person reads it: "2 MiB", "unlimited",
	// "10m0s".
	Text string
}

// Keys lists l by the keys of a policy file, in the order the file
// documents them.
func (l Limits) Keys() []LimitKey {
	size := func(name string, n int64) LimitKey { return LimitKey{name, n, Bytes(n)} }
	sizeOrUnlimited := func(name string, n int64) LimitKey {
		if n == 0 {
			return LimitKey{name, n, "unlimited"}
		}
		return size(name, n)
	}
	count := func(name string, n int64) LimitKey { return LimitKey{name, n, strconv.FormatInt(n, 10)} }
	countOrUnlimited := func(name string, n int64) LimitKey {
		if n == 0 {
			return LimitKey{name, n, "unlimited"}
		}
		return count(name, n)
	}
	duration := func(name string, d time.Duration) LimitKey { return LimitKey{name, d.String(), d.String()} }
	return []LimitKey{
		size("text_bytes", l.TextBytes),
		sizeOrUnlimited("file_bytes", l.FileBytes),
		sizeOrUnlimited("scope_bytes", l.ScopeBytes),
		countOrUnlimited("scope_files", l.ScopeFiles),
		count("list_entries", int64(l.ListEntries)),
		count("glob_results", int64(l.GlobResults)),
		count("grep_matches", int64(l.GrepMatches)),
		size("grep_scan", l.GrepScan),
		size("grep_line", int64(l.GrepLine)),
		duration("regex_timeout", l.RegexTimeout),
		duration("grep_budget", l.GrepBudget),
		count("walk_entries", int64(l.WalkEntries)),
		size("image_bytes", l.ImageBytes),
		size("image_source_bytes", l.ImageSource),
		sizeOrUnlimited("io_bytes_per_s", l.IOBytesPerSec),
		countOrUnlimited("io_ops_per_s", l.IOOpsPerSec),
		duration("session_idle", l.SessionIdle),
		duration("session_lifetime", l.SessionLifetime),
		size("process_output_bytes", l.ProcessOutput),
	}
}
