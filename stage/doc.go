// Package stage is the platform's door into a scope (seed 001 §1.2,
// §3.1): the runtime, not the agent, lays out the workspace, puts the
// task's inputs into read-only data/ and its own configuration into
// hidden .meta/, and reads the agent's write-only output/ back.
//
// Staging copies files, directories or a tar stream from the platform's
// side into any subtree, ro and hidden ones included, under the same
// object rules as the other doors (no symlinks, hard links, special files
// or mount points from the source: refused and listed, the rest staged),
// the same per-file limit, quota and caps with their figures, atomically
// per file (store.Workspace.PlaceFile), journalled and audited with source
// "platform". Collecting reads any subtree with the object checks and caps
// of artifacts.
//
// It must never be reachable from a tool call, MCP or a container: the
// tools, mcpserver, fusefs and sandbox packages never import it (a test
// says so), and only cmd/loomfs stage and collect, or a platform's own Go
// code, call it.
package stage
