// Package fork copies a scope into another as of a snapshot (Fork) and
// brings the copy's changes back with a three-way comparison against that
// snapshot (Merge), per file, with the base's hash as the expected one, so
// a change made in the source since the fork is never overwritten.
//
// It reads and writes scopes only through package store and takes file
// contents from the snapshot store's blobs (package snapshot); it never
// copies a hidden or write-only subtree of the source into a scope where
// it would be readable, and never carries content into a read-only or
// hidden subtree of the target.
//
// # The fork's base
//
// A fork's record (RecordFile in the fork's state directory, outside every
// projection) names the source scope and snapshot and lists every entry
// the fork received, with its sha256 and what fstat said of the fork's
// copy right after it was made (inode, size, times). A file whose fstat
// still says the same is unchanged and is not read again by Merge or
// Status; anything else is hashed. After a merge the paths it brought over
// (or found already the same) take the fork's state as their new base.
// The record is a line of JSON (source, snapshot, how many entries) and a
// line of text an entry, which reads back about ten times faster than the
// older format, all JSON, which is still read.
//
// # Cost
//
// File data comes from the blobs by FICLONE where the filesystem shares
// extents (XFS with reflink=1, btrfs), so a fork writes only metadata
// there; elsewhere it is copied (copy_file_range). Blobs are named by
// their content and checked when stored; a fork checks each one's size,
// not its hash. A merge stats every entry of the fork, on several
// goroutines (idle ones take over subtrees), and writes the fork's next
// record, fsynced, while its changes are applied: the record is renamed
// into place only after them, and a merge that fails leaves it as it was.
//
// # What a merge carries
//
// Regular files (created, changed, deleted) are applied as one change set
// under the target's scope lock (store.Workspace.ApplyChanges: an intent
// record, all or none). Directories the fork made empty are made after it,
// and directories it removed are removed when they are empty in the target
// too. Emulated links are carried as the target's policy says of links
// (symlinks: emulate makes them after the change set; refuse refuses them,
// listed); a link's removal is in the change set. A new file keeps the
// owner's bits the fork gave it (an executable stays one); a replaced file
// keeps the target's mode, as a replace through the tool door does, and a
// change of mode alone is not seen. Nothing goes into a subtree the
// target's policy makes read-only or hidden, and no conflict marker carries
// a write-only file's content out. The change feed shows a merge as one
// call (MergeOptions.Call, from the platform's door unless Source says the
// tool's); the caller audits it on both scopes, as "loomfs merge" and
// workspace_merge do.
//
// # Forks of a scope
//
// A source scope notes each fork made from it in its state directory
// (ForksDir), so its agent's workspace_fork_status can preview every
// fork's merge without a walk of the volume.
package fork
