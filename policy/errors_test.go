package policy_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/agentloom/loomfs/policy"
)

// TestErrno is the table the FUSE door relies on: every code maps to one
// errno, in one place (SPEC §3.4).
func TestErrno(t *testing.T) {
	tests := []struct {
		code policy.Code
		want syscall.Errno
	}{
		// Refusing a name is never EINVAL: "rm -f" would exit 0 with the
		// file still there.
		{policy.InvalidPath, syscall.EPERM},
		{policy.NameTooLong, syscall.ENAMETOOLONG},
		{policy.NotFound, syscall.ENOENT},
		{policy.Exists, syscall.EEXIST},
		{policy.IsDir, syscall.EISDIR},
		{policy.NotDir, syscall.ENOTDIR},
		{policy.NotEmpty, syscall.ENOTEMPTY},
		{policy.SymlinkRefused, syscall.EPERM},
		{policy.HardlinkRefused, syscall.EPERM},
		{policy.LinkUnsupported, syscall.EXDEV},
		{policy.SpecialFileRefused, syscall.EPERM},
		{policy.PermissionDenied, syscall.EACCES},
		{policy.ReadOnly, syscall.EROFS},
		{policy.TooLarge, syscall.EFBIG},
		{policy.QuotaExceeded, syscall.EDQUOT},
		{policy.Conflict, syscall.EBUSY},
		{policy.Timeout, syscall.ETIMEDOUT},
		{policy.Quarantined, syscall.EROFS},
		{policy.VolumeUnavailable, syscall.EIO},
		{policy.Unsupported, syscall.EOPNOTSUPP},
		{policy.AuditUnavailable, syscall.EIO},
		{policy.Cancelled, syscall.EINTR},
		{policy.InvalidInput, syscall.EINVAL},
		{policy.ConfirmationRequired, syscall.EPERM},
		// Codes the filesystem never produces itself fall back to EIO.
		{policy.AmbiguousEdit, syscall.EIO},
		{policy.NoMatch, syscall.EIO},
		{policy.NoChange, syscall.EIO},
		{policy.PatchFailed, syscall.EIO},
		{policy.InvalidPatch, syscall.EIO},
		{policy.InvalidCursor, syscall.EIO},
		{policy.NotAnImage, syscall.EIO},
		{policy.UnknownOutcome, syscall.EIO},
		{policy.SandboxUnavailable, syscall.EIO},
		{policy.Internal, syscall.EIO},
		{"some_future_code", syscall.EIO},
	}
	for _, tc := range tests {
		t.Run(string(tc.code), func(t *testing.T) {
			err := policy.Errorf(tc.code, "x")
			if got := policy.Errno(err); got != tc.want {
				t.Errorf("Errno(%s) = %v, want %v", tc.code, got, tc.want)
			}
			wrapped := fmt.Errorf("context: %w", err)
			if got := policy.Errno(wrapped); got != tc.want {
				t.Errorf("Errno(wrapped %s) = %v, want %v", tc.code, got, tc.want)
			}
		})
	}
	t.Run("nil is no error", func(t *testing.T) {
		if got := policy.Errno(nil); got != 0 {
			t.Errorf("Errno(nil) = %v", got)
		}
	})
	t.Run("a raw errno passes through", func(t *testing.T) {
		if got := policy.Errno(syscall.ENOSPC); got != syscall.ENOSPC {
			t.Errorf("Errno(ENOSPC) = %v", got)
		}
		if got := policy.Errno(&fs.PathError{Op: "open", Path: "x", Err: syscall.EXDEV}); got != syscall.EXDEV {
			t.Errorf("Errno(PathError EXDEV) = %v", got)
		}
	})
	t.Run("an unmapped code keeps its cause's errno", func(t *testing.T) {
		err := &policy.Error{Code: policy.Internal, Message: "x", Err: syscall.ESTALE}
		if got := policy.Errno(err); got != syscall.ESTALE {
			t.Errorf("Errno = %v, want ESTALE", got)
		}
	})
	t.Run("a full volume answers the errno the storage gave", func(t *testing.T) {
		for _, en := range []syscall.Errno{syscall.ENOSPC, syscall.EDQUOT} {
			if got := policy.Errno(policy.FromErrno(en, "write", "x")); got != en {
				t.Errorf("Errno(FromErrno(%v)) = %v", en, got)
			}
		}
	})
	t.Run("a mapped code wins over its cause", func(t *testing.T) {
		err := &policy.Error{Code: policy.SymlinkRefused, Message: "x", Err: syscall.ELOOP}
		if got := policy.Errno(err); got != syscall.EPERM {
			t.Errorf("Errno = %v, want EPERM", got)
		}
	})
	t.Run("another error is EIO", func(t *testing.T) {
		if got := policy.Errno(errors.New("boom")); got != syscall.EIO {
			t.Errorf("Errno = %v, want EIO", got)
		}
	})
}

