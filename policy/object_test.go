package policy_test

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
)

// objectTestCases are the objects a door can find on the backing store
// (SPEC §3.2), each with the code every op other than stat gets.
var objectTestCases = []struct {
	name string
	obj  policy.Object
	// want is the code for every op but stat (always allowed) and list;
	// list additionally says not_dir for a usable regular file.
	want policy.Code
}{
	{name: "regular file", obj: policy.Object{Kind: policy.KindRegular, Perm: 0o600, Nlink: 1}},
	{name: "regular file with group and other bits", obj: policy.Object{Kind: policy.KindRegular, Perm: 0o777, Nlink: 1}},
	{name: "regular file with the sticky bit", obj: policy.Object{Kind: policy.KindRegular, Perm: 0o1600, Nlink: 1}},
	{name: "directory", obj: policy.Object{Kind: policy.KindDir, Perm: 0o700, Nlink: 2}},
	{name: "directory with many links is not a hardlink", obj: policy.Object{Kind: policy.KindDir, Perm: 0o700, Nlink: 40}},
	{name: "directory with setgid", obj: policy.Object{Kind: policy.KindDir, Perm: 0o2700, Nlink: 2}},
	{name: "symlink", obj: policy.Object{Kind: policy.KindSymlink, Perm: 0o777, Nlink: 1}, want: policy.SymlinkRefused},
	{name: "hardlinked file (nlink 2)", obj: policy.Object{Kind: policy.KindRegular, Perm: 0o600, Nlink: 2}, want: policy.HardlinkRefused},
	{name: "hardlinked file (nlink 1000)", obj: policy.Object{Kind: policy.KindRegular, Perm: 0o600, Nlink: 1000}, want: policy.HardlinkRefused},
	{name: "FIFO", obj: policy.Object{Kind: policy.KindFIFO, Perm: 0o600, Nlink: 1}, want: policy.SpecialFileRefused},
	{name: "socket", obj: policy.Object{Kind: policy.KindSocket, Perm: 0o600, Nlink: 1}, want: policy.SpecialFileRefused},
	{name: "device file", obj: policy.Object{Kind: policy.KindDevice, Perm: 0o666, Nlink: 1}, want: policy.SpecialFileRefused},
	{name: "setuid file", obj: policy.Object{Kind: policy.KindRegular, Perm: 0o4755, Nlink: 1}, want: policy.PermissionDenied},
	{name: "setgid file", obj: policy.Object{Kind: policy.KindRegular, Perm: 0o2755, Nlink: 1}, want: policy.PermissionDenied},
	{name: "setuid hardlinked file", obj: policy.Object{Kind: policy.KindRegular, Perm: 0o4755, Nlink: 3}, want: policy.HardlinkRefused},
}

func TestCheckObject(t *testing.T) {
	for _, tc := range objectTestCases {
		t.Run(tc.name, func(t *testing.T) {
			for _, op := range allOps() {
				want := tc.want
				switch {
				case op == policy.OpStat:
					want = "" // stat shows everything for what it is
				case op == policy.OpList && tc.obj.Kind == policy.KindDir:
					want = ""
				case op == policy.OpList && want == "":
					want = policy.NotDir
				}
				err := policy.CheckObject(op, "x/obj", tc.obj)
				if got := policy.CodeOf(err); got != want {
					t.Errorf("CheckObject(%s) = %v (code %q), want code %q", op, err, got, want)
				}
				if err != nil {
					if pe, ok := err.(*policy.Error); !ok || pe.Message == "" {
						t.Errorf("CheckObject(%s) = %#v, want *policy.Error with a message", op, err)
					}
				}
			}
		})
	}
}

