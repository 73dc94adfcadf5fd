package snapshot_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/agentloom/loomfs/snapshot"
)

// BenchmarkIncremental times a snapshot of a 10,000-file tree after one
// file changed: the cost an end-of-run snapshot has when little changed.
func BenchmarkIncremental(b *testing.B) {
	ctx := context.Background()
	s := newScope(b)
	s.tree(b, 10_000)
	s.waitTick(b)
	if _, err := snapshot.Create(ctx, s.ws, snapshot.Options{}); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := range b.N {
		s.change(b, "src/d00/e0/f00000.txt", []byte(fmt.Sprint("change ", i)))
		m, err := snapshot.Create(ctx, s.ws, snapshot.Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(m.NewBytes), "new-bytes/op")
	}
}
