package main

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestImageCommandUsage(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string // in stdout+stderr
	}{
		{"help", []string{"image", "build", "--help"}, exitOK, "no image is pulled"},
		{"no subcommand", []string{"image"}, exitUsage, "missing subcommand"},
		{"extra argument", []string{"image", "build", "extra"}, exitUsage, "unknown command"},
		{"bad tag", []string{"image", "build", "--tag", "Bad Tag"}, exitUsage, "image tag"},
		{"root user", []string{"image", "build", "--user", "0:0"}, exitUsage, "never run as root"},
		{"unknown flag", []string{"image", "build", "--pull"}, exitUsage, "unknown flag"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errs, code := runLoomfs(t, tc.args...)
			if code != tc.code || !strings.Contains(out+errs, tc.want) {
				t.Fatalf("exit %d (want %d); output %q %q lacks %q", code, tc.code, out, errs, tc.want)
			}
		})
	}
}

func TestImageBuildRefusesRemoteEngine(t *testing.T) {
	t.Setenv("AGENT_LOOM_DOCKER_HOST", "tcp://127.0.0.1:2375")
	_, errs, code := runLoomfs(t, "image", "build", "--minimal")
	if code != exitRefused || !strings.Contains(errs, "local unix:// socket") {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
}

// TestImageBuildKeepsExisting needs the local engine; building the minimal
// image takes seconds when it is missing.
func TestImageBuildKeepsExisting(t *testing.T) {
	if _, errs, code := runLoomfs(t, "image", "build", "--minimal"); code != exitOK {
		t.Fatalf("first build: exit %d, %s", code, errs)
	}
	out, errs, code := runLoomfs(t, "--json", "image", "build", "--minimal")
	if code != exitOK || !strings.Contains(errs, "already exists") {
		t.Fatalf("second build: exit %d, stderr %q", code, errs)
	}
	var info struct {
		Tag   string `json:"tag"`
		ID    string `json:"id"`
		Built bool   `json:"built"`
	}
	if err := json.Unmarshal([]byte(out), &info); err != nil || info.Tag != "loomfs-sandbox-min:latest" || info.Built || !strings.HasPrefix(info.ID, "sha256:") {
		t.Fatalf("json %q: %+v, %v", out, info, err)
	}
}
