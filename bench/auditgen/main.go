// Command auditgen writes a reproducible audit log for benchmarks: N
// records over the last D days from K nodes, each node's records written
// by a succession of writers (as short-lived loomfs processes would), with
// the real writer, so verify and query read what production writes.
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"

	"github.com/agentloom/loomfs/audit"
)

func main() {
	root := flag.String("root", "", "volume root to write <root>/.agentloom-audit under (created)")
	records := flag.Int("records", 1_000_000, "records in all")
	days := flag.Int("days", 30, "days the records span, ending now")
	nodes := flag.Int("nodes", 4, "nodes")
	perWriter := flag.Int("per-writer", 1000, "records per writer (process)")
	scopes := flag.Int("scopes", 200, "scopes the records are spread over (acme/agentN/sM)")
	keys := flag.String("keys", "", "sign: directory of node-N.key files (loomfs audit keygen --node node-N)")
	flag.Parse()
	if *root == "" || *records < 1 || *days < 1 || *nodes < 1 || *perWriter < 1 || *scopes < 1 {
		fmt.Fprintln(os.Stderr, "auditgen: -root is required; counts must be positive")
		os.Exit(2)
	}
	if err := os.MkdirAll(*root, 0o700); err != nil {
		fmt.Fprintln(os.Stderr, "auditgen:", err)
		os.Exit(1)
	}
	end := time.Now().UTC()
	span := time.Duration(*days) * 24 * time.Hour
	each := *records / *nodes
	step := span / time.Duration(each)
	r := rand.New(rand.NewPCG(1, 2))
	ops := []string{"workspace_write", "workspace_read", "create", "release", "unlink", "rename", "workspace_command"}
	for n := range *nodes {
		now := end.Add(-span)
		clock := func() time.Time { return now }
		node := fmt.Sprintf("node-%d", n+1)
		for written := 0; written < each; {
			opts := audit.Options{Node: node, Clock: clock}
			if *keys != "" {
				opts.KeyFile = filepath.Join(*keys, node+".key")
			}
			l, err := audit.Open(*root, opts)
			if err != nil {
				fmt.Fprintln(os.Stderr, "auditgen:", err)
				os.Exit(1)
			}
			for i := 0; i < *perWriter && written < each; i++ {
				s := r.IntN(*scopes)
				e := audit.Event{
					CallID: fmt.Sprintf("call-%d-%d", n, written),
					Actor:  audit.Actor{Space: "acme", Agent: fmt.Sprintf("agent%d", s%20), Session: fmt.Sprintf("s%d", s), Run: "run-1"},
					Scope:  fmt.Sprintf("%016x", s),
					Source: audit.SourceFUSE, Op: ops[r.IntN(len(ops))],
					Path:  fmt.Sprintf("src/pkg%d/file%d.go", r.IntN(50), r.IntN(1000)),
					Bytes: int64(r.IntN(1 << 16)), Result: "ok", Duration: time.Duration(r.IntN(1e6)),
				}
				if err := l.Record(context.Background(), e); err != nil {
					fmt.Fprintln(os.Stderr, "auditgen:", err)
					os.Exit(1)
				}
				written++
				now = now.Add(step)
			}
			if err := l.Close(); err != nil {
				fmt.Fprintln(os.Stderr, "auditgen:", err)
				os.Exit(1)
			}
		}
	}
}
