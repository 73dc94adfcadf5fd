package store

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/agentloom/loomfs/policy"
)

// LayoutVersion is the on-disk layout this package reads and writes
// (SPEC §2.1). It is part of every scope hash.
const LayoutVersion = 1

// MaxIDBytes bounds every id of a scope.
const MaxIDBytes = 128

// Scope names one workspace: a session's main scope, or when Run and
// Instance are set, one child instance of one run. The ids come from the
// platform's authorised run record, never from a model.
type Scope struct {
	Space    string `json:"space"`
	Agent    string `json:"agent"`
	Session  string `json:"session"`
	Run      string `json:"run,omitempty"`
	Instance string `json:"instance,omitempty"`
}

// ParseScope parses SPACE/AGENT/SESSION or SPACE/AGENT/SESSION/RUN/INSTANCE.
func ParseScope(s string) (Scope, error) {
	parts := strings.Split(s, "/")
	var sc Scope
	switch len(parts) {
	case 3:
		sc = Scope{Space: parts[0], Agent: parts[1], Session: parts[2]}
	case 5:
		sc = Scope{Space: parts[0], Agent: parts[1], Session: parts[2], Run: parts[3], Instance: parts[4]}
	default:
		return Scope{}, policy.Errorf(policy.InvalidInput, "scope %q: want SPACE/AGENT/SESSION or SPACE/AGENT/SESSION/RUN/INSTANCE", s)
	}
	return sc, sc.Validate()
}

// Main reports whether s is a session's main scope.
func (s Scope) Main() bool { return s.Run == "" && s.Instance == "" }

// String returns the form ParseScope reads.
func (s Scope) String() string {
	if s.Main() {
		return s.Space + "/" + s.Agent + "/" + s.Session
	}
	return s.Space + "/" + s.Agent + "/" + s.Session + "/" + s.Run + "/" + s.Instance
}

// Validate checks every id against a conservative charset and length.
func (s Scope) Validate() error {
	ids := []struct{ name, v string }{{"space", s.Space}, {"agent", s.Agent}, {"session", s.Session}}
	if !s.Main() {
		ids = append(ids, struct{ name, v string }{"run", s.Run}, struct{ name, v string }{"instance", s.Instance})
	}
	for _, id := range ids {
		if err := ValidateID(id.name, id.v); err != nil {
			return err
		}
	}
	return nil
}

// ValidateID checks one id: 1–128 bytes of [A-Za-z0-9._-], not starting
// with a dot or a dash.
func ValidateID(kind, id string) error {
	if id == "" || len(id) > MaxIDBytes {
		return policy.Errorf(policy.InvalidInput, "%s id must be 1–%d bytes", kind, MaxIDBytes)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' ||
			(i > 0 && (c == '.' || c == '-'))
		if !ok {
			return policy.Errorf(policy.InvalidInput, "%s id %q: only letters, digits, '_', and (not first) '.' and '-' are allowed", kind, strings.ToValidUTF8(id, "?"))
		}
	}
	return nil
}

// Hash identifies the scope on every node. It is derived from the layout
// version and the ids only, never from a host path, so nodes that mount the
// volume at different paths agree on it (SPEC §2.1, §7.2).
func (s Scope) Hash() string {
	h := sha256.New()
	fmt.Fprintf(h, "loomfs-scope\x00v%d\x00%s\x00%s\x00%s\x00%s\x00%s", LayoutVersion, s.Space, s.Agent, s.Session, s.Run, s.Instance)
	return hex.EncodeToString(h.Sum(nil))[:32]
}

// Dir is the scope's directory relative to the volume root.
func (s Scope) Dir() string {
	d := "spaces/" + s.Space + "/agents/" + s.Agent + "/sessions/" + s.Session
	if s.Main() {
		return d + "/main"
	}
	return d + "/runs/" + s.Run + "/children/" + s.Instance
}
