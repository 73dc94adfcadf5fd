package fork_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/agentloom/loomfs/changes"
	"github.com/agentloom/loomfs/fork"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// forked is main seeded and forked into childA.
func forked(t *testing.T, pol *policy.Policy) (*volume, *store.Workspace, *store.Workspace) {
	t.Helper()
	v := newVolume(t, t.TempDir())
	main := v.open(t, mainScope, pol)
	seed(t, main)
	child := v.open(t, childA, pol)
	if _, err := fork.Fork(context.Background(), main, child, fork.Options{}); err != nil {
		t.Fatal(err)
	}
	return v, main, child
}

type edit struct {
	path    string
	content string // "" deletes
}

func apply(t *testing.T, ws *store.Workspace, edits []edit) {
	t.Helper()
	for _, e := range edits {
		if e.content == "" {
			remove(t, ws, e.path)
		} else {
			write(t, ws, e.path, e.content)
		}
	}
}

func conflictTypes(res *fork.MergeResult) []string {
	var out []string
	for _, c := range res.Conflicts {
		out = append(out, c.Path+":"+c.Type)
	}
	return out
}

func appliedOps(res *fork.MergeResult) []string {
	var out []string
	for _, a := range res.Applied {
		out = append(out, a.Path+":"+a.Op)
	}
	return out
}