func TestCheckCreateKindLinkChmod(t *testing.T) {
	kinds := []struct {
		kind policy.Kind
		want policy.Code
	}{
		{policy.KindRegular, ""},
		{policy.KindDir, ""},
		{policy.KindSymlink, policy.SymlinkRefused},
		{policy.KindFIFO, policy.SpecialFileRefused},
		{policy.KindSocket, policy.SpecialFileRefused},
		{policy.KindDevice, policy.SpecialFileRefused},
	}
	for _, k := range kinds {
		if got := policy.CodeOf(policy.CheckCreateKind("n", k.kind)); got != k.want {
			t.Errorf("CheckCreateKind(%s) code %q, want %q", k.kind, got, k.want)
		}
	}
	// A new hard link answers EXDEV, so programs copy instead.
	if err := policy.CheckLink("n"); policy.CodeOf(err) != policy.LinkUnsupported || policy.Errno(err) != unix.EXDEV {
		t.Errorf("CheckLink = %v (code %q, errno %v), want link_unsupported, EXDEV", err, policy.CodeOf(err), policy.Errno(err))
	}
	perms := []struct {
		perm uint32
		want policy.Code
	}{
		{0o600, ""},
		{0o777, ""},
		{0o4755, policy.NotPermitted},
		{0o2755, policy.NotPermitted},
		{0o1777, policy.NotPermitted},
		{0o7000, policy.NotPermitted},
	}
	for _, p := range perms {
		if got := policy.CodeOf(policy.CheckChmod("n", p.perm)); got != p.want {
			t.Errorf("CheckChmod(%#o) code %q, want %q", p.perm, got, p.want)
		}
	}
	if policy.FilePerm != 0o600 || policy.DirPerm != 0o700 {
		t.Errorf("FilePerm %#o, DirPerm %#o; SPEC §2.1 says 0600 and 0700", policy.FilePerm, policy.DirPerm)
	}
}

// TestOwnerPerm: the owner bits a program asks for are kept, and nothing
// else ever (SPEC §2.1).
func TestOwnerPerm(t *testing.T) {
	for _, tc := range []struct{ asked, want uint32 }{
		{0o755, 0o700},
		{0o777, 0o700},
		{0o644, 0o600},
		{0o600, 0o600},
		{0o444, 0o400},
		{0o500, 0o500},
		{0o070, 0},
		{0o4755, 0o700},
		{0o2775, 0o700},
		{0o1777, 0o700},
	} {
		if got := policy.OwnerPerm(tc.asked); got != tc.want {
			t.Errorf("OwnerPerm(%#o) = %#o, want %#o", tc.asked, got, tc.want)
		}
	}
}

// TestObjectOf stats real objects and checks the Kind each one gets.
func TestObjectOf(t *testing.T) {
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(dir, "file"), []byte("hello"), 0o600))
	must(os.Mkdir(filepath.Join(dir, "dir"), 0o700))
	must(os.Symlink("file", filepath.Join(dir, "symlink")))
	must(os.Link(filepath.Join(dir, "file"), filepath.Join(dir, "hardlink")))
	must(unix.Mkfifo(filepath.Join(dir, "fifo"), 0o600))
	must(unix.Mknod(filepath.Join(dir, "socket"), unix.S_IFSOCK|0o600, 0))
	must(os.WriteFile(filepath.Join(dir, "setuid"), nil, 0o600))
	must(unix.Chmod(filepath.Join(dir, "setuid"), 0o4700))
	devices := os.Geteuid() == 0
	if devices {
		must(unix.Mknod(filepath.Join(dir, "chardev"), unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3))))
		must(unix.Mknod(filepath.Join(dir, "blockdev"), unix.S_IFBLK|0o600, int(unix.Mkdev(7, 0))))
	}
	tests := []struct {
		name  string
		kind  policy.Kind
		nlink uint64
		perm  uint32
		size  int64
	}{
		{"file", policy.KindRegular, 2, 0o600, 5}, // "hardlink" shares its inode
		{"dir", policy.KindDir, 2, 0o700, -1},
		{"symlink", policy.KindSymlink, 1, 0o777, 4},
		{"fifo", policy.KindFIFO, 1, 0o600, 0},
		{"socket", policy.KindSocket, 1, 0o600, 0},
		{"setuid", policy.KindRegular, 1, 0o4700, 0},
		{"chardev", policy.KindDevice, 1, 0o600, 0},
		{"blockdev", policy.KindDevice, 1, 0o600, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if !devices && (tc.name == "chardev" || tc.name == "blockdev") {
				t.Skip("creating device nodes needs root")
			}
			var st unix.Stat_t
			must(unix.Lstat(filepath.Join(dir, tc.name), &st))
			o := policy.ObjectOf(&st)
			if o.Kind != tc.kind || o.Nlink != tc.nlink || o.Perm != tc.perm || (tc.size >= 0 && o.Size != tc.size) {
				t.Errorf("ObjectOf(%s) = %+v, want kind %s nlink %d perm %#o size %d", tc.name, o, tc.kind, tc.nlink, tc.perm, tc.size)
			}
		})
	}
}

