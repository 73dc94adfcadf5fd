// Package patch parses the multi-file patches models write — Codex's
// apply_patch format and unified diffs — and applies one file's hunks to
// its text, locating each hunk by its lines the way Codex does: exactly,
// then ignoring trailing whitespace, then ignoring surrounding whitespace
// (and typographic punctuation), never by line number alone.
//
// Files and errors carry the patch line (counted as the model wrote the
// text) and the header of the part they belong to, so a refusal can name
// both.
//
// What the actions mean is Codex's, as the tool door applies them
// (tools/patch.go): an Add over an existing file and an Update's MoveTo
// onto one replace it, unless the call's expected_sha256 names that path
// and does not match; a Delete of an emulated link removes the link, as
// workspace_delete does; a Delete of a directory, an Update of a missing
// file and a hunk that does not apply are refused. Codex stops at the
// first part that fails and keeps the parts before it; the door checks
// every part first and writes all of them or none.
//
// It is pure: it reads and writes no file. Checking paths against the
// policy and writing the results atomically is the tool door's work
// (tools/patch.go, store.Workspace.ApplyChanges).
package patch
