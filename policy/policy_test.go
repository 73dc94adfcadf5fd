package policy_test

import (
	"strings"
	"testing"

	"github.com/agentloom/loomfs/policy"
)

// seedPreset is the seed-001 layout of SPEC §3.3, plus rules that probe
// prefix boundaries and longest-prefix-wins.
var seedPreset = []policy.Rule{
	{Prefix: "src", Mode: policy.ModeRW},
	{Prefix: "data", Mode: policy.ModeRO},
	{Prefix: "output", Mode: policy.ModeWO},
	{Prefix: "logs/", Mode: policy.ModeRW},
	{Prefix: "./tmp", Mode: policy.ModeRW},
	{Prefix: ".meta", Mode: policy.ModeHidden},
	{Prefix: "data/scratch", Mode: policy.ModeRW},
	{Prefix: "data/scratch/frozen", Mode: policy.ModeRO},
	{Prefix: "src/secret", Mode: policy.ModeHidden},
}

// modeOps is what each mode allows for each op (SPEC §3.3), written out
// in full so that the table, not the code under test, is the reference.
var modeOps = map[policy.Mode]map[policy.Op]policy.Code{
	policy.ModeRW: {},
	policy.ModeRO: {
		policy.OpWrite:   policy.ReadOnly,
		policy.OpCreate:  policy.ReadOnly,
		policy.OpDelete:  policy.ReadOnly,
		policy.OpRename:  policy.ReadOnly,
		policy.OpSetattr: policy.ReadOnly,
	},
	policy.ModeWO: {
		policy.OpRead: policy.PermissionDenied,
	},
	policy.ModeHidden: {
		policy.OpStat:    policy.NotFound,
		policy.OpList:    policy.NotFound,
		policy.OpRead:    policy.NotFound,
		policy.OpWrite:   policy.NotFound,
		policy.OpCreate:  policy.NotFound,
		policy.OpDelete:  policy.NotFound,
		policy.OpRename:  policy.NotFound,
		policy.OpSetattr: policy.NotFound,
	},
}

