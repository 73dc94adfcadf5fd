package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// TestRegister: runtimes are merged into an existing file, other settings
// kept; a second run changes nothing.
func TestRegister(t *testing.T) {
	for _, tc := range []struct {
		name, before string
	}{
		{"no file", ""},
		{"empty file", " \n"},
		{"other settings and runtimes", `{"log-level":"warn","runtimes":{"kata":{"path":"/usr/bin/kata"}}}`},
		{"an old entry replaced", `{"runtimes":{"runsc":{"path":"/usr/bin/runsc"}}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "docker", "daemon.json")
			if tc.before != "" {
				os.MkdirAll(filepath.Dir(file), 0o755)
				os.WriteFile(file, []byte(tc.before), 0o644)
			}
			specs := []string{"runsc=/usr/bin/runsc,--network=none", "plain=/bin/false"}
			if changed, err := register(file, specs); err != nil || !changed {
				t.Fatalf("first run: changed %v, %v", changed, err)
			}
			if changed, err := register(file, specs); err != nil || changed {
				t.Fatalf("second run: changed %v, %v", changed, err)
			}
			var got, before map[string]any
			data, _ := os.ReadFile(file)
			if err := json.Unmarshal(data, &got); err != nil {
				t.Fatal(err)
			}
			json.Unmarshal([]byte(tc.before), &before)
			rt := got["runtimes"].(map[string]any)
			if !reflect.DeepEqual(rt["runsc"], map[string]any{"path": "/usr/bin/runsc", "runtimeArgs": []any{"--network=none"}}) ||
				!reflect.DeepEqual(rt["plain"], map[string]any{"path": "/bin/false"}) {
				t.Errorf("runtimes %v", rt)
			}
			for k, v := range before {
				if k != "runtimes" && !reflect.DeepEqual(got[k], v) {
					t.Errorf("setting %s lost: %v", k, got)
				}
			}
			if tc.name == "other settings and runtimes" && rt["kata"] == nil {
				t.Errorf("other runtime lost: %v", rt)
			}
		})
	}
	if _, err := register(filepath.Join(t.TempDir(), "d.json"), []string{"noequals"}); err == nil {
		t.Error("a malformed spec was accepted")
	}
}
