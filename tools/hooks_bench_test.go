package tools

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/hooks"
	"github.com/agentloom/loomfs/policy"
)

// BenchmarkHookChainWrite: the cost of the hooks on a 4 KiB workspace_write
// with a real audit log (issue 48). Each iteration writes once through a
// toolbox without hooks and once through each other: an empty chain, one
// Go hook before and after that allow everything, and one command hook
// ("true"); interleaved, each first in turn, so a machine's load weighs on
// all alike. It
// reports each one's p50 and its ratio to the write without hooks.
func BenchmarkHookChainWrite(b *testing.B) {
	allow := &hooks.Chain{
		Before: []hooks.Before{{Name: "allow", Func: func(context.Context, hooks.Call) (hooks.Verdict, error) { return hooks.Verdict{}, nil }}},
		After:  []hooks.After{{Name: "see", Func: func(context.Context, hooks.Outcome) error { return nil }}},
	}
	command := &hooks.Chain{Before: []hooks.Before{hooks.CommandBefore(policy.HookCommand{Command: []string{"true"}, Timeout: 5 * time.Second})}}
	variants := []struct {
		name  string
		chain *hooks.Chain
	}{{"none", nil}, {"empty", &hooks.Chain{}}, {"go", allow}, {"command", command}}
	content := strings.Repeat("x", 4096)
	in := mustJSON(map[string]any{"path": "f", "content": content})
	boxes := make([]*Toolbox, len(variants))
	for i, v := range variants {
		tb, _ := newBox(b, nil)
		log, err := audit.Open(b.TempDir(), audit.Options{Node: "bench"})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { log.Close() })
		tb.Audit, tb.Hooks = log, v.chain
		boxes[i] = tb
	}
	took := make([][]time.Duration, len(variants))
	for n := 0; b.Loop(); n++ {
		// Each starts the round in turn: a call's tail (its unlock, in a
		// goroutine of its own) weighs on the next call.
		for k := range boxes {
			i := (n + k) % len(boxes)
			tb := boxes[i]
			begun := time.Now()
			if _, err := tb.Call(context.Background(), Write, "", in); err != nil {
				b.Fatal(err)
			}
			took[i] = append(took[i], time.Since(begun))
		}
	}
	p50 := func(d []time.Duration) float64 {
		s := slices.Clone(d)
		slices.Sort(s)
		return float64(s[len(s)/2].Microseconds())
	}
	base := p50(took[0])
	for i, v := range variants {
		b.ReportMetric(p50(took[i]), v.name+"-p50-µs")
		if i > 0 {
			b.ReportMetric(p50(took[i])/base, v.name+"/none")
		}
	}
}
