package fork_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentloom/loomfs/fork"
	"github.com/agentloom/loomfs/snapshot"
	"github.com/agentloom/loomfs/store"
)

// benchTree is the shape of Go's src the issue measures against: about
// 11,500 files in 1,300 directories. bench/fork.sh measures the real tree;
// these benchmarks are for profiling the package alone (-cpuprofile).
const (
	benchDirs  = 1300
	benchFiles = 11500
)

// benchMain fills main with the bench tree behind loomfs's back, as
// bench/fork.sh's cp -a does, and snapshots it; it returns the id.
func benchMain(b *testing.B, v *volume, main *store.Workspace) string {
	b.Helper()
	body := strings.Repeat("// a line of Go source, more or less\n", 300)
	for i := range benchFiles {
		d := i % benchDirs
		dir := filepath.Join(v.path(mainScope, "src"), fmt.Sprintf("p%02d", d%40), fmt.Sprintf("d%04d", d))
		if err := os.MkdirAll(dir, 0o700); err != nil {
			b.Fatal(err)
		}
		content := fmt.Sprintf("package p%d\n%s", i, body[:(i*7919)%len(body)])
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%05d.go", i)), []byte(content), 0o600); err != nil {
			b.Fatal(err)
		}
	}
	m, err := snapshot.Create(context.Background(), main, snapshot.Options{Full: true})
	if err != nil {
		b.Fatal(err)
	}
	return m.ID
}

func BenchmarkFork(b *testing.B) {
	v := newVolume(b, b.TempDir())
	main := v.open(b, mainScope, nil)
	id := benchMain(b, v, main)
	b.ResetTimer()
	for i := range b.N {
		child := v.open(b, store.Scope{Space: "sp", Agent: "ag", Session: "se", Run: fmt.Sprintf("b%d", i), Instance: "c"}, nil)
		res, err := fork.Fork(context.Background(), main, child, fork.Options{Snapshot: id})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(res.FillS*1000, "fill-ms")
		b.ReportMetric(res.DataS*1000, "data-ms")
	}
}

// BenchmarkMerge merges 20 files changed in a fork back into main.
func BenchmarkMerge(b *testing.B) {
	v := newVolume(b, b.TempDir())
	main := v.open(b, mainScope, nil)
	benchMain(b, v, main)
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		sc := store.Scope{Space: "sp", Agent: "ag", Session: "se", Run: fmt.Sprintf("m%d", i), Instance: "c"}
		child := v.open(b, sc, nil)
		// A fresh snapshot each round: main holds the last round's merge.
		if _, err := fork.Fork(context.Background(), main, child, fork.Options{}); err != nil {
			b.Fatal(err)
		}
		for j := range 20 {
			p := v.path(sc, fmt.Sprintf("src/p%02d/d%04d/f%05d.go", j%40, j, j))
			f, err := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				b.Fatal(err)
			}
			fmt.Fprintf(f, "// changed in the fork %d\n", i)
			f.Close()
		}
		b.StartTimer()
		res, err := fork.Merge(context.Background(), child, main, fork.MergeOptions{})
		if err != nil {
			b.Fatal(err)
		}
		if len(res.Applied) != 20 {
			b.Fatalf("applied %d, want 20", len(res.Applied))
		}
		b.ReportMetric(res.ScanS*1000, "scan-ms")
	}
}
