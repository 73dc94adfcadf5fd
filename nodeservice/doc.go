// Package nodeservice carries process calls between the processes of one
// node and the long-lived service that owns its session sandboxes
// (loomfs serve), so that a process started by one call is reached by any
// later call on the node: a CLI call, another MCP session, the Go API.
// Under the policy's "commands: session" it carries workspace_command too,
// to run in the service's session sandbox of the scope.
//
// It speaks JSON over HTTP on a unix socket that only root may reach (the
// socket's directory is 0700, the socket 0600, and the server checks each
// peer's uid). It never carries a call to another node.
package nodeservice
