package policy_test

import (
	"slices"
	"testing"

	"github.com/agentloom/loomfs/policy"
)

func TestLayout(t *testing.T) {
	std := []string{".meta", "data", "logs", "output", "src", "tmp"}
	cases := []struct {
		name string
		file string
		main bool
		want []string
	}{
		{"the open layout makes nothing", "preset: open\n", false, nil},
		{"the standard preset makes its six directories", "preset: standard\n", false, std},
		{"a rule of a file names a directory to make", "rules:\n  - path: reports/\n    mode: ro\n", false, []string{"reports"}},
		{"nested rules make their parents first", "rules:\n  - path: a/b\n    mode: ro\n  - path: a\n    mode: rw\n", false, []string{"a", "a/b"}},
		{"create: false opts a rule out", "preset: standard\nrules:\n  - path: .meta/\n    mode: hidden\n    create: false\n", false, []string{"data", "logs", "output", "src", "tmp"}},
		{"the root rule makes nothing", "rules:\n  - path: .\n    mode: ro\n", false, nil},
		{"a main scope never makes subagents", "rules:\n  - path: subagents/x\n    mode: ro\n", true, nil},
		{"a child scope may", "rules:\n  - path: subagents/x\n    mode: ro\n", false, []string{"subagents/x"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := policy.Parse("p.yaml", []byte(c.file))
			if err != nil {
				t.Fatal(err)
			}
			got := p.WithScope(c.main).LayoutDirs()
			if !slices.Equal(got, c.want) {
				t.Errorf("layout %q, want %q", got, c.want)
			}
		})
	}
}

func TestLayoutRefused(t *testing.T) {
	for _, file := range []string{
		"rules:\n  - path: data/\n    mode: ro\n    create: maybe\n",
		"rules:\n  - path: data/\n    create: false\n",
	} {
		if _, err := policy.Parse("p.yaml", []byte(file)); err == nil {
			t.Errorf("%q accepted", file)
		}
	}
	p := policy.Default()
	for _, d := range []string{"../x", "/abs", ".agentloom-locks", "README.md"} {
		if err := p.SetLayout([]string{d}); err == nil {
			t.Errorf("SetLayout(%q) accepted", d)
		}
	}
}

func TestWithoutModes(t *testing.T) {
	p, _ := policy.Preset("standard")
	q := p.WithoutModes()
	for _, rel := range []string{"data/x", ".meta/s", "output/r"} {
		for _, op := range []policy.Op{policy.OpRead, policy.OpCreate, policy.OpWrite} {
			if err := q.Check(op, rel); err != nil {
				t.Errorf("%s %s: %v", op, rel, err)
			}
		}
	}
	if err := p.Check(policy.OpCreate, "data/x"); err == nil {
		t.Error("WithoutModes changed the policy it was made from")
	}
	if q.Limits != p.Limits || len(q.Subtrees) != len(p.Subtrees) {
		t.Error("WithoutModes dropped limits or caps")
	}
}
