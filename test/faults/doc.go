// Package faults is loomfs's fault-injection matrix: each operation of each
// door, run by the loomfs binary under strace with an errno or a SIGKILL
// injected at every call site of the system calls that change the volume,
// and on real devices that fill up, run out of inodes, descriptors or
// memory, or fail; after every cell it checks what a user relies on: no
// crash, no hang, old content or new and never torn, nothing acknowledged
// lost, no temporary file in sight, the scope free for the next call, the
// quota account equal to a walk, the audit chain intact, no mount left.
//
// The package holds only tests. go test runs a bounded slice of the matrix;
// LOOMFS_FAULTS=full (make faults) runs it whole. RELIABILITY.md is its table.
package faults
