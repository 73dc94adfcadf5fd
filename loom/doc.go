// Package loom is loomfs for a Go program that embeds it: one Node per
// worker opens Sessions over scopes, each with the workspace tools (and
// their sandbox commands), its audit log, FUSE projections, and the
// scope's long-lived processes. cmd/loomfs is a thin shell over it.
//
// It only wires the other packages together; every rule lives in policy,
// every file operation in store, and it never weakens what sandbox and
// process enforce.
package loom
