// Package sandbox runs one shell command per container on the local Docker
// engine, with a scope's projection at /workspace and nothing else mounted.
//
// It talks only to a local unix socket, never pulls an image, and never
// reports a command finished before the engine confirms its container is gone:
// an execution marker is set before the container starts (before it is
// created, when Run creates it) and cleared only after removal is
// confirmed, so a crash leaves the scope quarantined instead of racing a
// leftover container. The same holds for a leftover executor: a process
// that still holds the projection after its container was removed
// (Holders) quarantines the scope too; in a scope recently used (below)
// that scan runs just after the command's answer. Every wait after a
// failed start is bounded, and the runtime's own message comes back
// (ErrStartFailed). With a Pool, Commands prepares the container of a
// recently used scope's next command once a command is answered
// (Runner.Prepare: created, not started, same hardening, its command
// handed on its standard input at start), so a command pays only the
// start, the wait and the removal. A prepared
// container no command took is removed with its projection, at Pool.Close,
// or after a crash by SweepPrepared.
// Containers run under a seccomp profile of our own (SeccompProfile), passed
// inline. BuildImage makes the sandbox image locally from Debian packages.
// Runner.Exec runs the same command as an exec in a container kept running
// by its caller (a scope's session sandbox) and kills what the command left
// running before it answers.
package sandbox