func TestFromErrno(t *testing.T) {
	tests := []struct {
		errno syscall.Errno
		want  policy.Code
	}{
		{syscall.ENOENT, policy.NotFound},
		{syscall.EEXIST, policy.Exists},
		{syscall.EISDIR, policy.IsDir},
		{syscall.ENOTDIR, policy.NotDir},
		{syscall.ENOTEMPTY, policy.NotEmpty},
		{syscall.ELOOP, policy.SymlinkRefused},
		{syscall.EXDEV, policy.InvalidPath},
		{syscall.EACCES, policy.PermissionDenied},
		{syscall.EPERM, policy.PermissionDenied},
		{syscall.EROFS, policy.ReadOnly},
		// The volume's own limits, not the workspace's quota.
		{syscall.EDQUOT, policy.NoSpace},
		{syscall.ENOSPC, policy.NoSpace},
		{syscall.EFBIG, policy.TooLarge},
		{syscall.ENAMETOOLONG, policy.NameTooLong},
		{syscall.EIO, policy.Internal},
	}
	for _, tc := range tests {
		t.Run(tc.errno.Error(), func(t *testing.T) {
			for _, err := range []error{tc.errno, &fs.PathError{Op: "openat", Path: "x", Err: tc.errno}} {
				got := policy.FromErrno(err, "read", "dir/file.txt")
				var pe *policy.Error
				if !errors.As(got, &pe) || pe.Code != tc.want {
					t.Fatalf("FromErrno(%v) = %#v, want code %q", err, got, tc.want)
				}
				if !errors.Is(got, tc.errno) {
					t.Errorf("FromErrno(%v) lost its cause", err)
				}
				if !strings.Contains(pe.Message, "dir/file.txt") {
					t.Errorf("FromErrno(%v) message %q does not name the path", err, pe.Message)
				}
			}
		})
	}
	if policy.FromErrno(nil, "read", "x") != nil {
		t.Error("FromErrno(nil) != nil")
	}
	orig := policy.Errorf(policy.Conflict, "kept")
	if got := policy.FromErrno(fmt.Errorf("w: %w", orig), "read", "x"); got != orig {
		t.Errorf("FromErrno of an *Error = %v, want it kept", got)
	}
	if got := policy.CodeOf(policy.FromErrno(errors.New("odd"), "read", "x")); got != policy.Internal {
		t.Errorf("FromErrno of a non-errno: code %q, want internal", got)
	}
}

