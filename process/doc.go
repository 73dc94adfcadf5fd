// Package process runs a scope's long-lived processes (SPEC §5.1): one
// session sandbox per scope, a container that lives across calls over the
// scope's FUSE projection, and processes as engine execs in it, each with
// stdin, an optional terminal and a bounded output buffer read by cursor.
//
// It reuses the sandbox package's hardening and cleanup and never weakens
// them: the session container's marker lives as long as the container and
// goes only once its removal is confirmed, under a lease that tells a live
// session from one whose worker died (that scope is then quarantined, as
// for a one-shot command). It never holds the scope lock for a process's
// life, only while it starts the sandbox or a process. Under the policy's
// "commands: session" it also runs workspace_command in the session
// sandbox (Service.RunCommand), answered as a one-shot command is.
//
// A process is its whole tree (tree.go): it runs under a group id of its
// own that everything it starts inherits and can't drop, so what it leaves
// running is killed when it exits and a signal reaches all of it. A kill
// is done from the host where the worker sees the container's cgroups
// (cgroup.go): the container frozen while the tree is found, so that a
// fork bomb spinning on every CPU it has can't slow it. Elsewhere (gVisor,
// a worker without the privilege) a controller in the sandbox does it all,
// which forks nothing and so still works when the pids limit is spent. It
// never lets a process's tree outlive the process, and gives the
// container no privilege to do so.
package process
