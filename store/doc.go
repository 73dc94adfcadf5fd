// Package store is fd-based access to the scopes of a workspace volume: the
// layout, the walker that resolves every path beneath a scope's pinned
// directory fd without following a symlink, atomic writes and exclusive
// creates (with or without RENAME_NOREPLACE), scope locks, execution
// markers and the record of tool calls.
//
// It never hands a path string from outside to a path-based syscall, and
// it asks the policy package about every object it opens; it decides no
// rule itself.
package store
