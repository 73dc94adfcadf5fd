// Command daemonjson registers container runtimes in a Docker engine's
// daemon.json, keeping every other setting of an existing file. It is
// idempotent: it prints "unchanged" and leaves the file alone when every
// entry is already there as given.
//
//	go run ./scripts/daemonjson FILE NAME=PATH[,ARG...]...
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
)

type runtime struct {
	Path        string   `json:"path"`
	RuntimeArgs []string `json:"runtimeArgs,omitempty"`
}

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: daemonjson FILE NAME=PATH[,ARG...]...")
		os.Exit(2)
	}
	changed, err := register(os.Args[1], os.Args[2:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "daemonjson:", err)
		os.Exit(1)
	}
	if changed {
		fmt.Println("changed")
	} else {
		fmt.Println("unchanged")
	}
}

func register(file string, specs []string) (bool, error) {
	conf := map[string]any{}
	data, err := os.ReadFile(file)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return false, err
	case len(bytes.TrimSpace(data)) > 0:
		if err := json.Unmarshal(data, &conf); err != nil {
			return false, fmt.Errorf("%s: %w", file, err)
		}
	}
	runtimes, _ := conf["runtimes"].(map[string]any)
	if runtimes == nil {
		runtimes = map[string]any{}
	}
	changed := false
	for _, s := range specs {
		name, rest, ok := strings.Cut(s, "=")
		if !ok || name == "" || rest == "" {
			return false, fmt.Errorf("%q: want NAME=PATH[,ARG...]", s)
		}
		parts := strings.Split(rest, ",")
		want := runtime{Path: parts[0], RuntimeArgs: parts[1:]}
		b, _ := json.Marshal(want)
		var wantAny any
		json.Unmarshal(b, &wantAny)
		if !reflect.DeepEqual(runtimes[name], wantAny) {
			runtimes[name] = wantAny
			changed = true
		}
	}
	if !changed {
		return false, nil
	}
	conf["runtimes"] = runtimes
	out, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return false, err
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return false, err
	}
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, append(out, '\n'), 0o644); err != nil {
		return false, err
	}
	return true, os.Rename(tmp, file)
}
