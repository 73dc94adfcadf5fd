package metrics

import (
	"os/exec"
	"testing"
)

// TestRulesFile: the repository's Prometheus rules pass promtool's check
// and its own unit tests (each alert fires on the series it is about and
// not before its "for").
func TestRulesFile(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found: install Debian's prometheus package (scripts/setup does)")
	}
	for _, args := range [][]string{
		{"check", "rules", "loomfs.rules.yml"},
		{"test", "rules", "loomfs.rules.test.yml"},
	} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = "../deploy"
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %v: %v\n%s", args, err, out)
		}
	}
}
