package policy_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/agentloom/loomfs/policy"
)

// TestPublishedDirs: "publish: true" marks a subtree as a run's output,
// alone or beside a mode, and says so in the workspace README; a rule
// can't mark the whole workspace, and none marked means none named.
func TestPublishedDirs(t *testing.T) {
	cases := []struct {
		name, file string
		want       []string
		refused    string
	}{
		{"none marked", "preset: standard\n", nil, ""},
		{"a subtree alone", "rules:\n  - path: dist/\n    publish: true\n", []string{"dist"}, ""},
		{"beside a mode, and two", "rules:\n  - path: output/\n    mode: wo\n    publish: true\n  - path: reports\n    publish: true\n  - path: src\n    mode: rw\n", []string{"output", "reports"}, ""},
		{"false says nothing", "rules:\n  - path: dist/\n    publish: false\n", nil, "says nothing"},
		{"not the root", "rules:\n  - path: .\n    publish: true\n", nil, "takes only a mode"},
		{"a bool", "rules:\n  - path: dist\n    publish: yes please\n", nil, "true or false"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pol, err := policy.Parse("p.yaml", []byte(c.file))
			if c.refused != "" {
				if err == nil || !strings.Contains(err.Error(), c.refused) {
					t.Fatalf("Parse = %v, want a refusal saying %q", err, c.refused)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := pol.PublishedDirs()
			slices.Sort(got)
			if !slices.Equal(got, c.want) {
				t.Fatalf("PublishedDirs = %v, want %v", got, c.want)
			}
			if len(c.want) > 0 && !strings.Contains(policy.WorkspaceReadme(pol), "kept as the run's output") {
				t.Fatalf("the README doesn't say what is published:\n%s", policy.WorkspaceReadme(pol))
			}
		})
	}
}

// TestArchiveBeforeReclaim: the policy file's archive_before_reclaim,
// off unless it says true.
func TestArchiveBeforeReclaim(t *testing.T) {
	cases := []struct {
		file    string
		want    bool
		refused string
	}{
		{"preset: standard\n", false, ""},
		{"archive_before_reclaim: true\n", true, ""},
		{"archive_before_reclaim: false\n", false, ""},
		{"archive_before_reclaim: always\n", false, "archive_before_reclaim must be true or false"},
	}
	for _, c := range cases {
		pol, err := policy.Parse("p.yaml", []byte(c.file))
		if c.refused != "" {
			if err == nil || !strings.Contains(err.Error(), c.refused) {
				t.Fatalf("%q: %v, want a refusal saying %q", c.file, err, c.refused)
			}
			continue
		}
		if err != nil || pol.ArchiveBeforeReclaim != c.want {
			t.Fatalf("%q: archive_before_reclaim %v, %v; want %v", c.file, pol != nil && pol.ArchiveBeforeReclaim, err, c.want)
		}
	}
}
