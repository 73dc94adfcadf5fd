package store

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
)

// LastSelfChecks returns the last self-check every projection of a scope
// of the volume at root recorded (RecordSelfCheck), passed or failed,
// sorted by scope. Nothing is written; an unreadable record is skipped.
func LastSelfChecks(root string) []SelfCheck {
	files, _ := filepath.Glob(filepath.Join(root, LocksDir, "*", SelfCheckFile))
	out := []SelfCheck{}
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		var sc SelfCheck
		if json.Unmarshal(b, &sc) == nil {
			out = append(out, sc)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Scope < out[j].Scope })
	return out
}
