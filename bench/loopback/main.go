// Command loopback mounts go-fuse's own plain loopback filesystem, the
// baseline loomfs is compared against in bench/fuse.sh. It is a benchmark
// tool only: loomfs never uses LoopbackNode.
//
// As go-fuse ships it, the loopback hands every open file to the kernel
// for passthrough where it can (root, Linux 6.9+): its reads and writes
// then never reach the daemon. -no-passthrough keeps them in the daemon,
// as loomfs keeps every write, so the two do the same work per write.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

func main() {
	debug := flag.Bool("debug", false, "log every FUSE request to stderr")
	noPassthrough := flag.Bool("no-passthrough", false, "serve every read and write in the daemon")
	flag.Parse()
	if flag.NArg() != 2 {
		fmt.Fprintln(os.Stderr, "usage: loopback [-debug] [-no-passthrough] ORIGINAL MOUNTPOINT")
		os.Exit(2)
	}
	root, err := fs.NewLoopbackRoot(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if *noPassthrough {
		root = &plainNode{root.(*fs.LoopbackNode)}
	}
	sec := time.Second
	server, err := fs.Mount(flag.Arg(1), root, &fs.Options{
		AttrTimeout:  &sec,
		EntryTimeout: &sec,
		MountOptions: fuse.MountOptions{FsName: "loopback", Name: "loopback", DirectMount: true, MaxWrite: 1 << 20, Debug: *debug},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Fprintln(os.Stderr, "mounted")
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGINT, syscall.SIGTERM)
	go func() { <-c; server.Unmount() }()
	server.Wait()
}

// plainNode is a loopback node whose files are never handed to the kernel
// for passthrough; its children are plainNodes too.
type plainNode struct{ *fs.LoopbackNode }

func (n *plainNode) WrapChild(ctx context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	return &plainNode{ops.(*fs.LoopbackNode)}
}

// plainFile is a loopback file that declines passthrough.
type plainFile struct{ *fs.LoopbackFile }

func (plainFile) PassthroughFd() (int, bool) { return 0, false }

func plain(fh fs.FileHandle) fs.FileHandle {
	if f, ok := fh.(*fs.LoopbackFile); ok {
		return plainFile{f}
	}
	return fh
}

func (n *plainNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fh, fl, e := n.LoopbackNode.Open(ctx, flags)
	return plain(fh), fl, e
}

func (n *plainNode) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	in, fh, fl, e := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	return in, plain(fh), fl, e
}
