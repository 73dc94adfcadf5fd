// Command gentree writes a reproducible tree of text files for benchmarks:
// N files spread over directories, each a few KiB of word lines, some
// containing the marker word "loomneedle".
package main

import (
	"bufio"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
)

var words = []string{"alpha", "beta", "gamma", "delta", "func", "return", "struct", "value", "error", "context",
	"workspace", "policy", "store", "mount", "lock", "write", "read", "buffer", "index", "match"}

func main() {
	dir := flag.String("dir", "", "directory to fill (created)")
	files := flag.Int("files", 10000, "number of files")
	size := flag.Int("size", 8192, "bytes per file (about)")
	flag.Parse()
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "gentree: -dir is required")
		os.Exit(2)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < *files; i++ {
		d := filepath.Join(*dir, fmt.Sprintf("d%03d", i%100), fmt.Sprintf("e%02d", (i/100)%10))
		if err := os.MkdirAll(d, 0o700); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		f, err := os.OpenFile(filepath.Join(d, fmt.Sprintf("f%05d.txt", i)), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		w := bufio.NewWriter(f)
		n := 0
		for line := 0; n < *size; line++ {
			var s string
			for k := 0; k < 8; k++ {
				s += words[r.IntN(len(words))] + " "
			}
			if i%50 == 0 && line == 3 {
				s += "loomneedle"
			}
			s += "\n"
			n += len(s)
			w.WriteString(s)
		}
		w.Flush()
		f.Close()
	}
}
