// Package tools is the tool door of loomfs: the model-visible workspace
// tools (SPEC §4) and their handlers. A handler turns JSON arguments into
// one policy question and one store call, and the answer into a JSON result
// or a *policy.Error. It never decides a rule itself.
//
// Beside the SPEC §4 tools it serves the agent's other tools:
// workspace_apply_patch (patch.go: package patch parses and locates, the
// store's change sets write all or nothing), multi-edit in workspace_edit
// (edit.go), workspace_read_image (image.go) and workspace_changes
// (changes.go, over package changes). Their definitions are generated from
// the policy like the others (defs_agent.go).
//
// A call that changes something runs in this order (toolbox.go): its
// "started" audit record goes to the log while the call records its call
// id for replay and takes the scope lock (each a round trip to a shared
// volume's server, so they overlap); the handler runs once that record is
// kept, so nothing changes unrecorded; the lock is let go while the
// outcome is recorded. A read is one audit record, its outcome. The
// caller's budget bounds every call, even one whose system call hangs
// (callWithin): the answer then says whether the change may yet happen.
package tools