func TestMerge(t *testing.T) {
	ro, _ := policy.Preset("standard")
	roSrc := *ro
	if err := roSrc.SetRules(append(slices.Clone(ro.Rules), policy.Rule{Prefix: "src/sub", Mode: policy.ModeRO})); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		pol       *policy.Policy // the target's (and the fork's); standard when nil
		inFork    []edit
		inTarget  []edit
		opt       fork.MergeOptions
		code      policy.Code
		applied   []string
		conflicts []string
		refused   []string
		want      map[string]string // the target's files after; "" absent
	}{
		{
			name:    "changed only in the fork: applied",
			inFork:  []edit{{"src/a.go", "package a // fork\n"}, {"src/new.go", "package a\n"}, {"logs/run.log", ""}},
			applied: []string{"logs/run.log:delete", "src/a.go:write", "src/new.go:create"},
			want:    map[string]string{"src/a.go": "package a // fork\n", "src/new.go": "package a\n", "logs/run.log": ""},
		},
		{
			name:     "changed only in the target: kept",
			inTarget: []edit{{"src/a.go", "package a // main\n"}},
			want:     map[string]string{"src/a.go": "package a // main\n"},
		},
		{
			name:     "changed alike on both sides: nothing to do",
			inFork:   []edit{{"src/a.go", "package a // same\n"}},
			inTarget: []edit{{"src/a.go", "package a // same\n"}},
			want:     map[string]string{"src/a.go": "package a // same\n"},
		},
		{
			name:      "both_modified holds the whole merge back",
			inFork:    []edit{{"src/a.go", "package a // fork\n"}, {"src/new.go", "package a\n"}},
			inTarget:  []edit{{"src/a.go", "package a // main\n"}},
			code:      policy.Conflict,
			conflicts: []string{"src/a.go:both_modified"},
			applied:   []string{"src/new.go:create"},
			want:      map[string]string{"src/a.go": "package a // main\n", "src/new.go": ""},
		},
		{
			name:      "partial applies what conflicts with nothing",
			inFork:    []edit{{"src/a.go", "package a // fork\n"}, {"src/new.go", "package a\n"}},
			inTarget:  []edit{{"src/a.go", "package a // main\n"}},
			opt:       fork.MergeOptions{Partial: true},
			code:      policy.Conflict,
			conflicts: []string{"src/a.go:both_modified"},
			applied:   []string{"src/new.go:create"},
			want:      map[string]string{"src/a.go": "package a // main\n", "src/new.go": "package a\n"},
		},
		{
			name:      "modified_deleted",
			inFork:    []edit{{"src/a.go", "package a // fork\n"}},
			inTarget:  []edit{{"src/a.go", ""}},
			code:      policy.Conflict,
			conflicts: []string{"src/a.go:modified_deleted"},
			want:      map[string]string{"src/a.go": ""},
		},
		{
			name:      "deleted_modified",
			inFork:    []edit{{"src/a.go", ""}},
			inTarget:  []edit{{"src/a.go", "package a // main\n"}},
			code:      policy.Conflict,
			conflicts: []string{"src/a.go:deleted_modified"},
			want:      map[string]string{"src/a.go": "package a // main\n"},
		},
		{
			name:      "both_added",
			inFork:    []edit{{"src/n.go", "package n // fork\n"}},
			inTarget:  []edit{{"src/n.go", "package n // main\n"}},
			code:      policy.Conflict,
			conflicts: []string{"src/n.go:both_added"},
			want:      map[string]string{"src/n.go": "package n // main\n"},
		},
		{
			name:      "type_changed",
			inFork:    []edit{{"src/sub/c.go", ""}, {"src/sub", ""}, {"src/sub", "now a file\n"}},
			inTarget:  []edit{{"src/sub/c.go", "package sub // main\n"}},
			code:      policy.Conflict,
			conflicts: []string{"src/sub:type_changed", "src/sub/c.go:deleted_modified"},
			want:      map[string]string{"src/sub/c.go": "package sub // main\n"},
		},
		{
			name:    "a dry run changes nothing",
			inFork:  []edit{{"src/a.go", "package a // fork\n"}},
			opt:     fork.MergeOptions{DryRun: true},
			applied: []string{"src/a.go:write"},
			want:    map[string]string{"src/a.go": "package a\n"},
		},
		{
			name:    "paths limit the merge",
			inFork:  []edit{{"src/a.go", "package a // fork\n"}, {"logs/run.log", "more\n"}},
			opt:     fork.MergeOptions{Paths: []string{"logs"}},
			applied: []string{"logs/run.log:write"},
			want:    map[string]string{"src/a.go": "package a\n", "logs/run.log": "more\n"},
		},
		{
			name:    "never into a read-only subtree of the target",
			pol:     &roSrc,
			inFork:  []edit{{"src/sub/c.go", "package sub // fork\n"}, {"src/a.go", "package a // fork\n"}},
			code:    policy.Conflict,
			refused: []string{"src/sub/c.go:read_only"},
			applied: []string{"src/a.go:write"},
			want:    map[string]string{"src/sub/c.go": "package sub\n", "src/a.go": "package a\n"},
		},
		{
			name:      "no conflict markers carry a write-only file's content out",
			inFork:    []edit{{"output/out.txt", "fork's result\n"}},
			inTarget:  []edit{{"output/out.txt", "main's result\n"}},
			opt:       fork.MergeOptions{Markers: true},
			code:      policy.Conflict,
			conflicts: []string{"output/out.txt:both_modified"},
			want:      map[string]string{"output/out.txt": "main's result\n", "output/out.txt.conflict": ""},
		},
		{
			name:      "conflict markers are written beside, never over",
			inFork:    []edit{{"src/b.go", "package b\n\nfunc B() { fork() }\n"}},
			inTarget:  []edit{{"src/b.go", "package b\n\nfunc B() { main() }\n"}},
			opt:       fork.MergeOptions{Markers: true},
			code:      policy.Conflict,
			conflicts: []string{"src/b.go:both_modified"},
			want: map[string]string{
				"src/b.go":          "package b\n\nfunc B() { main() }\n",
				"src/b.go.conflict": "package b\n\n<<<<<<< sp/ag/se\nfunc B() { main() }\n=======\nfunc B() { fork() }\n>>>>>>> sp/ag/se/r1/a\n",
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, main, child := forked(t, tc.pol)
			apply(t, child, tc.inFork)
			apply(t, main, tc.inTarget)
			res, err := fork.Merge(context.Background(), child, main, tc.opt)
			if policy.CodeOf(err) != tc.code {
				t.Fatalf("err %v, want code %q", err, tc.code)
			}
			if res == nil {
				t.Fatal("no result")
			}
			var refused []string
			for _, r := range res.Refused {
				refused = append(refused, r.Path+":"+r.Code)
			}
			if got := appliedOps(res); !slices.Equal(got, tc.applied) {
				t.Errorf("applied %v, want %v", got, tc.applied)
			}
			if got := conflictTypes(res); !slices.Equal(got, tc.conflicts) {
				t.Errorf("conflicts %v, want %v", got, tc.conflicts)
			}
			if !slices.Equal(refused, tc.refused) {
				t.Errorf("refused %v, want %v", refused, tc.refused)
			}
			for rel, want := range tc.want {
				got, ok := read(t, v, mainScope, rel)
				if want == "" && ok {
					t.Errorf("%s in the target: %q, want it absent", rel, got)
				}
				if want != "" && got != want {
					t.Errorf("%s in the target: %q, want %q", rel, got, want)
				}
			}
		})
	}
}