func TestCodeOfAndAsError(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want policy.Code
	}{
		{"nil", nil, ""},
		{"policy error", policy.Errorf(policy.TooLarge, "x"), policy.TooLarge},
		{"wrapped policy error", fmt.Errorf("a: %w", policy.Errorf(policy.Conflict, "x")), policy.Conflict},
		{"raw ENOENT", syscall.ENOENT, policy.NotFound},
		{"path error ENOENT", &fs.PathError{Op: "open", Path: "x", Err: syscall.ENOENT}, policy.NotFound},
		{"other errno", syscall.EIO, policy.Internal},
		{"plain error", errors.New("x"), policy.Internal},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := policy.CodeOf(tc.err); got != tc.want {
				t.Errorf("CodeOf = %q, want %q", got, tc.want)
			}
		})
	}
	pe := policy.Errorf(policy.NoMatch, "x")
	if policy.AsError(fmt.Errorf("w: %w", pe)) != pe {
		t.Error("AsError did not keep an existing *Error")
	}
	cause := errors.New("disk on fire")
	got := policy.AsError(cause)
	if got.Code != policy.Internal || !errors.Is(got, cause) || !strings.Contains(got.Message, "disk on fire") {
		t.Errorf("AsError(plain) = %#v", got)
	}
	// A full volume is never internal, wherever the error was wrapped.
	for _, en := range []syscall.Errno{syscall.ENOSPC, syscall.EDQUOT} {
		full := fmt.Errorf("write quota ledger: %w", &os.PathError{Op: "write", Path: "/x", Err: en})
		if got := policy.AsError(full); got.Code != policy.NoSpace || !errors.Is(got, en) || strings.Contains(got.Message, "/x") {
			t.Errorf("AsError(%v) = %#v", full, got)
		}
	}
}

