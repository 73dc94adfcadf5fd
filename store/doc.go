// Package store is fd-based access to the scopes of a workspace volume: the
// layout, the walker that resolves every path beneath a scope's pinned
// directory fd without following a symlink, atomic writes and exclusive
// creates (with or without RENAME_NOREPLACE), scope locks, execution
// markers and the record of tool calls. The scope's usage (Usage, Reserve,
// Adjust) is its shared quota account, package quota, kept in the state
// directory's QuotaDir and joined by each Workspace on first use; each
// capped subtree (ReserveAt, SubtreeUsage) has an account of its own there,
// so its cap too holds across processes and nodes; its I/O
// limiter (Limiter, package throttle) is shared the same way through
// ThrottleDir.
//
// It never hands a path string from outside to a path-based syscall, and
// it asks the policy package about every object it opens; it decides no
// rule itself.
//
// # Session sandboxes
//
// A scope's session sandbox (SPEC §5.1) keeps its marker (SessionMarker)
// for the container's life without holding the scope lock; its owner holds
// the session lease (TakeSessionLease, an OFD lock like the scope lock)
// instead. Lock quarantines the scope when it finds the marker and the
// lease free (the worker died); CheckIdle calls the scope busy while the
// marker stands. Process records live in ProcessesDir, one JSON file each.
//
// # What a lock holder looks for
//
// Whoever takes the scope lock looks in the state directory for what a
// dead holder left (an execution marker, a session marker nobody's lease
// covers, a change set cut midway, the quarantine flag) and acts on it.
// Where a directory's stat is as fresh as a lookup (local disks, CephFS)
// a look that found none of them is kept with the directory's stamp, and
// a later holder that finds the stamp unchanged makes one stat instead of
// four lookups (statelook.go). The lock file itself stays open from one
// Lock to the next and is checked against its name whenever the directory
// changed.
//
// # The platform's view
//
// Open makes the policy's layout directories that are missing
// (policy.Policy.Layout; LayoutMade says which, for the opener to audit).
// Platform is a view without the path modes, for the platform's own door
// (package stage): it fills ro and hidden subtrees and reads wo ones,
// under every other rule; PlaceFile is its streamed atomic write.
// # Budgets
//
// OpenVolume, Volume.Open and Workspace.Lock answer timeout when their
// context is done, even while a system call of theirs waits in the kernel
// (a CephFS client that died holding what the call needs): the call keeps
// its goroutine (package budget), what it takes afterwards is given back,
// and Close waits for it before closing the fds it uses.
//
// # Call records
//
// BeginCall and FinishCall keep the outcome of a tool call for replay
// (SPEC §4) in the state directory's call records (package callrec: an
// append-only log per writer, read incrementally); the tool door records
// changes only. The records go when retention removes the session.
//
// # Change sets
//
// ApplyChanges changes several files all or nothing (workspace_apply_patch):
// everything is checked first (policy, expected hashes, quotas), the new
// contents are staged under reserved names beside their files, an intent
// record (IntentFile in the state directory) is committed, and the renames
// and deletes follow. Whoever takes the scope lock next (Lock) finishes a
// change set a crash cut: rolled back while its record says staging,
// forward once it says commit (intent.go).
//
// # Change journal
//
// The change journals (journal.go) list what each process changed, one
// line per change, for snapshots and the change feed: the path, and after
// a tab what the change was and who made it (op, source, call id, time, a
// rename's both paths). The format is described at the top of journal.go;
// readers that want only paths ignore what follows the tab. Journals a
// reader removes are listed in the journal directory's RemovedFile first,
// so a change-feed cursor older than them answers reset.
//
// # Emulated symbolic links
//
// The store never makes a symlink. A symbolic link made in the projection
// (policy "symlinks: emulate", SPEC §3.2) is a regular file holding its
// target, mode policy.LinkPerm (01600), written whole as an O_TMPFILE or
// under a reserved temporary name and then given its name without
// replacing anything (Workspace.Symlink, PlaceLink). The sticky bit on a
// regular file is the marker (policy.LinkMarker, policy.ObjectOf gives
// KindLink): no create or chmod through either door sets it, and unlike a
// "trusted." extended attribute it survives NFS and CephFS. Nothing on the
// host follows a regular file, so the link is inert there. ReadLink reads
// a target back only from a marked file with one link and a valid target
// (1 to 4,095 bytes, no NUL). A marked file planted on the host is taken
// for a link; that is harmless, since a link only names a path whoever
// follows it could name anyway. Links count as one file and their target's
// bytes in the quotas, like the files they are on disk.
package store