func TestModeRules(t *testing.T) {
	tests := []struct {
		name   string
		rules  []policy.Rule
		rel    string
		mode   policy.Mode
		listed bool
	}{
		{name: "no rule is rw", rel: "anything/at/all", mode: policy.ModeRW, listed: true},
		{name: "rw subtree", rules: seedPreset, rel: "src/main.go", mode: policy.ModeRW, listed: true},
		{name: "ro subtree: the directory itself", rules: seedPreset, rel: "data", mode: policy.ModeRO, listed: true},
		{name: "ro subtree: deep inside", rules: seedPreset, rel: "data/a/b/c.csv", mode: policy.ModeRO, listed: true},
		{name: "data vs database prefix boundary", rules: seedPreset, rel: "database", mode: policy.ModeRW, listed: true},
		{name: "data vs database prefix boundary inside", rules: seedPreset, rel: "database/x", mode: policy.ModeRW, listed: true},
		{name: "data vs data.csv prefix boundary", rules: seedPreset, rel: "data.csv", mode: policy.ModeRW, listed: true},
		{name: "wo subtree", rules: seedPreset, rel: "output/report.md", mode: policy.ModeWO, listed: true},
		{name: "rule given with trailing slash", rules: seedPreset, rel: "logs/run.log", mode: policy.ModeRW, listed: true},
		{name: "rule given with dot prefix", rules: seedPreset, rel: "tmp/x", mode: policy.ModeRW, listed: true},
		{name: "hidden subtree: the directory itself", rules: seedPreset, rel: ".meta", mode: policy.ModeHidden, listed: false},
		{name: "hidden subtree: inside", rules: seedPreset, rel: ".meta/index.json", mode: policy.ModeHidden, listed: false},
		{name: "longest prefix wins: rw inside ro", rules: seedPreset, rel: "data/scratch/x", mode: policy.ModeRW, listed: true},
		{name: "longest prefix wins: ro inside rw inside ro", rules: seedPreset, rel: "data/scratch/frozen/x", mode: policy.ModeRO, listed: true},
		{name: "longest prefix wins: prefix boundary of the longer rule", rules: seedPreset, rel: "data/scratchpad", mode: policy.ModeRO, listed: true},
		{name: "longest prefix wins: hidden inside rw", rules: seedPreset, rel: "src/secret/key", mode: policy.ModeHidden, listed: false},
		{name: "longest prefix wins: sibling of hidden", rules: seedPreset, rel: "src/secrets", mode: policy.ModeRW, listed: true},
		{name: "root rule applies everywhere", rules: []policy.Rule{{Prefix: ".", Mode: policy.ModeRO}}, rel: "a/b", mode: policy.ModeRO, listed: true},
		{name: "longest prefix wins over the root rule of the same length",
			rules: []policy.Rule{{Prefix: ".", Mode: policy.ModeRO}, {Prefix: "o", Mode: policy.ModeRW}},
			rel:   "o/x", mode: policy.ModeRW, listed: true},
		{name: "longest prefix wins over the root rule given last",
			rules: []policy.Rule{{Prefix: "o", Mode: policy.ModeWO}, {Prefix: ".", Mode: policy.ModeHidden}},
			rel:   "o/x", mode: policy.ModeWO, listed: true},
		{name: "root rule below a longer rule",
			rules: []policy.Rule{{Prefix: ".", Mode: policy.ModeHidden}, {Prefix: "pub", Mode: policy.ModeRW}},
			rel:   "private", mode: policy.ModeHidden, listed: false},
		{name: "agentloom prefix is never listed", rel: "a/.agentloom-tmp-1", mode: policy.ModeRW, listed: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := policy.Default()
			if err := p.SetRules(tc.rules); err != nil {
				t.Fatalf("SetRules: %v", err)
			}
			if got := p.ModeOf(tc.rel); got != tc.mode {
				t.Errorf("ModeOf(%q) = %q, want %q", tc.rel, got, tc.mode)
			}
			if got := p.Listed(tc.rel); got != tc.listed {
				t.Errorf("Listed(%q) = %v, want %v", tc.rel, got, tc.listed)
			}
			for _, op := range allOps() {
				want := modeOps[tc.mode][op]
				err := p.Check(op, tc.rel)
				if strings.Contains(tc.rel, ".agentloom-") && (op == policy.OpCreate || op == policy.OpRename) {
					want = policy.InvalidPath
				}
				if got := policy.CodeOf(err); got != want {
					t.Errorf("Check(%s, %q) = %v (code %q), want code %q", op, tc.rel, err, got, want)
				}
				if want == policy.ReadOnly && !strings.Contains(err.Error(), "read-only") {
					t.Errorf("Check(%s, %q): message %q does not say read-only", op, tc.rel, err)
				}
				if want == policy.PermissionDenied && !strings.Contains(err.Error(), "write-only") {
					t.Errorf("Check(%s, %q): message %q does not say write-only", op, tc.rel, err)
				}
			}
		})
	}
}

func TestCheckRootAndReservedNames(t *testing.T) {
	main := policy.Default().WithScope(true)
	child := policy.Default().WithScope(false)
	tests := []struct {
		name string
		pol  *policy.Policy
		op   policy.Op
		rel  string
		want policy.Code
	}{
		{name: "create the workspace root", pol: child, op: policy.OpCreate, rel: ".", want: policy.Exists},
		{name: "rename the workspace root", pol: child, op: policy.OpRename, rel: ".", want: policy.Exists},
		{name: "list the workspace root", pol: main, op: policy.OpList, rel: ".", want: ""},
		{name: "create subagents at the top of a main scope", pol: main, op: policy.OpCreate, rel: "subagents", want: policy.InvalidPath},
		{name: "rename onto subagents at the top of a main scope", pol: main, op: policy.OpRename, rel: "subagents", want: policy.InvalidPath},
		{name: "create subagents in a child scope", pol: child, op: policy.OpCreate, rel: "subagents", want: ""},
		{name: "create subagents deeper in a main scope", pol: main, op: policy.OpCreate, rel: "a/subagents", want: ""},
		{name: "create under the agentloom prefix", pol: child, op: policy.OpCreate, rel: "a/.agentloom-tmp-x", want: policy.InvalidPath},
		{name: "create a top-level tilde name", pol: child, op: policy.OpCreate, rel: "~", want: policy.InvalidPath},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := policy.CodeOf(tc.pol.Check(tc.op, tc.rel)); got != tc.want {
				t.Errorf("Check(%s, %q) code = %q, want %q", tc.op, tc.rel, got, tc.want)
			}
		})
	}
}