// TestMergeHashes checks a conflict's three hashes and that a merge done
// is done: merging again changes nothing and conflicts with nothing.
func TestMergeHashes(t *testing.T) {
	_, main, child := forked(t, nil)
	write(t, child, "src/a.go", "fork\n")
	write(t, main, "src/a.go", "main\n")
	write(t, child, "src/b.go", "fork b\n")
	res, err := fork.Merge(context.Background(), child, main, fork.MergeOptions{Partial: true})
	if policy.CodeOf(err) != policy.Conflict {
		t.Fatal(err)
	}
	want := fork.Conflict{Path: "src/a.go", Type: fork.BothModified, Base: sum("package a\n"), Target: sum("main\n"), Fork: sum("fork\n")}
	if len(res.Conflicts) != 1 || res.Conflicts[0] != want {
		t.Fatalf("conflicts %+v, want %+v", res.Conflicts, want)
	}
	// Resolve in the fork by taking main's version, then merge again.
	write(t, child, "src/a.go", "main\n")
	res, err = fork.Merge(context.Background(), child, main, fork.MergeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Applied) != 0 || len(res.Conflicts) != 0 || !slices.Equal(res.Same, []string{"src/a.go"}) {
		t.Fatalf("second merge %+v, want src/a.go the same and nothing else", res)
	}
	// Main changes b.go after the merge: the fork's b.go is its base now,
	// so a third merge keeps main's change.
	write(t, main, "src/b.go", "main b\n")
	res, err = fork.Merge(context.Background(), child, main, fork.MergeOptions{})
	if err != nil || len(res.Applied)+len(res.Conflicts) != 0 {
		t.Fatalf("third merge %+v, %v: want nothing to do", res, err)
	}
}