func TestKindAndOpNames(t *testing.T) {
	kinds := map[policy.Kind]string{
		policy.KindRegular: "file", policy.KindDir: "dir", policy.KindSymlink: "symlink",
		policy.KindFIFO: "fifo", policy.KindSocket: "socket", policy.KindDevice: "device",
	}
	for k, want := range kinds {
		if k.String() != want {
			t.Errorf("Kind %d String() = %q, want %q", k, k.String(), want)
		}
	}
	seen := map[string]bool{}
	for _, op := range allOps() {
		s := op.String()
		if s == "" || seen[s] {
			t.Errorf("Op %d has an empty or duplicate name %q", op, s)
		}
		seen[s] = true
	}
}

func TestMoveChownXattr(t *testing.T) {
	p := policy.Default()
	if err := p.SetRules([]policy.Rule{{Prefix: "proj/secret", Mode: policy.ModeHidden}, {Prefix: "out", Mode: policy.ModeWO}, {Prefix: "out2", Mode: policy.ModeWO}}); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name     string
		old, new string
		exchange bool
		want     policy.Code
	}{
		{"plain rename", "a", "b", false, ""},
		{"directory with a rule beneath it", "proj", "elsewhere", false, policy.PermissionDenied},
		{"exchange onto a directory with a rule beneath it", "x", "proj", true, policy.PermissionDenied},
		{"out of a write-only subtree", "out/f", "f", false, policy.PermissionDenied},
		{"within a write-only subtree", "out/f", "out/g", false, ""},
		{"between write-only subtrees", "out/f", "out2/f", false, ""},
		{"into a write-only subtree", "f", "out/f", false, ""},
		{"exchange with a write-only file", "f", "out/f", true, policy.PermissionDenied},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := policy.CodeOf(p.CheckMove(c.old, c.new, c.exchange)); got != c.want {
				t.Fatalf("CheckMove(%s, %s, %v) = %q, want %q", c.old, c.new, c.exchange, got, c.want)
			}
		})
	}
	if policy.Errno(policy.CheckChown("f")) != syscall.EPERM || policy.Errno(policy.CheckChmod("f", 0o4700)) != syscall.EPERM {
		t.Fatal("chown and chmod u+s must answer EPERM")
	}
	for name, want := range map[string]policy.Code{"user.x": "", "security.capability": policy.Unsupported, "trusted.x": policy.Unsupported, "system.posix_acl_access": policy.Unsupported} {
		if got := policy.CodeOf(policy.CheckXattr("f", name)); got != want {
			t.Errorf("CheckXattr(%s) = %q, want %q", name, got, want)
		}
	}
}

// TestCheckObjectLink: an emulated link (a regular file with the marker,
// as ObjectOf sees it) is removed, moved and given times as itself, and
// never read or written through (SPEC §3.2).
func TestCheckObjectLink(t *testing.T) {
	var st unix.Stat_t
	st.Mode, st.Nlink, st.Size = unix.S_IFREG|policy.LinkPerm, 1, 11
	link := policy.ObjectOf(&st)
	if link.Kind != policy.KindLink || link.Kind.String() != "symlink" {
		t.Fatalf("a marked regular file is %v", link.Kind)
	}
	hard := link
	hard.Nlink = 2
	for _, c := range []struct {
		op   policy.Op
		obj  policy.Object
		want policy.Code
	}{
		{policy.OpStat, link, ""},
		{policy.OpDelete, link, ""},
		{policy.OpRename, link, ""},
		{policy.OpSetattr, link, ""},
		{policy.OpRead, link, policy.SymlinkRefused},
		{policy.OpWrite, link, policy.SymlinkRefused},
		{policy.OpCreate, link, policy.SymlinkRefused},
		{policy.OpList, link, policy.NotDir},
		{policy.OpStat, hard, ""},
		{policy.OpRead, hard, policy.HardlinkRefused},
		{policy.OpDelete, hard, policy.HardlinkRefused},
	} {
		if got := policy.CodeOf(policy.CheckObject(c.op, "l", c.obj)); got != c.want {
			t.Errorf("CheckObject(%s, nlink %d) code %q, want %q", c.op, c.obj.Nlink, got, c.want)
		}
	}
	for _, target := range []string{"", "a\x00b", string(make([]byte, policy.MaxLinkTarget+1))} {
		if policy.CheckLinkTarget("l", target) == nil {
			t.Errorf("target of %d bytes accepted", len(target))
		}
	}
	if err := policy.CheckLinkTarget("l", "/etc/passwd"); err != nil {
		t.Error(err)
	}
}
