package policy

import "strings"

// Mutates reports whether o changes the workspace.
func (o Op) Mutates() bool { return o.mutates() }

// CheckMove decides whether oldRel may be renamed to newRel (and, with
// exchange, newRel to oldRel) beyond what Check says of each end: nothing
// may be carried out from under a path rule. A directory with a rule
// beneath it would take its ro or hidden subtree where the rule no longer
// holds, and a file leaving a wo subtree could be read back.
func (p *Policy) CheckMove(oldRel, newRel string, exchange bool) error {
	check := func(from, to string) error {
		for _, r := range p.Rules {
			if strings.HasPrefix(r.Prefix, from+"/") {
				return Errorf(PermissionDenied, "%s can't be moved: the path rule %q lies beneath it", from, r.Prefix+"/ "+string(r.Mode))
			}
		}
		if p.ModeOf(from) == ModeWO && p.ModeOf(to) != ModeWO {
			return Errorf(PermissionDenied, "%s is write-only and can't be moved to %s, where it could be read back", from, to)
		}
		return nil
	}
	if err := check(oldRel, newRel); err != nil {
		return err
	}
	if exchange {
		return check(newRel, oldRel)
	}
	return nil
}

// CheckChown refuses every ownership change: what a projection shows as
// owner is the configured sandbox user, not something a process decides.
func CheckChown(rel string) error {
	return Errorf(NotPermitted, "%s: ownership can't be changed in the workspace", rel)
}

// UserXattrPrefix is the only extended attribute namespace ever served.
const UserXattrPrefix = "user."

// CheckXattr refuses an extended attribute outside the "user." namespace
// (security.*, trusted.*, system.* could grant capabilities or ACLs).
func CheckXattr(rel, name string) error {
	if !strings.HasPrefix(name, UserXattrPrefix) {
		return Errorf(Unsupported, "%s: extended attribute %q refused: only the %q namespace is served", rel, name, UserXattrPrefix)
	}
	return nil
}