func TestSetRulesRefuses(t *testing.T) {
	tests := []struct {
		name  string
		rules []policy.Rule
	}{
		{name: "dot-dot component", rules: []policy.Rule{{Prefix: "../x", Mode: policy.ModeRO}}},
		{name: "absolute path", rules: []policy.Rule{{Prefix: "/data", Mode: policy.ModeRO}}},
		{name: "empty path", rules: []policy.Rule{{Prefix: "", Mode: policy.ModeRO}}},
		{name: "agentloom prefix", rules: []policy.Rule{{Prefix: ".agentloom-locks", Mode: policy.ModeRW}}},
		{name: "unknown mode", rules: []policy.Rule{{Prefix: "data", Mode: "rx"}}},
		{name: "empty mode", rules: []policy.Rule{{Prefix: "data", Mode: ""}}},
		{name: "prefix given twice", rules: []policy.Rule{{Prefix: "data", Mode: policy.ModeRO}, {Prefix: "data", Mode: policy.ModeRW}}},
		{name: "prefix given twice in two spellings", rules: []policy.Rule{{Prefix: "data/", Mode: policy.ModeRO}, {Prefix: "./data", Mode: policy.ModeRW}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := policy.Default()
			if err := p.SetRules([]policy.Rule{{Prefix: "keep", Mode: policy.ModeRO}}); err != nil {
				t.Fatal(err)
			}
			if err := p.SetRules(tc.rules); err == nil {
				t.Fatalf("SetRules(%v) accepted", tc.rules)
			}
			// A refused rule set leaves the rules in force untouched.
			if got := p.ModeOf("keep/x"); got != policy.ModeRO {
				t.Errorf("after a refused SetRules, ModeOf(keep/x) = %q, want ro", got)
			}
		})
	}
}

func TestWithScopeCopies(t *testing.T) {
	base := policy.Default()
	if err := base.SetRules([]policy.Rule{{Prefix: "data", Mode: policy.ModeRO}}); err != nil {
		t.Fatal(err)
	}
	main := base.WithScope(true)
	if !main.MainScope || base.MainScope {
		t.Fatalf("WithScope(true): MainScope = %v, base %v", main.MainScope, base.MainScope)
	}
	if err := main.SetRules([]policy.Rule{{Prefix: "data", Mode: policy.ModeHidden}}); err != nil {
		t.Fatal(err)
	}
	main.Rules[0].Mode = policy.ModeWO
	if got := base.ModeOf("data"); got != policy.ModeRO {
		t.Errorf("changing a scope's copy changed the base policy: ModeOf(data) = %q", got)
	}
}

