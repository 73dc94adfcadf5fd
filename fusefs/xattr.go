package fusefs

import (
	"bytes"
	"context"
	"os"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
)

// Extended attributes are served only when Options.UserXattrs is set, and
// then only in the "user." namespace, on regular files and directories.
// Without it go-fuse answers ENOSYS for every xattr request (DisableXAttrs)
// and the kernel, having learnt that, answers EOPNOTSUPP itself: it no
// longer asks for security.capability before every write.
// The namespace rule is policy.CheckXattr.

var (
	_ = (fs.NodeGetxattrer)((*node)(nil))
	_ = (fs.NodeSetxattrer)((*node)(nil))
	_ = (fs.NodeRemovexattrer)((*node)(nil))
	_ = (fs.NodeListxattrer)((*node)(nil))
)

// xattrFile opens the node's object at rel for an xattr call: regular files
// and directories only, checked by the store and still this node's object.
func (n *node) xattrFile(rel string) (*os.File, error) {
	file, _, err := n.fsys.ws.Open(policy.OpSetattr, rel, unix.O_RDONLY)
	if err != nil {
		return nil, err
	}
	sx, err := statAt(int(file.Fd()), "")
	if err == nil && !sameObject(n.StableAttr(), &sx) {
		err = syscall.ESTALE
	}
	if err != nil {
		file.Close()
		return nil, err
	}
	return file, nil
}

func (n *node) usesXattrs() bool {
	m := n.StableAttr().Mode
	return m == syscall.S_IFREG || m == syscall.S_IFDIR
}

func (n *node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	if !n.usesXattrs() {
		return 0, syscall.ENODATA
	}
	if rel, ok := n.relPath(); ok {
		// Reading an extended attribute needs read permission.
		if err := n.fsys.access(ctx, rel, n.object(), policy.MayRead); err != nil {
			return 0, n.fsys.refused(ctx, n.fsys.event(ctx, "getxattr", rel), err)
		}
	}
	file, e := n.readXattrs()
	if e != 0 {
		return 0, e
	}
	defer file.Close()
	// Outside the one namespace served, nothing is there to read.
	if policy.CheckXattr(".", attr) != nil {
		return 0, syscall.ENODATA
	}
	sz, err := unix.Fgetxattr(int(file.Fd()), attr, dest)
	if err != nil {
		return uint32(max(sz, 0)), policy.Errno(err)
	}
	return uint32(sz), 0
}

// readXattrs opens the node's object for reading its extended attributes,
// once the policy lets its path be looked at.
func (n *node) readXattrs() (*os.File, syscall.Errno) {
	rel, ok := n.relPath()
	if !ok {
		return nil, syscall.ENOENT
	}
	if err := n.fsys.admit(policy.OpStat, rel); err != nil {
		return nil, policy.Errno(err)
	}
	file, err := n.xattrFile(rel)
	if err != nil {
		return nil, policy.Errno(err)
	}
	return file, 0
}

func (n *node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	if !n.usesXattrs() {
		return 0, 0
	}
	file, e := n.readXattrs()
	if e != 0 {
		return 0, e
	}
	defer file.Close()
	fd := int(file.Fd())
	sz, err := unix.Flistxattr(fd, nil)
	if err != nil {
		return 0, policy.Errno(err)
	}
	all := make([]byte, sz)
	if sz, err = unix.Flistxattr(fd, all); err != nil {
		return 0, policy.Errno(err)
	}
	var list []byte
	for _, name := range bytes.Split(all[:sz], []byte{0}) {
		if len(name) > 0 && policy.CheckXattr(".", string(name)) == nil {
			list = append(append(list, name...), 0)
		}
	}
	if len(dest) == 0 {
		return uint32(len(list)), 0
	}
	if len(dest) < len(list) {
		return uint32(len(list)), syscall.ERANGE
	}
	return uint32(copy(dest, list)), 0
}

func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	return n.changeXattr(ctx, "setxattr", attr, func(fd int) error {
		return unix.Fsetxattr(fd, attr, data, int(flags))
	})
}

func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	return n.changeXattr(ctx, "removexattr", attr, func(fd int) error {
		return unix.Fremovexattr(fd, attr)
	})
}

func (n *node) changeXattr(ctx context.Context, op, attr string, apply func(fd int) error) syscall.Errno {
	f := n.fsys
	rel, ok := n.relPath()
	if !ok {
		return syscall.ENOENT
	}
	ev := f.event(ctx, op, rel)
	detail(&ev, "name", attr)
	err := policy.CheckXattr(rel, attr)
	if err == nil {
		err = f.access(ctx, rel, n.object(), policy.MayWrite)
	}
	if err == nil {
		err = f.admit(policy.OpSetattr, rel)
	}
	if err != nil {
		return f.refused(ctx, ev, err)
	}
	file, err := n.xattrFile(rel)
	if err != nil {
		if refusal(err) {
			return f.refused(ctx, ev, err)
		}
		return policy.Errno(err)
	}
	defer file.Close()
	if e := f.begin(ctx, ev); e != 0 {
		return e
	}
	if err := apply(int(file.Fd())); err != nil {
		return f.failed(ctx, ev, err)
	}
	return 0
}
