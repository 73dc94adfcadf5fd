package tools

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// BenchmarkPatch20Files changes one line in each of 20 files: in one
// workspace_apply_patch (one lock, one intent record), against 20
// workspace_edit calls (20 locks, 20 atomic replaces). One op is all 20
// files, and the next op changes them back.
func BenchmarkPatch20Files(b *testing.B) {
	const n = 20
	setup := func(b *testing.B) *Toolbox {
		tb, root := newBox(b, nil)
		for i := range n {
			body := strings.Repeat(fmt.Sprintf("line %d of a file\n", i), 200)
			os.WriteFile(filepath.Join(root, fmt.Sprintf("f%02d.txt", i)), []byte("state A\n"+body), 0o600)
		}
		return tb
	}
	from, to := []string{"state A", "state B"}, []string{"state B", "state A"}
	b.Run("apply_patch", func(b *testing.B) {
		tb := setup(b)
		patches := make([]json.RawMessage, 2)
		for k := range 2 {
			var p strings.Builder
			p.WriteString("*** Begin Patch\n")
			for i := range n {
				fmt.Fprintf(&p, "*** Update File: f%02d.txt\n@@\n-%s\n+%s\n", i, from[k], to[k])
			}
			p.WriteString("*** End Patch")
			patches[k], _ = json.Marshal(map[string]string{"patch": p.String()})
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if _, err := tb.Call(context.Background(), ApplyPatch, "", patches[i%2]); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("20_edits", func(b *testing.B) {
		tb := setup(b)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			for f := range n {
				in, _ := json.Marshal(map[string]string{"path": fmt.Sprintf("f%02d.txt", f), "old_text": from[i%2], "new_text": to[i%2]})
				if _, err := tb.Call(context.Background(), Edit, "", in); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}
