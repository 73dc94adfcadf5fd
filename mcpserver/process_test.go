package mcpserver

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/agentloom/loomfs/tools"
)

// The text of a process's output strips terminal control sequences and
// says what was dropped and where to read on; the raw bytes stay in the
// structured result.
func TestRenderProcessOutput(t *testing.T) {
	code := 0
	for _, tc := range []struct {
		name string
		out  tools.ProcessOutput
		want []string
		not  []string
	}{
		{"colours and cursor moves stripped",
			tools.ProcessOutput{ProcessID: "p-1", Status: tools.StatusRunning, Output: "\x1b[1;31mred\x1b[0m\r\n\x1b]0;title\x07\x1b[2Kdone\r\n", Cursor: 40},
			[]string{"red\ndone\n", "running; cursor 40"}, []string{"\x1b", "\r"}},
		{"dropped bytes said",
			tools.ProcessOutput{ProcessID: "p-2", Status: tools.StatusExited, ExitCode: &code, Output: "tail", DroppedBytes: 4000, Cursor: 5000},
			[]string{"4000 bytes", "exited with code 0", "tail\n"}, nil},
		{"more to read said",
			tools.ProcessOutput{ProcessID: "p-3", Status: tools.StatusRunning, Output: "x", Truncated: true},
			[]string{"more output follows"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, _ := json.Marshal(tc.out)
			text := render(tools.ProcessRead, b)
			for _, w := range tc.want {
				if !strings.Contains(text, w) {
					t.Errorf("text %q lacks %q", text, w)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(text, n) {
					t.Errorf("text %q holds %q", text, n)
				}
			}
		})
	}
}
