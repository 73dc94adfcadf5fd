package policy

import (
	"strings"

	"golang.org/x/sys/unix"
)

// Kind is the type of an object found on the backing store.
type Kind uint8

const (
	KindRegular Kind = iota
	KindDir
	KindSymlink
	KindFIFO
	KindSocket
	KindDevice
	// KindLink is an emulated symbolic link: on the backing store a
	// regular file marked with LinkMarker, holding the target.
	KindLink
)

var kindNames = [...]string{"file", "dir", "symlink", "fifo", "socket", "device", "symlink"}

func (k Kind) String() string { return kindNames[k] }

// Object is what a door found at a path, taken from fstat or lstat.
type Object struct {
	Kind  Kind
	Perm  uint32 // permission and setuid/setgid/sticky bits
	Nlink uint64
	Size  int64
	// OtherMount is set for an object on another mount than its scope's,
	// such as a file or directory bind-mounted in from elsewhere.
	OtherMount bool
}

// ObjectOf describes a stat result.
func ObjectOf(st *unix.Stat_t) Object {
	o := Object{Perm: st.Mode & 0o7777, Nlink: uint64(st.Nlink), Size: st.Size}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		o.Kind = KindRegular
		if st.Mode&LinkMarker != 0 {
			o.Kind = KindLink
		}
	case unix.S_IFDIR:
		o.Kind = KindDir
	case unix.S_IFLNK:
		o.Kind = KindSymlink
	case unix.S_IFIFO:
		o.Kind = KindFIFO
	case unix.S_IFSOCK:
		o.Kind = KindSocket
	default:
		o.Kind = KindDevice
	}
	return o
}

const specialBits = unix.S_ISUID | unix.S_ISGID | unix.S_ISVTX

// CheckObject decides whether op may touch obj, found at rel (SPEC §3.2).
// Symlinks, hardlinked files, FIFOs, sockets, devices and setuid/setgid
// files are shown by stat and list but refused for everything else; an
// object on another mount is refused even to stat.
func CheckObject(op Op, rel string, obj Object) error {
	if obj.OtherMount {
		return CrossMount(rel)
	}
	if op == OpStat || op == OpList && obj.Kind == KindDir {
		return nil
	}
	switch obj.Kind {
	case KindSymlink:
		return Errorf(SymlinkRefused, "%s is a symlink; loomfs never follows, reads, writes or removes symlinks", rel)
	case KindLink:
		if obj.Nlink > 1 {
			return Errorf(HardlinkRefused, "%s has %d hard links; files with more than one link are refused", rel, obj.Nlink)
		}
		// The link itself may be removed, moved and given times (touch
		// -h, tar); it is never read or written through.
		if op == OpDelete || op == OpRename || op == OpSetattr {
			return nil
		}
		if op == OpList {
			return Errorf(NotDir, "%s is a symbolic link, not a directory; the tools never follow links", rel)
		}
		return Errorf(SymlinkRefused, "%s is a symbolic link; the tools never follow links: stat or list it to see its target, and use the target's own path", rel)
	case KindFIFO, KindSocket, KindDevice:
		return Errorf(SpecialFileRefused, "%s is a %s; only regular files and directories can be used", rel, obj.Kind)
	case KindRegular:
		if obj.Nlink > 1 {
			return Errorf(HardlinkRefused, "%s has %d hard links; files with more than one link are refused", rel, obj.Nlink)
		}
		if obj.Perm&(unix.S_ISUID|unix.S_ISGID) != 0 {
			return Errorf(PermissionDenied, "%s has the setuid or setgid bit; such files are refused", rel)
		}
		if op == OpList {
			return Errorf(NotDir, "%s is a file, not a directory", rel)
		}
	}
	return nil
}

// CrossMount refuses an object on another mount than its scope's, for
// every operation: a bind mount can bring in a file or directory of the
// same filesystem that belongs elsewhere, so the device number is not
// enough to tell (SPEC §3.2).
func CrossMount(rel string) error {
	return Errorf(InvalidPath, "%s is on another mount; loomfs does not cross mounts", rel)
}

// CheckCreateKind refuses creating anything but a regular file or a
// directory: no real symlinks, hardlinks, FIFOs, sockets or devices. An
// emulated link is asked about with Policy.CheckSymlink.
func CheckCreateKind(rel string, k Kind) error {
	switch k {
	case KindRegular, KindDir:
		return nil
	case KindSymlink:
		return Errorf(SymlinkRefused, "%s: creating symlinks is refused", rel)
	default:
		return Errorf(SpecialFileRefused, "%s: creating a %s is refused; only regular files and directories", rel, k)
	}
}

// The emulated symbolic link (SPEC §3.2). The backing store never holds a
// symlink: a link made in the projection is a regular file holding its
// target, marked with the sticky bit. Nothing on the host follows a
// regular file, and no agent can make the mark: every create and chmod
// through either door clears the setuid, setgid and sticky bits, so only
// loomfs's own link creation sets it. A sticky regular file someone else
// planted on the host is taken for a link too; that is harmless, as a
// link only names a path the one following it could name itself.
const (
	LinkMarker = unix.S_ISVTX
	// LinkPerm is the backing file's mode: the marker, readable and
	// writable by the daemon's user only.
	LinkPerm = LinkMarker | FilePerm
	// MaxLinkTarget is the longest target a symlink holds (PATH_MAX less
	// its NUL).
	MaxLinkTarget = 4095
)

// CheckLinkTarget refuses a target no symlink can hold: empty, longer
// than MaxLinkTarget or holding a NUL byte.
func CheckLinkTarget(rel, target string) error {
	switch {
	case target == "":
		return Errorf(NotFound, "%s: a symbolic link needs a target", rel)
	case len(target) > MaxLinkTarget:
		return Errorf(InvalidInput, "%s: a symbolic link target is at most %d bytes (this one has %d)", rel, MaxLinkTarget, len(target))
	case strings.IndexByte(target, 0) >= 0:
		return Errorf(InvalidInput, "%s: a symbolic link target can't hold a NUL byte", rel)
	}
	return nil
}

// CheckSymlink asks whether a symbolic link may be made at rel: only when
// the policy emulates links, and never with a target no link can hold.
func (p *Policy) CheckSymlink(rel, target string) error {
	if !p.EmulatesLinks() {
		return CheckCreateKind(rel, KindSymlink)
	}
	return CheckLinkTarget(rel, target)
}

// CheckLink refuses every new hard link, with LinkUnsupported (EXDEV), so
// a program falls back to copying as it does across filesystems.
func CheckLink(rel string) error {
	return Errorf(LinkUnsupported, "%s: hard links are not made in the workspace; copy the file instead", rel)
}

// CheckChmod refuses setting setuid, setgid or sticky bits; the group and
// other bits are dropped by OwnerPerm.
func CheckChmod(rel string, perm uint32) error {
	if perm&specialBits != 0 {
		return Errorf(NotPermitted, "%s: setuid, setgid and sticky bits are never set", rel)
	}
	return nil
}

// Permissions of what loomfs creates of its own accord: the tool door's new
// files and directories, and loomfs's own state (SPEC §2.1).
const (
	FilePerm = 0o600
	DirPerm  = 0o700
)

// OwnerPerm is the mode a file or directory gets when a program asks for
// perm, by create, mkdir or chmod through the projection, or when the tool
// door replaces a file of mode perm: the owner bits asked for, so an
// executable stays executable, and never a group, other, setuid, setgid or
// sticky bit.
func OwnerPerm(perm uint32) uint32 {
	return perm & 0o700
}
