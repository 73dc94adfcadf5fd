package sandbox

import (
	"encoding/json"
	"fmt"
	"slices"
	"sync"

	"github.com/moby/profiles/seccomp"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// DeniedSyscalls are the system calls the engine's default seccomp profile
// may allow that no sandbox command needs: asynchronous I/O that bypasses
// syscall filtering (io_uring), kernel interfaces with a long record of
// privilege escalations (userfaultfd, perf_event_open, bpf, the keyring),
// and reach into other processes or into files by handle (kcmp,
// process_vm_*, *_by_handle_at). They answer ENOSYS, so programs take
// their fallback path as on a kernel without them.
var DeniedSyscalls = []string{
	"io_uring_setup", "io_uring_enter", "io_uring_register",
	"userfaultfd", "perf_event_open", "bpf",
	"keyctl", "add_key", "request_key",
	"kcmp", "process_vm_readv", "process_vm_writev",
	"name_to_handle_at", "open_by_handle_at",
}

// DeniedSocketDomains are socket families refused with EPERM. vsock is not
// network-namespaced: on a VM host it reaches the hypervisor and its other
// guests, whatever the container's network mode.
var DeniedSocketDomains = []uint64{unix.AF_VSOCK}

var (
	profileOnce sync.Once
	profileJSON string
	profileErr  error
)

// SeccompProfile returns the seccomp profile of every sandbox container as
// JSON: the engine's default profile (Moby's, imported, not copied) with
// DeniedSyscalls removed from its allow rules and refused explicitly, and
// no rule allowing a socket of DeniedSocketDomains. It is passed to the
// engine inline (SecurityOpt "seccomp=<json>"), never as a file path the
// daemon would have to trust.
func SeccompProfile() (string, error) {
	profileOnce.Do(func() { profileJSON, profileErr = buildSeccompProfile() })
	return profileJSON, profileErr
}

func buildSeccompProfile() (string, error) {
	p := seccomp.DefaultProfile()
	kept := p.Syscalls[:0]
	for _, s := range p.Syscalls {
		// The default profile names its calls in Names (Name is deprecated).
		s.Names = slices.DeleteFunc(s.Names, func(n string) bool { return slices.Contains(DeniedSyscalls, n) })
		if len(s.Names) == 0 {
			continue
		}
		for _, d := range DeniedSocketDomains {
			if s.Action == specs.ActAllow && allowsSocket(s, d) {
				return "", fmt.Errorf("sandbox: the default seccomp profile allows socket domain %d, which sandboxes refuse", d)
			}
		}
		kept = append(kept, s)
	}
	enosys := uint(unix.ENOSYS)
	p.Syscalls = append(kept, &seccomp.Syscall{
		LinuxSyscall: specs.LinuxSyscall{Names: DeniedSyscalls, Action: specs.ActErrno, ErrnoRet: &enosys},
		Comment:      "loomfs: never needed in a sandbox",
	})
	b, err := json.Marshal(p)
	if err != nil {
		return "", fmt.Errorf("sandbox: encode the seccomp profile: %w", err)
	}
	return string(b), nil
}

// allowsSocket reports whether rule s may let socket(domain, …) through.
// It reads the rule the permissive way: runc turns several comparisons of
// one argument into alternatives (Moby's profile notes this), so any
// comparison of the domain that matches, or none at all, lets it through.
func allowsSocket(s *seccomp.Syscall, domain uint64) bool {
	if !slices.Contains(s.Names, "socket") {
		return false
	}
	compared := false
	for _, a := range s.Args {
		if a.Index != 0 {
			continue
		}
		compared = true
		var match bool
		switch a.Op {
		case specs.OpEqualTo:
			match = domain == a.Value
		case specs.OpNotEqual:
			match = domain != a.Value
		case specs.OpLessThan:
			match = domain < a.Value
		case specs.OpLessEqual:
			match = domain <= a.Value
		case specs.OpGreaterThan:
			match = domain > a.Value
		case specs.OpGreaterEqual:
			match = domain >= a.Value
		case specs.OpMaskedEqual:
			match = domain&a.Value == a.ValueTwo
		}
		if match {
			return true
		}
	}
	return !compared
}