// TestErrorJSON pins the wire shape tools return: field names are part of
// the contract (SPEC §3.4, §4).
func TestErrorJSON(t *testing.T) {
	e := policy.Errorf(policy.Conflict, "a.txt changed since you read it; re-read the file and retry")
	e.SHA256 = strings.Repeat("ab", 32)
	e.Err = errors.New("not serialised")
	b, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"code":"conflict","message":"a.txt changed since you read it; re-read the file and retry","current_sha256":"` + e.SHA256 + `"}`
	if string(b) != want {
		t.Errorf("JSON\n got %s\nwant %s", b, want)
	}
	b, _ = json.Marshal(policy.Errorf(policy.NotFound, "gone"))
	if string(b) != `{"code":"not_found","message":"gone"}` {
		t.Errorf("JSON without a hash: %s", b)
	}
	var back policy.Error
	if err := json.Unmarshal([]byte(want), &back); err != nil || back.Code != policy.Conflict || back.SHA256 != e.SHA256 {
		t.Errorf("round trip: %+v, %v", back, err)
	}
}

// TestPublicKeepsHostPathsOut: no message a model sees names a host path.
// Operator trouble is answered with a fixed message, its cause kept in Err
// for the operator's log; a refusal written for a model passes unchanged.
func TestPublicKeepsHostPathsOut(t *testing.T) {
	// A real write error on a full device, as an audit log on a full volume
	// gives: "write /dev/full: no space left on device".
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Skipf("no /dev/full: %v", err)
	}
	defer full.Close()
	_, werr := full.Write([]byte("x"))
	if werr == nil || !strings.Contains(werr.Error(), "/dev/full") {
		t.Fatalf("write to /dev/full: %v", werr)
	}
	cases := []struct {
		name string
		err  error
		code policy.Code
	}{
		{"an unwritable audit log", &policy.Error{Code: policy.AuditUnavailable, Message: "the audit log can't be written: " + werr.Error(), Err: werr}, policy.AuditUnavailable},
		{"a full device's error, wrapped", fmt.Errorf("open journal: %w", werr), policy.NoSpace},
		{"an error of another kind", fmt.Errorf("open journal: %w", &fs.PathError{Op: "read", Path: "/dev/full", Err: syscall.EIO}), policy.Internal},
		{"an errno loomfs has no code for", policy.FromErrno(&fs.PathError{Op: "read", Path: "/dev/full", Err: syscall.EIO}, "read", "/dev/full"), policy.Internal},
		{"a volume gone", policy.Errorf(policy.VolumeUnavailable, "shared volume unavailable: /dev/full is not a mount point"), policy.VolumeUnavailable},
		{"an engine that does not answer", &policy.Error{Code: policy.SandboxUnavailable, Message: "no sandbox engine: dial unix /dev/full: connection refused", Err: werr}, policy.SandboxUnavailable},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pe := policy.Public(c.err)
			if pe.Code != c.code {
				t.Fatalf("code %s, want %s", pe.Code, c.code)
			}
			if strings.Contains(pe.Message, "/dev") || pe.Message == "" {
				t.Fatalf("model-facing message %q carries a host path", pe.Message)
			}
			b, _ := json.Marshal(pe)
			if strings.Contains(string(b), "/dev") {
				t.Fatalf("model-facing JSON %s carries a host path", b)
			}
			// The operator's log still gets the detail.
			if !strings.Contains(fmt.Sprint(pe.Err), "/dev/full") {
				t.Fatalf("the cause is lost for the operator: %v", pe.Err)
			}
		})
	}
	refusal := policy.Errorf(policy.NotFound, "notes.md: no such file or directory")
	if pe := policy.Public(refusal); pe != refusal {
		t.Fatalf("a refusal for the model was rewritten: %#v", pe)
	}
}

func TestMaskHostPaths(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`OCI runtime create failed: unable to retrieve OCI runtime error (open /var/run/docker/containerd/daemon/x/log.json: no such file or directory): /usr/local/lib/loomfs/runtime-failstart did not terminate successfully: exit status 1: unknown`,
			`OCI runtime create failed: unable to retrieve OCI runtime error (open <path>: no such file or directory): <path> did not terminate successfully: exit status 1: unknown`},
		{`creating interfaces from net namespace "/proc/18572/ns/net": cannot run with network enabled in root network namespace: unknown`,
			`creating interfaces from net namespace "<path>": cannot run with network enabled in root network namespace: unknown`},
		{`path=/srv/x,other`, `path=<path>,other`},
		{`exit status 1`, `exit status 1`},
		{`a/b relative stays`, `a/b relative stays`},
	} {
		if got := policy.MaskHostPaths(tc.in); got != tc.want {
			t.Errorf("MaskHostPaths(%q)\n = %q\nwant %q", tc.in, got, tc.want)
		}
	}
}

// TestFencedNode: ESHUTDOWN from the volume (an evicted, blocklisted
// CephFS client) is the node's fence wherever it meets the policy, and
// the boundary a model reads keeps saying so.
func TestFencedNode(t *testing.T) {
	wrapped := fmt.Errorf("write the journal: %w", &fs.PathError{Op: "write", Path: "/mnt/vol/x", Err: syscall.ESHUTDOWN})
	tests := []struct {
		name string
		err  error
	}{
		{"FromErrno", policy.FromErrno(syscall.ESHUTDOWN, "write", "a.txt")},
		{"FromErrno of a path error", policy.FromErrno(&fs.PathError{Op: "openat", Path: "a.txt", Err: syscall.ESHUTDOWN}, "open", "a.txt")},
		{"Unavailable", policy.Unavailable(policy.AuditUnavailable, "the audit log", wrapped)},
		{"AsError", policy.AsError(wrapped)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pe := policy.Public(tc.err)
			if pe.Code != policy.VolumeUnavailable || pe.Message != policy.FencedMessage {
				t.Errorf("Public = %q %q, want volume_unavailable with the fenced message", pe.Code, pe.Message)
			}
			if !errors.Is(tc.err, syscall.ESHUTDOWN) {
				t.Error("the cause was lost")
			}
			if got := policy.Errno(tc.err); got != syscall.EIO {
				t.Errorf("Errno = %v, want EIO", got)
			}
			if !policy.IsFenced(tc.err) {
				t.Error("IsFenced = false")
			}
		})
	}
	// A volume that is merely unavailable keeps the fixed message.
	unavailable := policy.Unavailable(policy.VolumeUnavailable, "the journal", syscall.EIO)
	if pe := policy.Public(unavailable); pe.Message == policy.FencedMessage || policy.IsFenced(unavailable) {
		t.Error("an EIO reads as a fence")
	}
	// A fence recorded on the volume, wrapped with the operator's detail,
	// is the same refusal to a model.
	recorded := fmt.Errorf("node a was fenced at …: %w", policy.Fenced(nil))
	if pe := policy.Public(recorded); !policy.IsFenced(recorded) || pe.Code != policy.VolumeUnavailable || pe.Message != policy.FencedMessage {
		t.Errorf("a recorded fence: IsFenced %v, Public %q %q", policy.IsFenced(recorded), pe.Code, pe.Message)
	}
}