// TestMergeJournal checks that the change feed shows a merge as one call
// of the platform.
func TestMergeJournal(t *testing.T) {
	_, main, child := forked(t, nil)
	ctx := context.Background()
	start, err := changes.Read(ctx, main, changes.Query{Prefix: ".", Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		write(t, child, fmt.Sprintf("src/m%d.go", i), "package a\n")
	}
	res, err := fork.Merge(ctx, child, main, fork.MergeOptions{Call: "merge-1"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := changes.Read(ctx, main, changes.Query{Since: start.Cursor, Prefix: ".", Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, c := range got.Changes {
		if c.CallID != "merge-1" || c.Source != store.SourcePlatform {
			t.Errorf("change %+v: want call merge-1 from the platform", c)
		}
		paths = append(paths, c.Path)
	}
	sort.Strings(paths)
	if !slices.Equal(paths, []string{"src/m0.go", "src/m1.go", "src/m2.go"}) || res.Call != "merge-1" {
		t.Fatalf("changes %v (call %s)", paths, res.Call)
	}
}

// TestMergeEitherOrder: two agents fork main, change disjoint and
// overlapping files and merge back with --partial in either order; the
// conflicts are the same paths of the same types, and every file but the
// overlapping ones ends the same.
func TestMergeEitherOrder(t *testing.T) {
	type outcome struct {
		conflicts []string
		files     map[string]string
	}
	run := func(t *testing.T, aFirst bool) outcome {
		v := newVolume(t, t.TempDir())
		main := v.open(t, mainScope, nil)
		seed(t, main)
		a, b := v.open(t, childA, nil), v.open(t, childB, nil)
		for _, ws := range []*store.Workspace{a, b} {
			if _, err := fork.Fork(context.Background(), main, ws, fork.Options{}); err != nil {
				t.Fatal(err)
			}
		}
		apply(t, a, []edit{{"src/a.go", "a's a\n"}, {"src/only-a.go", "a\n"}, {"src/b.go", "a's b\n"}})
		apply(t, b, []edit{{"src/sub/c.go", "b's c\n"}, {"src/only-b.go", "b\n"}, {"src/b.go", "b's b\n"}, {"logs/run.log", ""}})
		order := []*store.Workspace{a, b}
		if !aFirst {
			order = []*store.Workspace{b, a}
		}
		var o outcome
		for _, ws := range order {
			res, err := fork.Merge(context.Background(), ws, main, fork.MergeOptions{Partial: true})
			if err != nil && policy.CodeOf(err) != policy.Conflict {
				t.Fatal(err)
			}
			o.conflicts = append(o.conflicts, conflictTypes(res)...)
		}
		o.files = map[string]string{}
		for _, rel := range []string{"src/a.go", "src/only-a.go", "src/sub/c.go", "src/only-b.go", "logs/run.log"} {
			o.files[rel], _ = read(t, v, mainScope, rel)
		}
		return o
	}
	ab, ba := run(t, true), run(t, false)
	if !slices.Equal(ab.conflicts, []string{"src/b.go:both_modified"}) || !slices.Equal(ab.conflicts, ba.conflicts) {
		t.Errorf("conflicts a then b %v, b then a %v: want src/b.go both_modified in both", ab.conflicts, ba.conflicts)
	}
	for rel, c := range ab.files {
		if ba.files[rel] != c {
			t.Errorf("%s: %q a then b, %q b then a", rel, c, ba.files[rel])
		}
	}
	if ab.files["src/a.go"] != "a's a\n" || ab.files["src/sub/c.go"] != "b's c\n" || ab.files["logs/run.log"] != "" {
		t.Errorf("files %v: want both agents' disjoint changes", ab.files)
	}
}

func TestMergeWrongTarget(t *testing.T) {
	v, _, child := forked(t, nil)
	other := v.open(t, childB, nil)
	_, err := fork.Merge(context.Background(), child, other, fork.MergeOptions{})
	if policy.CodeOf(err) != policy.InvalidInput || !strings.Contains(err.Error(), "merge it into sp/ag/se") {
		t.Fatalf("err %v, want invalid_input naming the source", err)
	}
	_, err = fork.Merge(context.Background(), other, child, fork.MergeOptions{})
	if policy.CodeOf(err) != policy.NotFound {
		t.Fatalf("err %v, want not_found for a scope that is no fork", err)
	}
}

// TestMergeJSONRecord: a fork whose record loomfs wrote in the JSON
// format, before the line format, merges as any other, and the merge
// writes its record again in the line format, with the merged file's new
// base and every other entry as it was.
func TestMergeJSONRecord(t *testing.T) {
	v, main, child := forked(t, nil)
	old, err := fork.ReadRecord(v.vol, childA)
	if err != nil {
		t.Fatal(err)
	}
	old.Version = 1
	b, err := json.Marshal(old)
	if err != nil {
		t.Fatal(err)
	}
	state, err := v.vol.ScopeState(childA)
	if err != nil {
		t.Fatal(err)
	}
	defer state.Close()
	record := filepath.Join("/proc/self/fd", strconv.Itoa(int(state.Fd())), fork.RecordFile)
	if err := os.WriteFile(record, b, 0o600); err != nil {
		t.Fatal(err)
	}
	write(t, child, "src/a.go", "package a // fork\n")
	res, err := fork.Merge(context.Background(), child, main, fork.MergeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := appliedOps(res); !slices.Equal(got, []string{"src/a.go:write"}) {
		t.Fatalf("applied %v, want src/a.go:write alone", got)
	}
	if got, _ := read(t, v, mainScope, "src/a.go"); got != "package a // fork\n" {
		t.Fatalf("main's src/a.go %q, want the fork's", got)
	}
	b, err = os.ReadFile(record)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(b), `{"version":2,`) {
		t.Fatalf("record after the merge starts %.40q, want the line format's head", b)
	}
	rec, err := fork.ReadRecord(v.vol, childA)
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Entries) != len(old.Entries) {
		t.Fatalf("%d entries after the merge, %d before", len(rec.Entries), len(old.Entries))
	}
	for i, e := range rec.Entries {
		switch {
		case e.Path == "src/a.go" && e.SHA256 != sum("package a // fork\n"):
			t.Errorf("src/a.go's base %s, want the merged content's", e.SHA256)
		case e.Path != "src/a.go" && e != old.Entries[i]:
			t.Errorf("entry %+v, was %+v", e, old.Entries[i])
		}
	}
	res, err = fork.Merge(context.Background(), child, main, fork.MergeOptions{})
	if err != nil || len(res.Applied)+len(res.Conflicts)+len(res.Same) != 0 {
		t.Fatalf("second merge %+v, %v: want nothing to do", res, err)
	}
}

// TestMergeFailedKeepsRecord: the fork's next record is written while a
// merge's changes are applied; a merge whose change set is refused leaves
// the record as it was and nothing beside it, and one that succeeds puts
// the new record in place, again with nothing beside it.
func TestMergeFailedKeepsRecord(t *testing.T) {
	std, _ := policy.Preset("standard")
	small := *std
	small.Limits.TextBytes = 100 // the seed's files are smaller
	v := newVolume(t, t.TempDir())
	main := v.open(t, mainScope, &small)
	seed(t, main)
	child := v.open(t, childA, nil)
	if _, err := fork.Fork(context.Background(), main, child, fork.Options{}); err != nil {
		t.Fatal(err)
	}
	state, err := v.vol.ScopeState(childA)
	if err != nil {
		t.Fatal(err)
	}
	defer state.Close()
	dir := filepath.Join("/proc/self/fd", strconv.Itoa(int(state.Fd())))
	record := filepath.Join(dir, fork.RecordFile)
	before, err := os.ReadFile(record)
	if err != nil {
		t.Fatal(err)
	}
	beside := func() []string {
		t.Helper()
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range ents {
			if strings.Contains(e.Name(), "tmp") {
				out = append(out, e.Name())
			}
		}
		return out
	}

	write(t, child, "src/a.go", strings.Repeat("// too large for main\n", 10))
	write(t, child, "src/new.go", "package a\n")
	if _, err := fork.Merge(context.Background(), child, main, fork.MergeOptions{}); policy.CodeOf(err) != policy.TooLarge {
		t.Fatalf("err %v, want too_large from the target's text limit", err)
	}
	if after, err := os.ReadFile(record); err != nil || string(after) != string(before) {
		t.Fatalf("the record changed in a merge that applied nothing (%v)", err)
	}
	if got := beside(); len(got) > 0 {
		t.Fatalf("left beside the record: %v", got)
	}
	if got, _ := read(t, v, mainScope, "src/new.go"); got != "" {
		t.Fatal("a refused change set applied src/new.go")
	}

	write(t, child, "src/a.go", "package a // fork\n")
	if _, err := fork.Merge(context.Background(), child, main, fork.MergeOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := beside(); len(got) > 0 {
		t.Fatalf("left beside the record: %v", got)
	}
	rec, err := fork.ReadRecord(v.vol, childA)
	if err != nil {
		t.Fatal(err)
	}
	bases := map[string]string{}
	for _, e := range rec.Entries {
		bases[e.Path] = e.SHA256
	}
	if bases["src/a.go"] != sum("package a // fork\n") || bases["src/new.go"] != sum("package a\n") {
		t.Fatalf("bases after the merge: src/a.go %s, src/new.go %s; want the merged contents'", bases["src/a.go"], bases["src/new.go"])
	}
	res, err := fork.Merge(context.Background(), child, main, fork.MergeOptions{})
	if err != nil || len(res.Applied)+len(res.Conflicts)+len(res.Same) != 0 {
		t.Fatalf("second merge %+v, %v: want nothing to do", res, err)
	}
}
