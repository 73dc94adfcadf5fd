package tools

// The results of the tools, as their JSON says them (SPEC §4). Field
// names are part of the contract: add fields, never rename these. Other
// doors (the MCP server) decode results into these same types.

// ListResult is what workspace_list returns.
type ListResult struct {
	Path      string  `json:"path"`
	Entries   []Entry `json:"entries"`
	Total     int     `json:"total"`
	Truncated bool    `json:"truncated"`
	// SkippedDeep counts entries whose path is longer than the tools can
	// name (policy.MaxPathBytes), left out of Entries.
	SkippedDeep int `json:"skipped_deep,omitempty"`
}

// GlobResult is what workspace_glob returns.
type GlobResult struct {
	Pattern   string   `json:"pattern"`
	Path      string   `json:"path"`
	Matches   []string `json:"matches"`
	Total     int      `json:"total"`
	Truncated bool     `json:"truncated"`
	// SkippedDeep counts entries whose path is longer than the tools can
	// name (policy.MaxPathBytes); their subtrees are not walked.
	SkippedDeep int `json:"skipped_deep,omitempty"`
	// SkippedRefused counts the objects left out for being on another
	// mount than the scope's.
	SkippedRefused int `json:"skipped_refused,omitempty"`
}

// GrepResult is what workspace_grep returns.
type GrepResult struct {
	Pattern        string      `json:"pattern"`
	Path           string      `json:"path"`
	Matches        []GrepMatch `json:"matches"`
	FilesSearched  int         `json:"files_searched"`
	FilesMatched   int         `json:"files_matched"`
	SkippedBinary  int         `json:"skipped_binary"`
	SkippedLarge   int         `json:"skipped_large"`
	SkippedRefused int         `json:"skipped_refused"`
	BytesScanned   int64       `json:"bytes_scanned"`
	Truncated      bool        `json:"truncated"`
	// MatchesOmitted counts matching lines found but not returned (the
	// match cap); when the scan or walk cap also cut the search, more may
	// exist.
	MatchesOmitted int `json:"matches_omitted"`
	// SkippedDeep counts entries too deep to name, as in GlobResult.
	SkippedDeep int `json:"skipped_deep"`
}

// ReadResult is what workspace_read returns.
type ReadResult struct {
	Path       string `json:"path"`
	Content    string `json:"content"`
	SHA256     string `json:"sha256"`
	TotalLines int    `json:"total_lines"`
	Offset     int    `json:"offset"`
	Lines      int    `json:"lines"`
	Truncated  bool   `json:"truncated"`
	Binary     bool   `json:"binary,omitempty"`
}

// WriteResult is what workspace_write returns.
type WriteResult struct {
	Path    string `json:"path"`
	Bytes   int64  `json:"bytes"`
	SHA256  string `json:"sha256"`
	Created bool   `json:"created"`
}

// EditResult is what workspace_edit returns.
type EditResult struct {
	Path         string `json:"path"`
	Replacements int    `json:"replacements"`
	SHA256       string `json:"sha256"`
	Bytes        int64  `json:"bytes"`
}

// MkdirResult is what workspace_mkdir returns.
type MkdirResult struct {
	Path    string `json:"path"`
	Created bool   `json:"created"`
}

// DeleteResult is what workspace_delete returns.
type DeleteResult struct {
	Path    string `json:"path"`
	Deleted bool   `json:"deleted"`
}
