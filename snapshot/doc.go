// Package snapshot keeps incremental, content-addressed snapshots of a
// scope and restores them (SPEC §6). It reads a scope only through the
// store's fd-based walk and never follows a symlink; it keeps its records
// only under the volume root, outside every scope and projection.
//
// # Layout
//
// Each scope's snapshots live in <root>/.agentloom-snapshots/<scope-hash>/:
//
//	blobs/ab/ab12…     file contents, named by their sha256
//	snapshots/ID.json  a snapshot's manifest (id, scope, label, run, counts)
//	snapshots/ID.files.json  its entries: path, type (file, dir, symlink), size, mode, mtime, sha256
//	index              (path, size, mtime, ctime, inode) → sha256 of the last snapshot
//
// A snapshot is incremental: a file whose size, times and inode match the
// index is not read again, and content already stored costs no new bytes,
// so a snapshot after a few changes writes only the changed files' bytes
// plus its manifest. The manifest is written last; a snapshot without one
// never happened. Blobs no manifest refers to are swept by retention.
//
// # What is not kept
//
// Symlinks, hard-linked files, FIFOs, sockets, devices and setuid or
// setgid files are skipped and listed in the manifest as skipped; so is
// any object on another filesystem or mount (a bind mount included). An
// emulated link (store/link.go) is kept, as an entry of type "symlink"
// whose blob is its target, and is restored as the same marked file, never
// as a symlink. Owner, group and times of directories
// are not kept; a restored file gets its recorded owner permission bits
// (at most 0700) and modification time.
//
// # Snapshots are not backups
//
// Snapshots share the volume with the scope they copy: a lost or
// corrupted volume takes both. They are for rolling a workspace back and
// for a per-run view of its artifacts; copy what matters to independent
// storage (see SNAPSHOTS.md).
package snapshot
