package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

// TestToolTimeout: --timeout is the call's budget; a negative one is a
// usage error naming the flag, and a call within its budget answers as
// without one.
func TestToolTimeout(t *testing.T) {
	root := filepath.Join(t.TempDir(), "root")
	base := []string{"--root", root, "tool", "workspace_write", "--scope", "a/b/c", "--input", `{"path":"f","content":"x"}`}
	tests := []struct {
		name    string
		timeout string
		code    int
		want    string
	}{
		{"negative budget refused", "-1s", exitUsage, "--timeout -1s: must be 0 (no budget) or positive"},
		{"no budget", "0", exitOK, `"bytes":1`},
		{"within the budget", "30s", exitOK, `"bytes":1`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := runLoomfs(t, append(base, "--timeout", tc.timeout)...)
			if code != tc.code || !strings.Contains(out+errOut, tc.want) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit %d with %q", code, out, errOut, tc.code, tc.want)
			}
			if code == exitOK && !json.Valid([]byte(out)) {
				t.Fatalf("stdout is not JSON: %q", out)
			}
		})
	}
}
