package policy

import (
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
)

var kindNames = [...]string{"file", "dir", "symlink", "fifo", "socket", "device"}

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
// directory: no symlinks, hardlinks, FIFOs, sockets or devices.
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

// CheckLink refuses every new hard link.
func CheckLink(rel string) error {
	return Errorf(HardlinkRefused, "%s: creating hard links is refused", rel)
}

// CheckChmod refuses setting setuid, setgid or sticky bits.
func CheckChmod(rel string, perm uint32) error {
	if perm&specialBits != 0 {
		return Errorf(NotPermitted, "%s: setuid, setgid and sticky bits are never set", rel)
	}
	return nil
}

// Permissions every object created through loomfs gets, whatever the caller
// or its umask asked for (SPEC §2.1).
const (
	FilePerm = 0o600
	DirPerm  = 0o700
)
