package policy

import "sort"

// Built-in policies. "open" is the default layout: everything rw, default
// limits. "standard" is the seed-001 layout (SPEC §3.3): source in src/,
// read-only inputs in data/, write-only products in output/ whose deletion
// or replacement needs confirmation, logs/, a capped tmp/ cleared at the
// end of each run, and a hidden .meta/ for the platform; each of them is
// made at first use.
var presets = map[string]func() *Policy{
	"open": Default,
	"standard": func() *Policy {
		p := Default()
		must(p.SetRules([]Rule{
			{Prefix: "src", Mode: ModeRW},
			{Prefix: "data", Mode: ModeRO},
			{Prefix: "output", Mode: ModeWO},
			{Prefix: "logs", Mode: ModeRW},
			{Prefix: "tmp", Mode: ModeRW},
			{Prefix: ".meta", Mode: ModeHidden},
		}))
		must(p.SetSubtrees([]Subtree{
			{Prefix: "output", Confirm: []Op{OpDelete, OpWrite}},
			{Prefix: "tmp", MaxBytes: 512 << 20, MaxFiles: 10_000, Temporary: true},
		}))
		must(p.SetLayout([]string{"src", "data", "output", "logs", "tmp", ".meta"}))
		return p
	},
}

// Preset returns a fresh copy of the built-in policy called name.
func Preset(name string) (*Policy, bool) {
	f, ok := presets[name]
	if !ok {
		return nil, false
	}
	return f(), true
}

// PresetNames lists the built-in policies.
func PresetNames() []string {
	var out []string
	for name := range presets {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}
