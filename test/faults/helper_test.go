package faults

import (
	"context"
	"fmt"
	"os"

	"github.com/agentloom/loomfs/audit"
)

// helper runs this test binary as a helper process (LOOMFS_FAULTS_HELPER),
// so that strace can fault a part of loomfs the command line does not
// reach on its own. It returns the exit status.
func helper(name string, args []string) int {
	switch name {
	case "audit-rotate":
		return auditRotate(args[0])
	}
	fmt.Fprintln(os.Stderr, "unknown helper", name)
	return 2
}

// auditRotate appends 20 records to the root's audit chain with files of
// 2 KiB, so the chain rotates several times, printing "recorded" for each
// record Record acknowledged (synchronously, so it is in the file).
func auditRotate(root string) int {
	l, err := audit.Open(root, audit.Options{Node: "faults", MaxFileBytes: 2048, Sync: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, "audit open:", err)
		return 1
	}
	for i := range 20 {
		e := audit.Event{Source: audit.SourceAdmin, Op: "faults_rotation", Path: fmt.Sprintf("r%02d", i), Result: "ok"}
		if err := l.Record(context.Background(), e); err != nil {
			fmt.Fprintln(os.Stderr, "audit record:", err)
			l.Close()
			return 1
		}
		fmt.Println("recorded")
	}
	if err := l.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "audit close:", err)
		return 1
	}
	return 0
}
