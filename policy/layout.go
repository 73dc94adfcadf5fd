package policy

import (
	"fmt"
	"sort"
)

// The layout is the set of directories a scope opened under a policy gets
// at first use (seed 001 §2.1: the runtime lays out the workspace), so an
// agent's first write into output/ finds its directory. The rule of which
// directories lives here; the store makes them.

// SetLayout validates and installs the directories made at first use,
// sorted so that a parent comes before what it holds.
func (p *Policy) SetLayout(dirs []string) error {
	seen := map[string]bool{}
	out := make([]string, 0, len(dirs))
	for _, d := range dirs {
		rel, err := CleanPath(d, false)
		if err != nil {
			return fmt.Errorf("layout %q: %w", d, err)
		}
		if rel == "." {
			continue // the scope directory itself is always made
		}
		if err := checkLayoutName(rel, p.MainScope); err != nil {
			return fmt.Errorf("layout %q: %w", d, err)
		}
		if !seen[rel] {
			seen[rel] = true
			out = append(out, rel)
		}
	}
	sort.Strings(out)
	p.Layout = out
	return nil
}

// checkLayoutName refuses a layout directory no door could ever address:
// a reserved name, or the generated README.
func checkLayoutName(rel string, main bool) error {
	if _, err := CleanPath(rel, main); err != nil {
		return err
	}
	if rel == ReadmeFile {
		return Errorf(InvalidPath, "%s is the generated workspace README", rel)
	}
	return nil
}

// LayoutDirs returns the directories to make at first use in a scope of
// this policy: Layout, without any a reserved name would refuse there (a
// main scope reserves "subagents").
func (p *Policy) LayoutDirs() []string {
	var out []string
	for _, d := range p.Layout {
		if checkLayoutName(d, p.MainScope) == nil {
			out = append(out, d)
		}
	}
	return out
}

// WithoutModes returns a copy of p for the platform's own door (staging
// and collecting): no path modes, so ro, wo and hidden subtrees can be
// filled and read, but the same limits, subtree caps, link setting,
// reserved names and generated README.
func (p *Policy) WithoutModes() *Policy {
	q := *p
	q.Rules = nil
	return &q
}