func TestCheckQuota(t *testing.T) {
	const (
		KiB = int64(1) << 10
		MiB = int64(1) << 20
		GiB = int64(1) << 30
	)
	gib := float64(GiB)
	used499 := int64(4.99 * gib)
	tests := []struct {
		name     string
		limits   policy.Limits
		used     policy.Usage
		addBytes int64
		addFiles int64
		want     string // "" means allowed
	}{
		{
			name:   "workspace total exceeded (the SPEC §3.3 example)",
			limits: policy.Limits{ScopeBytes: 5 * GiB}, used: policy.Usage{Bytes: used499}, addBytes: 20 * MiB,
			want: "quota exceeded: workspace total 5 GiB (used 4.99 GiB, write of 20 MiB refused)",
		},
		{
			name:   "workspace total exceeded by one byte",
			limits: policy.Limits{ScopeBytes: 10 * KiB}, used: policy.Usage{Bytes: 10*KiB - 100}, addBytes: 101,
			want: "quota exceeded: workspace total 10 KiB (used 9.9 KiB, write of 101 B refused)",
		},
		{name: "workspace total reached exactly", limits: policy.Limits{ScopeBytes: 10 * KiB}, used: policy.Usage{Bytes: 10*KiB - 100}, addBytes: 100},
		{name: "shrinking passes over quota", limits: policy.Limits{ScopeBytes: 10 * KiB}, used: policy.Usage{Bytes: 20 * KiB}, addBytes: -1},
		{name: "no growth passes over quota", limits: policy.Limits{ScopeBytes: 10 * KiB, ScopeFiles: 1}, used: policy.Usage{Bytes: 20 * KiB, Files: 5}},
		{name: "zero limit is unlimited", used: policy.Usage{Bytes: 1 << 62, Files: 1 << 40}, addBytes: GiB, addFiles: 1000},
		{
			name:   "file count exceeded",
			limits: policy.Limits{ScopeFiles: 10}, used: policy.Usage{Files: 10}, addFiles: 1,
			want: "quota exceeded: workspace file count 10 (used 10, 1 new refused)",
		},
		{name: "file count reached exactly", limits: policy.Limits{ScopeFiles: 10}, used: policy.Usage{Files: 9}, addFiles: 1},
		{name: "removing files passes over the count", limits: policy.Limits{ScopeFiles: 10}, used: policy.Usage{Files: 50}, addFiles: -1},
		{
			name:   "bytes are checked before the file count",
			limits: policy.Limits{ScopeBytes: MiB, ScopeFiles: 1}, used: policy.Usage{Bytes: MiB, Files: 1}, addBytes: 1, addFiles: 1,
			want: "quota exceeded: workspace total 1 MiB (used 1 MiB, write of 1 B refused)",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.limits.CheckQuota(tc.used, tc.addBytes, tc.addFiles)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("CheckQuota: unexpected error %v", err)
				}
				return
			}
			if policy.CodeOf(err) != policy.QuotaExceeded {
				t.Fatalf("CheckQuota = %v, want code quota_exceeded", err)
			}
			if err.Error() != tc.want {
				t.Errorf("CheckQuota message\n got %q\nwant %q", err.Error(), tc.want)
			}
		})
	}
}

func TestCheckTextAndFileSize(t *testing.T) {
	l := policy.DefaultLimits()
	if l.TextBytes != 2<<20 {
		t.Fatalf("default text limit is %d, SPEC §3.3 says 2 MiB", l.TextBytes)
	}
	if err := l.CheckText("a.txt", 2<<20); err != nil {
		t.Errorf("CheckText at the limit: %v", err)
	}
	err := l.CheckText("big.bin", 3<<20)
	if policy.CodeOf(err) != policy.TooLarge {
		t.Fatalf("CheckText over the limit = %v, want too_large", err)
	}
	for _, s := range []string{"big.bin", "3 MiB", "2 MiB"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("CheckText message %q does not name %q", err, s)
		}
	}
	l.FileBytes = 1 << 30
	if err := l.CheckFileSize("f", 1<<30); err != nil {
		t.Errorf("CheckFileSize at the limit: %v", err)
	}
	err = l.CheckFileSize("f", 1<<30+1<<29)
	if policy.CodeOf(err) != policy.TooLarge || !strings.Contains(err.Error(), "1.5 GiB") || !strings.Contains(err.Error(), "1 GiB") {
		t.Errorf("CheckFileSize over the limit = %v, want too_large naming 1.5 GiB and 1 GiB", err)
	}
	if err := (policy.Limits{}).CheckText("f", 1<<40); err != nil {
		t.Errorf("zero text limit must be unlimited: %v", err)
	}
}

func TestBytes(t *testing.T) {
	gib := float64(1 << 30)
	tests := []struct {
		n    int64
		want string
	}{
		{0, "0 B"},
		{1, "1 B"},
		{1023, "1023 B"},
		{1024, "1 KiB"},
		{1536, "1.5 KiB"},
		{10*1024 + 5, "10 KiB"},
		{2 << 20, "2 MiB"},
		{20 << 20, "20 MiB"},
		{1<<20 + 1<<18, "1.25 MiB"},
		{5 << 30, "5 GiB"},
		{int64(4.99 * gib), "4.99 GiB"},
		{1 << 40, "1 TiB"},
		{1 << 50, "1 PiB"},
		{1 << 60, "1024 PiB"},
		// Rounding up to the next unit says so in that unit.
		{1<<20 - 1, "1 MiB"},
		{1<<30 - 1, "1 GiB"},
		{1<<10*1023 + 1013, "1023.99 KiB"},
	}
	for _, tc := range tests {
		if got := policy.Bytes(tc.n); got != tc.want {
			t.Errorf("Bytes(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
}
