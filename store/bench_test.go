package store_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/agentloom/loomfs/nodeid"
	"github.com/agentloom/loomfs/store"
)

var benchSizes = []int{4 << 10, 1 << 20}

// benchWorkspace opens a scope on a fresh local volume under the test's
// temporary directory (set TMPDIR to measure another disk).
func benchWorkspace(b *testing.B) *store.Workspace {
	b.Helper()
	ctx := context.Background()
	vol, err := store.OpenVolume(ctx, store.Config{Root: filepath.Join(b.TempDir(), "root")})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { vol.Close() })
	ws, err := vol.Open(ctx, mainScope, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ws.Close() })
	return ws
}

func BenchmarkReadFile(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(sizeName(size), func(b *testing.B) {
			ws := benchWorkspace(b)
			ctx := context.Background()
			if _, err := ws.WriteFile(ctx, "f", make([]byte, size), nil); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := ws.ReadFile(ctx, "f"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkWriteFile measures the atomic replace (temp file, fsync,
// rename, dir fsync), with and without the expected_sha256 check that
// hashes the current content first.
func BenchmarkWriteFile(b *testing.B) {
	for _, size := range benchSizes {
		for _, withExpected := range []bool{false, true} {
			name := sizeName(size) + "/no_expected"
			if withExpected {
				name = sizeName(size) + "/expected_sha256"
			}
			b.Run(name, func(b *testing.B) {
				ws := benchWorkspace(b)
				ctx := context.Background()
				data := make([]byte, size)
				res, err := ws.WriteFile(ctx, "f", data, nil)
				if err != nil {
					b.Fatal(err)
				}
				cur := res.SHA256
				b.SetBytes(int64(size))
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					data[0] = byte(i) // a new content every time
					i++
					var expected *string
					if withExpected {
						expected = &cur
					}
					res, err := ws.WriteFile(ctx, "f", data, expected)
					if err != nil {
						b.Fatal(err)
					}
					cur = res.SHA256
				}
			})
		}
	}
}

func sizeName(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%dKiB", n>>10)
}

// BenchmarkFenceLengths measures what a fence adds to measure a node's
// records (Volume.FenceLengths): a walk of every scope's state directory
// on a volume of n scopes, each with a call log and a change journal file
// of the node, one scope at a time and 16 at once (set TMPDIR to measure
// another disk, e.g. a CephFS mount).
func BenchmarkFenceLengths(b *testing.B) {
	for _, n := range []int{100, 1000} {
		b.Run(fmt.Sprintf("scopes=%d", n), func(b *testing.B) {
			b.Setenv(nodeid.Env, "node-a")
			ctx := context.Background()
			vol, err := store.OpenVolume(ctx, store.Config{Root: filepath.Join(b.TempDir(), "root")})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { vol.Close() })
			for i := range n {
				ws, err := vol.Open(ctx, store.Scope{Space: "sp", Agent: "ag", Session: fmt.Sprintf("s%d", i)}, nil)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := ws.BeginCall(ctx, "c", "workspace_write", nil); err != nil {
					b.Fatal(err)
				}
				if _, err := ws.WriteFile(ctx, "f", []byte("x"), nil); err != nil {
					b.Fatal(err)
				}
				ws.Close()
			}
			for _, workers := range []int{1, 16} {
				b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
					defer store.SetFenceWorkers(workers)()
					for b.Loop() {
						l, err := vol.FenceLengths("node-a")
						if err != nil || len(l.Calls) != n || len(l.Journals) != n {
							b.Fatalf("FenceLengths: %d call logs, %d journal files, %v; want %d each", len(l.Calls), len(l.Journals), err, n)
						}
					}
				})
			}
		})
	}
}
