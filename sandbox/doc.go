// Package sandbox runs one shell command per container on the local Docker
// engine, with a scope's projection at /workspace and nothing else mounted.
//
// It talks only to a local unix socket, never pulls an image, and never
// reports a command finished before the engine confirms its container is gone:
// an execution marker is set before the container is created and cleared only
// after removal is confirmed, so a crash leaves the scope quarantined instead
// of racing a leftover container. The same holds for a leftover executor: a
// process that still holds the projection after its container was removed
// (Holders) quarantines the scope too. Every wait after a failed start is
// bounded, and the runtime's own message comes back (ErrStartFailed).
// Containers run under a seccomp profile of our own (SeccompProfile), passed
// inline. BuildImage makes the sandbox image locally from Debian packages.
// Runner.Exec runs the same command as an exec in a container kept running
// by its caller (a scope's session sandbox) and kills what the command left
// running before it answers.
package sandbox
