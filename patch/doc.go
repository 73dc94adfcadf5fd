// Package patch parses the multi-file patches models write — Codex's
// apply_patch format and unified diffs — and applies one file's hunks to
// its text, locating each hunk by its lines the way Codex does: exactly,
// then ignoring trailing whitespace, then ignoring surrounding whitespace
// (and typographic punctuation), never by line number alone.
//
// It is pure: it reads and writes no file. Checking paths against the
// policy and writing the results atomically is the tool door's work
// (tools/patch.go, store.Workspace.ApplyChanges).
package patch
