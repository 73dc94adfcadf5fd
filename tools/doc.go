// Package tools is the tool door of loomfs: the model-visible workspace
// tools (SPEC §4) and their handlers. A handler turns JSON arguments into
// one policy question and one store call, and the answer into a JSON result
// or a *policy.Error. It never decides a rule itself.
package tools
