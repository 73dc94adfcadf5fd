package tools

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentloom/loomfs/policy"
)

// TestWriteMakesParents: workspace_write of a/b/c.txt in an empty scope
// makes a and a/b (0700) and the file; parents: false keeps the refusal;
// each parent is asked of the policy as workspace_mkdir would ask.
func TestWriteMakesParents(t *testing.T) {
	std, _ := policy.Preset("standard")
	cases := []struct {
		name string
		pol  *policy.Policy
		in   map[string]any
		code policy.Code // "" for success
		made []string
	}{
		{"parents by default", nil, map[string]any{"path": "a/b/c.txt", "content": "x"}, "", []string{"a", "a/b"}},
		{"parents: true", nil, map[string]any{"path": "d/e.txt", "content": "x", "parents": true}, "", []string{"d"}},
		{"parents: false refuses", nil, map[string]any{"path": "f/g.txt", "content": "x", "parents": false}, policy.NotFound, nil},
		{"a parent under ro is refused", std, map[string]any{"path": "data/new/x.txt", "content": "x"}, policy.ReadOnly, nil},
		{"a parent under wo is made", std, map[string]any{"path": "output/run1/result.json", "content": "{}"}, "", []string{"output/run1"}},
		{"a parent under hidden is not found", std, map[string]any{"path": ".meta/s/x", "content": "x"}, policy.NotFound, nil},
		{"the reserved name is refused", nil, map[string]any{"path": "subagents/x/y.txt", "content": "x"}, policy.InvalidPath, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tb, dir := newBox(t, c.pol)
			_, err := call(t, tb, Write, c.in)
			if c.code != "" {
				wantCode(t, err, c.code)
				p, _ := policy.Split(c.in["path"].(string))
				if _, serr := os.Lstat(filepath.Join(dir, p)); serr == nil && c.pol == nil {
					t.Errorf("%s was made by a refused write", p)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range c.made {
				st, err := os.Lstat(filepath.Join(dir, d))
				if err != nil || !st.IsDir() || st.Mode().Perm() != 0o700 {
					t.Errorf("%s: %v %v", d, st, err)
				}
			}
		})
	}
}

// TestStandardLayoutAfterFirstCall: a standard-preset scope has its six
// directories once it is opened, so an agent's first write into output/
// succeeds.
func TestStandardLayoutAfterFirstCall(t *testing.T) {
	std, _ := policy.Preset("standard")
	tb, dir := newBox(t, std)
	mustCall(t, tb, Write, map[string]any{"path": "output/result.json", "content": "{}", "parents": false})
	for _, d := range []string{"src", "data", "output", "logs", "tmp", ".meta"} {
		if st, err := os.Lstat(filepath.Join(dir, d)); err != nil || !st.IsDir() {
			t.Errorf("%s missing: %v", d, err)
		}
	}
	names := []string{}
	for _, e := range mustCall(t, tb, List, map[string]any{"path": "."})["entries"].([]any) {
		names = append(names, e.(map[string]any)["name"].(string))
	}
	if got := strings.Join(names, " "); got != "data logs output src tmp" {
		t.Errorf("listing %q: .meta must stay hidden", got)
	}
}

func TestWriteDescriptionSaysParents(t *testing.T) {
	for _, d := range Definitions(policy.Default()) {
		if d.Name == Write && (!strings.Contains(d.Description, "missing parent directories are created") || !strings.Contains(string(d.InputSchema), `"parents"`)) {
			t.Errorf("workspace_write does not say it makes parents: %s", d.Description)
		}
	}
}
