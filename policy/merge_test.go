package policy_test

import (
	"strings"
	"testing"

	"github.com/agentloom/loomfs/policy"
)

// TestAgentMerge: an agent may merge its fork back itself only when the
// policy file says agent_merge: true; off is the default.
func TestAgentMerge(t *testing.T) {
	tests := []struct {
		name    string
		file    string
		allowed bool
		fileErr string
	}{
		{name: "off by default", file: "preset: standard\n"},
		{name: "off when the file says so", file: "preset: open\nagent_merge: false\n"},
		{name: "on when the file says so", file: "preset: open\nagent_merge: true\n", allowed: true},
		{name: "a value that is no boolean is refused", file: "agent_merge: sometimes\n", fileErr: "agent_merge must be true or false"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pol, err := policy.Parse("p.yaml", []byte(tc.file))
			if tc.fileErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.fileErr) {
					t.Fatalf("err %v, want %q", err, tc.fileErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			err = pol.CheckAgentMerge()
			if tc.allowed != (err == nil) {
				t.Fatalf("CheckAgentMerge: %v, want allowed %v", err, tc.allowed)
			}
			if !tc.allowed && (policy.CodeOf(err) != policy.PermissionDenied || !strings.Contains(err.Error(), "agent_merge")) {
				t.Fatalf("refusal %v: want permission_denied naming agent_merge", err)
			}
		})
	}
	if policy.Default().CheckAgentMerge() == nil {
		t.Fatal("the default policy lets an agent merge")
	}
}
