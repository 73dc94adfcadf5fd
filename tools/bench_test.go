package tools

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/agentloom/loomfs/audit"
)

// BenchmarkWrite: workspace_write of 4 KiB, with and without CAS, audit
// off and on (a real hash-chained log), side by side.
func BenchmarkWrite(b *testing.B) {
	content := strings.Repeat("x", 4096)
	for _, auditOn := range []bool{false, true} {
		for _, cas := range []bool{false, true} {
			b.Run(fmt.Sprintf("audit=%v/cas=%v", auditOn, cas), func(b *testing.B) {
				tb, _ := newBox(b, nil)
				if auditOn {
					log, err := audit.Open(b.TempDir(), audit.Options{Node: "bench"})
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(func() { log.Close() })
					tb.Audit = log
				}
				res, err := tb.Call(context.Background(), Write, "", mustJSON(map[string]any{"path": "f", "content": content}))
				if err != nil {
					b.Fatal(err)
				}
				var last struct{ SHA256 string }
				json.Unmarshal(res, &last)
				b.SetBytes(int64(len(content)))
				for b.Loop() {
					in := map[string]any{"path": "f", "content": content}
					if cas {
						in["expected_sha256"] = last.SHA256
					}
					if _, err := tb.Call(context.Background(), Write, "", mustJSON(in)); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkEdit: a unique replacement in a 64 KiB file, back and forth.
func BenchmarkEdit(b *testing.B) {
	tb, _ := newBox(b, nil)
	text := strings.Repeat("line of text\n", 5000) + "MARKER\n"
	if _, err := tb.Call(context.Background(), Write, "", mustJSON(map[string]any{"path": "e", "content": text})); err != nil {
		b.Fatal(err)
	}
	pairs := [2][2]string{{"MARKER", "marker"}, {"marker", "MARKER"}}
	for i := 0; b.Loop(); i++ {
		p := pairs[i%2]
		if _, err := tb.Call(context.Background(), Edit, "", mustJSON(map[string]any{"path": "e", "old_text": p[0], "new_text": p[1]})); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRead: workspace_read of a 2,000-line file.
func BenchmarkRead(b *testing.B) {
	tb, _ := newBox(b, nil)
	text := strings.Repeat("some line of text in a file\n", 2000)
	if _, err := tb.Call(context.Background(), Write, "", mustJSON(map[string]any{"path": "r", "content": text})); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		if _, err := tb.Call(context.Background(), Read, "", mustJSON(map[string]any{"path": "r"})); err != nil {
			b.Fatal(err)
		}
	}
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}
