// Command loopback mounts go-fuse's own plain loopback filesystem, the
// baseline loomfs is compared against in bench/fuse.sh. It is a benchmark
// tool only: loomfs never uses LoopbackNode.
package main

import (
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
	flag.Parse()
	if flag.NArg() != 2 {
		fmt.Fprintln(os.Stderr, "usage: loopback ORIGINAL MOUNTPOINT")
		os.Exit(2)
	}
	root, err := fs.NewLoopbackRoot(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sec := time.Second
	server, err := fs.Mount(flag.Arg(1), root, &fs.Options{
		AttrTimeout:  &sec,
		EntryTimeout: &sec,
		MountOptions: fuse.MountOptions{FsName: "loopback", Name: "loopback", DirectMount: true, MaxWrite: 1 << 20},
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
