package policy_test

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/agentloom/loomfs/policy"
)

// FuzzCleanPath checks the invariants of SPEC §3.1 on any input. The seed
// corpus is every case of pathTestCases plus testdata/fuzz/FuzzCleanPath.
func FuzzCleanPath(f *testing.F) {
	for _, tc := range pathTestCases {
		f.Add(tc.raw, true)
		f.Add(tc.raw, false)
	}
	f.Fuzz(func(t *testing.T, raw string, main bool) {
		out, err := policy.CleanPath(raw, main)
		// CleanTarget cleans the same way and only remembers the slash.
		if tg, terr := policy.CleanTarget(raw, main); (terr == nil) != (err == nil) || tg.Rel != out ||
			tg.Dir && !strings.HasSuffix(raw, "/") && !strings.HasSuffix(raw, "/.") {
			t.Fatalf("CleanTarget(%q) = %+v, %v; CleanPath %q, %v", raw, tg, terr, out, err)
		}
		if err != nil {
			var pe *policy.Error
			if !errors.As(err, &pe) || !pathRefusal(err) {
				t.Fatalf("CleanPath(%q) refused with %#v, want *policy.Error invalid_path or name_too_long", raw, err)
			}
			if out != "" {
				t.Fatalf("CleanPath(%q) returned %q with an error", raw, out)
			}
			if !utf8.ValidString(pe.Message) {
				t.Fatalf("CleanPath(%q): message %q is not valid UTF-8", raw, pe.Message)
			}
			for _, r := range pe.Message {
				if isControl(r) {
					t.Fatalf("CleanPath(%q): message %q echoes control character U+%04X", raw, pe.Message, r)
				}
			}
			return
		}

		if out == "" {
			t.Fatalf("CleanPath(%q) accepted as the empty string", raw)
		}
		if strings.HasPrefix(out, "/") {
			t.Fatalf("CleanPath(%q) = %q starts with /", raw, out)
		}
		if len(out) > policy.MaxPathBytes {
			t.Fatalf("CleanPath(%q) = %d bytes, over %d", raw, len(out), policy.MaxPathBytes)
		}
		if !utf8.ValidString(out) {
			t.Fatalf("CleanPath(%q) = %q is not valid UTF-8", raw, out)
		}
		for _, r := range out {
			if r == 0 || r == '\\' || isControl(r) {
				t.Fatalf("CleanPath(%q) = %q contains %U", raw, out, r)
			}
		}
		if out != "." {
			for i, c := range strings.Split(out, "/") {
				switch {
				case c == "" || c == "." || c == "..":
					t.Fatalf("CleanPath(%q) = %q has component %q", raw, out, c)
				case len(c) > policy.MaxNameBytes:
					t.Fatalf("CleanPath(%q) = %q has a component of %d bytes", raw, out, len(c))
				case !policy.Visible(c):
					t.Fatalf("CleanPath(%q) = %q names the reserved %q", raw, out, c)
				case i == 0 && main && c == policy.SubagentsDir:
					t.Fatalf("CleanPath(%q, main) = %q starts with %q", raw, out, policy.SubagentsDir)
				case i == 0 && strings.HasPrefix(c, "~"):
					t.Fatalf("CleanPath(%q) = %q starts with ~", raw, out)
				}
			}
		}

		// Idempotent: the canonical form is itself accepted unchanged, so
		// paths the tools return (list, glob) can be passed back.
		again, err := policy.CleanPath(out, main)
		if err != nil || again != out {
			t.Fatalf("CleanPath not idempotent: %q -> %q -> %q, %v", raw, out, again, err)
		}
		// A main scope only adds a refusal to a child scope's rules.
		if main {
			if c, err := policy.CleanPath(raw, false); err != nil || c != out {
				t.Fatalf("CleanPath(%q) main %q but child %q, %v", raw, out, c, err)
			}
		}
		// What the tools can address, the filesystem can create, and the
		// other way round (SPEC §3.1: every file stays reachable).
		if out != "." {
			dir, name := policy.Split(out)
			if err := policy.CheckName(dir, name, main); err != nil {
				t.Fatalf("CleanPath(%q) = %q but CheckName(%q, %q): %v", raw, out, dir, name, err)
			}
		}
	})
}

// FuzzCheckName checks the converse: a name the filesystem may create in
// a directory is addressable by the tools under exactly that path.
func FuzzCheckName(f *testing.F) {
	for _, tc := range pathTestCases {
		f.Add("a", tc.raw, true)
		f.Add(".", tc.raw, true)
		f.Add(".", tc.raw, false)
	}
	f.Fuzz(func(t *testing.T, dir, name string, main bool) {
		d, err := policy.CleanPath(dir, main)
		if err != nil {
			return
		}
		if name == "." {
			return // never a directory entry
		}
		if policy.CheckName(d, name, main) != nil {
			return
		}
		p := policy.Join(d, name)
		got, err := policy.CleanPath(p, main)
		if err != nil || got != p {
			t.Fatalf("CheckName(%q, %q) accepted, but CleanPath(%q) = %q, %v", d, name, p, got, err)
		}
	})
}
