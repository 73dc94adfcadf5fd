// Package hooks runs the platform's tool.before and tool.after hooks
// around each call of the tool door (seed 000 §2): Go functions an
// embedder registers and commands the policy file names, in Claude Code's
// shape (the call as JSON on stdin, exit 2 denies). A hook sees values,
// never the workspace: nothing it returns can change the scope, root or
// volume, and rewritten arguments go through the same validation and
// policy as the model's. A hook that fails denies the call.
package hooks
