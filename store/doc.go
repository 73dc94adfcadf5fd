// Package store is fd-based access to the scopes of a workspace volume: the
// layout, the walker that resolves every path beneath a scope's pinned
// directory fd without following a symlink, atomic writes and exclusive
// creates (with or without RENAME_NOREPLACE), scope locks, execution
// markers and the record of tool calls.
//
// It never hands a path string from outside to a path-based syscall, and
// it asks the policy package about every object it opens; it decides no
// rule itself.
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
