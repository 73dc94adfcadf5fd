// Package nodeid names the worker node loomfs runs on, as execution
// markers, audit chains and ledgers, change journals, self-checks and
// process records name it: $AGENT_LOOM_NODE if set, else the hostname.
//
// Workers that share a volume must have different names: each node's
// audit chain and ledger, and the owner of a process, are told apart by
// it. The hostname gives that on real machines; the variable lets an
// operator say so where it doesn't (containers that share a hostname, or
// a test standing in for two nodes on one host).
package nodeid

import (
	"fmt"
	"os"
	"sync"
)

// Env is the variable that names the node.
const Env = "AGENT_LOOM_NODE"

// Name returns this node's name.
func Name() (string, error) {
	if v := os.Getenv(Env); v != "" {
		return v, nil
	}
	h, err := hostname()
	if err != nil {
		return "", fmt.Errorf("node name: %w", err)
	}
	return h, nil
}

// hostname is read once: Name is asked for each journal file and call
// record a reader looks at, and os.Hostname reads a file each time.
var hostname = sync.OnceValues(os.Hostname)
