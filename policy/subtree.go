package policy

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// Subtree is what a policy says of one subtree besides its mode: a cap on
// what it may hold, the operations that need two-step confirmation, and
// whether it is cleared at the end of each run. Unlike modes, where the
// longest prefix wins, every subtree that encloses a path applies to it: a
// cap on tmp/ and one on tmp/big both hold for tmp/big/x, and a deeper
// entry can't lift a confirmation an enclosing one asks for.
type Subtree struct {
	Prefix    string // cleaned path, never "."
	MaxBytes  int64  // bytes of regular files it may hold; 0: no cap
	MaxFiles  int64  // files and directories it may hold, itself included; 0: no cap
	Confirm   []Op   // OpDelete and OpWrite (overwrite) need confirmation here
	Temporary bool   // cleared at the end of each run
	// Publish says the subtree is a run's output, copied to the object
	// store when the run is published ("runs finish --publish").
	Publish bool
}

// ConfirmTTL is how long a confirmation token stays valid.
const ConfirmTTL = 10 * time.Minute

// confirmNames are the words a policy file and the generated texts use for
// the operations that can be marked for confirmation.
var confirmNames = map[Op]string{OpDelete: "delete", OpWrite: "overwrite"}

// ConfirmOp returns the operation a policy file calls name ("delete",
// "overwrite").
func ConfirmOp(name string) (Op, bool) {
	for op, n := range confirmNames {
		if n == name {
			return op, true
		}
	}
	return 0, false
}

// ConfirmName is the policy file's word for op: "delete" or "overwrite".
func ConfirmName(op Op) string { return confirmNames[op] }

// Contains reports whether the cleaned path rel is the subtree or in it.
func (s Subtree) Contains(rel string) bool {
	return rel == s.Prefix || strings.HasPrefix(rel, s.Prefix+"/")
}

// Capped reports whether s limits what its subtree holds.
func (s Subtree) Capped() bool { return s.MaxBytes > 0 || s.MaxFiles > 0 }

// SetSubtrees validates and installs subtrees, sorted by prefix.
func (p *Policy) SetSubtrees(subs []Subtree) error {
	seen := map[string]bool{}
	out := make([]Subtree, 0, len(subs))
	for _, s := range subs {
		prefix, err := CleanPath(s.Prefix, false)
		if err != nil {
			return fmt.Errorf("subtree %q: %w", s.Prefix, err)
		}
		if prefix == "." {
			return fmt.Errorf("subtree %q: the workspace root is limited by the scope limits, not a subtree cap", s.Prefix)
		}
		if seen[prefix] {
			return fmt.Errorf("subtree %q: given twice", s.Prefix)
		}
		seen[prefix] = true
		if s.MaxBytes < 0 || s.MaxFiles < 0 {
			return fmt.Errorf("subtree %q: a cap can't be negative", s.Prefix)
		}
		s.Prefix = prefix
		s.Confirm = append([]Op(nil), s.Confirm...)
		for _, op := range s.Confirm {
			if _, ok := confirmNames[op]; !ok {
				return fmt.Errorf("subtree %q: %s can't be marked for confirmation (want delete or overwrite)", s.Prefix, op)
			}
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Prefix < out[j].Prefix })
	p.Subtrees = out
	return nil
}

// Caps returns the capped subtrees that enclose the cleaned path rel.
func (p *Policy) Caps(rel string) []Subtree {
	var out []Subtree
	for _, s := range p.Subtrees {
		if s.Capped() && s.Contains(rel) {
			out = append(out, s)
		}
	}
	return out
}

// CheckCap refuses a change that adds addBytes and addFiles to a subtree
// holding used. Shrinking changes always pass.
func (s Subtree) CheckCap(used Usage, addBytes, addFiles int64) error {
	if addBytes > 0 && s.MaxBytes > 0 && used.Bytes+addBytes > s.MaxBytes {
		return Errorf(QuotaExceeded, "quota exceeded: %s/ total %s (used %s, write of %s refused); free space there or write elsewhere", s.Prefix, Bytes(s.MaxBytes), Bytes(used.Bytes), Bytes(addBytes))
	}
	if addFiles > 0 && s.MaxFiles > 0 && used.Files+addFiles > s.MaxFiles {
		return Errorf(QuotaExceeded, "quota exceeded: %s/ file count %d (used %d, %d new refused)", s.Prefix, s.MaxFiles, used.Files, addFiles)
	}
	return nil
}

// NeedsConfirm reports whether op at the cleaned path rel needs two-step
// confirmation, and the subtree that asks for it. op is OpDelete for a
// delete (and for moving a file away), OpWrite for replacing or changing
// an existing file; creating a new file never needs it.
func (p *Policy) NeedsConfirm(op Op, rel string) (Subtree, bool) {
	for _, s := range p.Subtrees {
		if !s.Contains(rel) {
			continue
		}
		for _, c := range s.Confirm {
			if c == op {
				return s, true
			}
		}
	}
	return Subtree{}, false
}

// CheckConfirmable refuses op at rel for a door that can't ask twice (the
// filesystem) when the policy marks it for confirmation.
func (p *Policy) CheckConfirmable(op Op, rel string) error {
	s, ok := p.NeedsConfirm(op, rel)
	if !ok {
		return nil
	}
	return Errorf(ConfirmationRequired, "%s %s needs confirmation (policy: %s/ confirm %s); the filesystem can't confirm, use the workspace tools", verbOf(op), rel, s.Prefix, ConfirmName(op))
}

// ConfirmationNeeded is the refusal of a first call that needs
// confirmation: it carries the one-time token that performs the call.
// why, if set, says why a token that came with the call was not accepted.
func ConfirmationNeeded(op Op, rel string, s Subtree, token, why string) *Error {
	msg := fmt.Sprintf("%s %s needs confirmation (policy: %s/ confirm %s)", verbOf(op), rel, s.Prefix, ConfirmName(op))
	if why != "" {
		msg = why + "; " + msg
	}
	msg += fmt.Sprintf(". Nothing was changed. If you mean it, repeat the same call with the same arguments plus confirm_token %q; the token works once, only for this file as it is now, for %s.", token, minutes(ConfirmTTL))
	e := Errorf(ConfirmationRequired, "%s", msg)
	e.Token = token
	return e
}

func verbOf(op Op) string {
	if op == OpDelete {
		return "deleting"
	}
	return "overwriting"
}

// PublishedDirs returns the subtrees a finished run publishes (the policy
// file's "publish: true"); none named, the caller's default applies.
func (p *Policy) PublishedDirs() []string {
	var out []string
	for _, s := range p.Subtrees {
		if s.Publish {
			out = append(out, s.Prefix)
		}
	}
	return out
}

// TemporaryDirs returns the subtrees cleared at the end of each run.
func (p *Policy) TemporaryDirs() []string {
	var out []string
	for _, s := range p.Subtrees {
		if s.Temporary {
			out = append(out, s.Prefix)
		}
	}
	return out
}
