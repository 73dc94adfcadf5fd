// Command metaops times the metadata workload of bench/fuse.sh: create N
// small files, stat each, delete each, in one directory. It prints seconds.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

func main() {
	n := flag.Int("n", 5000, "files")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: metaops [-n N] DIR")
		os.Exit(2)
	}
	dir := flag.Arg(0)
	start := time.Now()
	for i := 0; i < *n; i++ {
		if err := os.WriteFile(filepath.Join(dir, "f"+strconv.Itoa(i)), []byte("x\n"), 0o600); err != nil {
			fail(err)
		}
	}
	for i := 0; i < *n; i++ {
		if _, err := os.Stat(filepath.Join(dir, "f"+strconv.Itoa(i))); err != nil {
			fail(err)
		}
	}
	for i := 0; i < *n; i++ {
		if err := os.Remove(filepath.Join(dir, "f"+strconv.Itoa(i))); err != nil {
			fail(err)
		}
	}
	fmt.Printf("%.3f\n", time.Since(start).Seconds())
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "metaops:", err)
	os.Exit(1)
}
