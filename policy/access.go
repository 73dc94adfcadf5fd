package policy

// Access is what a process asks to do with an object, in the bits of
// access(2): read, write, and execute (search, for a directory).
type Access uint32

const (
	MayExec  Access = 1
	MayWrite Access = 2
	MayRead  Access = 4
)

// CheckAccess decides whether the process of uid may have want on obj,
// found at rel, in a projection that shows every object as owned by owner,
// the sandbox user (SPEC §5). It is the check a kernel makes against the
// attributes the projection shows: owner gets the object's owner bits,
// root everything but executing a file that nobody may execute, and any
// other user nothing at all. Special files show no permissions, so only
// root gets past this to them. A want of 0 asks only whether uid may use
// the object at all (change its mode or times, for instance).
func CheckAccess(rel string, uid, owner uint32, obj Object, want Access) error {
	bits := Access(obj.Perm>>6) & 7
	switch obj.Kind {
	case KindRegular, KindDir:
	default:
		bits = 0
	}
	switch {
	case uid == 0:
		if want&MayExec == 0 || obj.Kind != KindRegular || obj.Perm&0o111 != 0 {
			return nil
		}
	case uid == owner:
		if want&^bits == 0 {
			return nil
		}
	default:
		return Errorf(PermissionDenied, "%s: permission denied: only the sandbox user (uid %d) may use the workspace, not uid %d", rel, owner, uid)
	}
	return Errorf(PermissionDenied, "%s: permission denied (%s wanted, mode %#o)", rel, want, obj.Perm)
}

func (a Access) String() string {
	b := []byte("---")
	if a&MayRead != 0 {
		b[0] = 'r'
	}
	if a&MayWrite != 0 {
		b[1] = 'w'
	}
	if a&MayExec != 0 {
		b[2] = 'x'
	}
	return string(b)
}
