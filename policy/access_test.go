package policy_test

import (
	"testing"

	"github.com/agentloom/loomfs/policy"
)

func TestCheckAccess(t *testing.T) {
	const owner = 1000
	file := func(perm uint32) policy.Object { return policy.Object{Kind: policy.KindRegular, Perm: perm, Nlink: 1} }
	dir := func(perm uint32) policy.Object { return policy.Object{Kind: policy.KindDir, Perm: perm, Nlink: 2} }
	fifo := policy.Object{Kind: policy.KindFIFO, Perm: 0o666, Nlink: 1}
	for _, c := range []struct {
		name string
		uid  uint32
		obj  policy.Object
		want policy.Access
		ok   bool
	}{
		{"the sandbox user reads and writes its file", owner, file(0o600), policy.MayRead | policy.MayWrite, true},
		{"the sandbox user searches and writes its directory", owner, dir(0o700), policy.MayExec | policy.MayWrite, true},
		{"the sandbox user may not write a file it made read-only", owner, file(0o400), policy.MayWrite, false},
		{"the sandbox user may not execute a file without x", owner, file(0o600), policy.MayExec, false},
		{"the sandbox user may not search a directory without x", owner, dir(0o600), policy.MayExec, false},
		{"group and other bits give the sandbox user nothing", owner, file(0o077), policy.MayRead, false},
		{"the sandbox user may change its own file's mode", owner, file(0o000), 0, true},
		{"the sandbox user may not open a planted FIFO", owner, fifo, policy.MayRead, false},
		{"another user may not read", owner + 1, file(0o666), policy.MayRead, false},
		{"another user may not search the workspace", owner + 1, dir(0o777), policy.MayExec, false},
		{"another user may not use an object at all", owner + 1, file(0o777), 0, false},
		{"root reads and writes whatever the mode", 0, file(0o000), policy.MayRead | policy.MayWrite, true},
		{"root searches a directory without x", 0, dir(0o000), policy.MayExec, true},
		{"root may not execute a file nobody may execute", 0, file(0o600), policy.MayExec, false},
		{"root executes a file someone may execute", 0, file(0o601), policy.MayExec, true},
		{"root opens a FIFO", 0, fifo, policy.MayRead, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := policy.CheckAccess("x", c.uid, owner, c.obj, c.want)
			if c.ok && err != nil {
				t.Fatalf("refused: %v", err)
			}
			if !c.ok && policy.CodeOf(err) != policy.PermissionDenied {
				t.Fatalf("got %v, want permission_denied", err)
			}
		})
	}
}
