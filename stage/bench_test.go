package stage_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentloom/loomfs/stage"
)

// BenchmarkStage stages a tree of small files and one large file into
// data/ (each round replaces what the last staged).
func BenchmarkStage(b *testing.B) {
	for _, c := range []struct {
		name  string
		files int
		size  int
	}{
		{"100x4KiB", 100, 4 << 10},
		{"1x64MiB", 1, 64 << 20},
	} {
		b.Run(c.name, func(b *testing.B) {
			e := newEnv(b, nil)
			src := b.TempDir()
			body := make([]byte, c.size)
			for i := range c.files {
				if err := os.WriteFile(filepath.Join(src, fmt.Sprintf("f%03d", i)), body, 0o600); err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(int64(c.files * c.size))
			for b.Loop() {
				res, err := e.door.Stage(context.Background(), "data", stage.Path(src))
				if err != nil || len(res.Refused) > 0 {
					b.Fatal(err, res.Refused)
				}
			}
		})
	}
}

// BenchmarkCollect collects 100 files of 4 KiB from output/ as a tar
// stream.
func BenchmarkCollect(b *testing.B) {
	e := newEnv(b, nil)
	src := b.TempDir()
	for i := range 100 {
		os.WriteFile(filepath.Join(src, fmt.Sprintf("f%03d", i)), make([]byte, 4<<10), 0o600)
	}
	if _, err := e.door.Stage(context.Background(), "output", stage.Path(src)); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(100 * 4 << 10)
	for b.Loop() {
		ts := stage.ToTar(io.Discard)
		c, err := e.door.Collect(context.Background(), "output", ts)
		if err != nil || len(c.Collected) != 100 {
			b.Fatal(err)
		}
		ts.Close()
	}
}
