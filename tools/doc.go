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
package tools
