// Package fusefs projects one scope of the workspace through a FUSE
// filesystem that asks the policy package the same questions the tool
// handlers ask. It must never reach a host file by a path string: every
// backing access is an *at call on a directory fd the store resolved
// beneath the scope.
//
// # One door, the same rules
//
// Each FUSE request is translated the way a tool call is: the node's
// cleaned path inside the scope, then the policy question
// (Policy.Check, policy.CheckName, policy.CheckObject,
// policy.CheckCreateKind, policy.CheckChmod, the limits), then the store
// (Workspace.Parent or Workspace.Open, or Workspace.ParentIn for a
// directory the mount made and kept open; one *at call on the fd it
// returned, fstat of what was opened), then policy.Errno for the answer. Node and
// file types are our own (node, handle, dirHandle); go-fuse's loopback
// types, which track files by path string, call path-based syscalls and
// forward raw ioctls, are never used.
//
// What the projection refuses: special files (EPERM), and symlinks when
// the policy says "symlinks: refuse"; new hard links (EXDEV, so programs
// fall back to copying); opening, following or writing objects someone
// else put in the backing store, real symlinks and hard-linked files among
// them (they are listed for what they are); names the tools could not
// address, "subagents" at the top of a main scope and ".agentloom-*"
// (EPERM, never EINVAL, which "rm -f" takes for a missing file;
// ".agentloom-*" entries are not listed at all), and names over 255 bytes
// or paths over 4096 (ENAMETOOLONG, at lookup too); anything on another
// mount than the scope's, a bind mount of the same filesystem included
// (refused on lookup by policy.CrossMount; readdir still lists the name);
// setuid, setgid
// and sticky bits; ioctls (ENOTTY); extended attributes unless
// Options.UserXattrs enables the "user." namespace; RENAME_WHITEOUT;
// fallocate(FALLOC_FL_KEEP_SIZE) past the end of a file (EOPNOTSUPP: the
// quota counts apparent size and could not see the space); moving
// a directory with path rules beneath it, or a file out of a "wo" subtree. Path rules answer EROFS
// (ro), EACCES (wo, reading) and ENOENT (hidden); the per-file size limit
// and the scope quota answer EFBIG and EDQUOT on write, truncate,
// fallocate and copy_file_range, counting apparent size so sparse files
// count in full (statfs shows the quota); a capped subtree (tmp/) counts
// what is written and moved into it in the same account as the tools. The
// scope quota and each subtree cap are shared accounts (package quota), so
// other mounts, other nodes and the tool door draw on them too. A file
// unlinked or renamed over while open stays counted until its last
// release, when its size is given back (unnamed.go); so does an O_TMPFILE
// file (Tmpfile),
// unless linkat(2) through /proc/self/fd names it first, which is the one
// hard link the mount makes.
// Deleting, overwriting or moving away what a subtree marks for two-step
// confirmation answers EPERM: the filesystem can't ask twice. A
// quarantined scope answers EROFS to every change and still reads.
//
// Files loomfs places itself are not listed: policy.ReadyFile, served by
// the mount alone, answers lookup, stat and open but no readdir, so git add
// -A, tar and cp -r never take it. The generated README (policy.ReadmeFile)
// is listed: it is meant to be read.
//
// # Symbolic links
//
// With "symlinks: emulate" (the default) symlink(2) makes an emulated link
// through the store (store.Workspace.PlaceLink): on the backing store a
// regular file holding the target, marked with the sticky bit, never a
// symlink. The mount shows such a file as a symlink (S_IFLNK, mode 0777,
// size the target's length, DT_LNK in readdir; its node type is the
// link's, so a file replaced by a link is a new node), answers readlink
// with its target, and lets rename, unlink and times change it; its mode
// can't be changed (EOPNOTSUPP), so the marker can't be taken away or set
// by chmod. The kernel then follows the link in the caller's own view: in
// a sandbox that is the container's, so a link reaches only what the
// container already sees. On the host a link with an absolute target
// names a host file, so a host-side mount sets Options.NoFollowLinks and
// answers readlink with EPERM. With "symlinks: refuse" symlink(2) answers
// EPERM and links made earlier are shown but not followed. A link's
// target never changes (no door writes through a link, and a new link is
// a new file), so the kernel keeps the targets it read (FUSE
// CACHE_SYMLINKS): following a link costs 2 µs instead of 21 µs. A link
// replaced by another door is a new inode, seen once the entry is looked
// up again: when the change journal's line for it is read (see Caching),
// as for files.
//
// # Identity and caching
//
// A node's inode number is the backing file's, and its generation the
// backing file's birth time, so a file replaced by rename (as the tool
// door's atomic writes do) is a new node. An operation on a node whose
// path now holds another object, or that left the tree, answers ESTALE,
// and the kernel then looks the path up again (the mechanism NFS uses), so
// an open or stat after a replacement never serves the old file. The
// kernel retries only once, so a plain read-only open whose path now holds
// another regular file opens that file instead (FOPEN_DIRECT_IO, so no
// read depends on what the kernel still knows of the old node): a reader
// racing a stream of replaces gets the old file or the new one, never an
// error. A read (an open for reading, a link's target) whose retry finds
// the path replaced again (a file and a link swapped in a loop) answers
// the retry ENOENT, as for a name removed under it, rather than the
// "stale file handle" the kernel would pass on (stale.go); a stat that
// races a replace sees the object as it was, as on a local disk (a node
// already replaced or removed through the mount is described as it was
// last told, with no link left). An operation on a file unlinked while
// open (fchmod, futimens) uses one of its opens; so does a change of mode
// or times of a file open in this mount (tar, cp -p and install set them
// on the file they are writing), whatever its path holds now: the request
// does not tell futimens from utimes by name, and the open pins the
// node's own object.
//
// A directory the mount made is kept open while the mount knows it
// (newdir.go: no other writer changed the scope since, within the entry
// timeout; 64 at most): a request naming one of its entries (create,
// mkdir, lookup, symlink, unlink, rename) makes its *at call on that
// descriptor instead of resolving the directory's path from the scope
// again, a round trip per request on a client that caches no entry
// (ceph-fuse), and a lookup there of a name the mount did not make is
// answered from memory. A tree another writer moved, removed or restored
// while such a descriptor was in use is noted again by the mount after
// its requests (echoTrees), so other mounts drop what they hold beneath
// its new place.
//
// # Caching, kept coherent by the change journals
//
// Every change either door makes, on any node, is noted in the scope's
// change journals (store/journal.go) before the change returns, but for
// the lines of an open for writing, which may reach the file up to 10 ms
// after it (see Change journal). A mount
// follows them (follow.go): inotify on the journal directory wakes it when
// a writer on this node appends, and it reads them every
// Options.JournalPoll (DefaultJournalPoll, 500 ms) in any case, since lines
// written on another node raise no event here. For each line another
// writer added it drops exactly what the kernel holds of that path: the
// entry (negative or not) in its parent, the attributes and pages of the
// object when it is the same object changed in place (a replaced one is
// only looked up again: its old node keeps its own, unchanged, contents for
// the readers that still have it open), the parent's attributes and
// cached listing; a removed object is dropped with NotifyDelete, a renamed
// or restored directory with everything the kernel knows beneath it. The
// mount's own changes need nothing dropped: their lines, in the journal
// files of the mount's own Workspace with the projection as their source,
// are skipped (a tool door sharing that Workspace writes lines of source
// "tool" there, which are not), and a write to its own file that added
// only its own lines wakes no pass at all (on a shared filesystem a pass
// is a listing and reads, round trips its writer waits behind). A journal
// file that vanishes before it was read to its end, or whose writer died without ending it,
// makes the mount drop everything once. Mounted.Serve (a pooled
// projection starting a command) reads the journals to their end first.
// Dropping a file's pages takes each page's lock, which the kernel holds
// on the page a write only partly fills until the write is answered: a
// drop can wait as long as a write this mount serves, so Unmount halts the
// follower but waits for it only once the session is over.
//
// So the kernel may keep for long (Options.CacheTimeout, DefaultCacheTimeout
// 5 minutes) what it learned: entries and attributes, failed lookups too
// (so a build's or git's probes for files that aren't there stay in the
// kernel), directory listings (FOPEN_CACHE_DIR), and a file's pages from
// one open to the next (FOPEN_KEEP_CACHE) when the file is as it was at
// its last open (size, mtime and ctime). The kernel still sends OPENDIR
// and RELEASEDIR for a listing it keeps, unless it opens directories
// itself, which it does by default ("cache: journal-dirs", dir.go
// openlessDirs): a warm walk then costs the daemon nothing per directory.
// Under "cache: journal" OPENDIR comes here, and once the mount has served
// the listing (and until the follower drops it) it is answered from the
// policy and the directory's last seen permission bits, without opening
// the backing directory (dir.go), so a warm find or git status costs the
// daemon two round trips per directory and no system call. Bounded staleness: on one node, a
// change is seen once the follower has read its line, a millisecond or so
// after it (the follower makes at most one pass per 25 ms during a burst of
// lines, so up to that); across nodes, within the poll interval plus the
// shared filesystem's own delay (measured on CephFS in BENCHMARKS.md).
// While a file is open for writing elsewhere its writes are not noted one
// by one: its lines come at the open and at the release (up to 10 ms
// after it), and opens here in between see its new contents only when its
// size or times changed.
// Reads the kernel answers from pages it kept are not counted in the
// release record's bytes (the record says "kept_pages"). A file's second
// and later read-only opens are answered from a descriptor its first kept
// (reader.go): the policy is asked and the object checked again, from the
// descriptor, without a walk of its path.
//
// A change made behind loomfs's back (an administrator editing the backing
// store directly) is in no journal: it is seen when the kernel's entry or
// attributes expire, up to CacheTimeout later, and its pages at the next
// open once the times show the change. Where the backing store is changed
// that way, set "cache: strict" in the policy: entries and attributes for
// one second (StrictCacheTimeout, the libfuse default), failed lookups not
// cached, pages dropped at every open, no journal followed. That costs
// warm workloads several times over (BENCHMARKS.md); with no caching at
// all every syscall re-resolves every path component.
//
// Permissions are checked by the daemon, per request, with the caller's
// uid (policy.CheckAccess), and by default by the kernel too, from the
// attributes the mount showed it (default_permissions, which the kernel
// opening directories itself needs: no OPENDIR comes to be refused). The
// kernel then asks for a directory's attributes again after every create
// or unlink in it, before the next; for a directory the mount made, the
// answer is an fstat of the descriptor it keeps (newdir.go), not a walk of
// the path. An owner-bit refusal the kernel makes is not recorded: it is
// the agent's own mode, refused as on any disk. Under "cache: journal" the
// daemon alone checks, and the rest of this paragraph is about that case.
// Every object is shown as the sandbox user's (Options.UID/GID), with the
// owner bits of the backing object and no group or other bits; chown to
// that owner succeeds and changes nothing (cp -p, install, rsync -a), any
// other owner is EPERM. Create, mkdir and chmod keep the owner bits asked
// for (policy.OwnerPerm), so executables stay executable, and never set a
// group, other, setuid, setgid or sticky bit. That user gets the owner
// bits of the backing object, other users nothing (EACCES, recorded; group
// bits give them nothing either), root everything, and the root daemon
// does the real I/O. The daemon sees a caller's uid, not its capabilities: a uid-0
// process without CAP_DAC_OVERRIDE counts as root here, which the
// sandbox, never uid 0 (SPEC §5), does not meet. Two things follow from
// the kernel no longer checking. A FIFO is opened by the kernel itself, as a pipe of its
// own, without asking the daemon, so a planted FIFO is refused at lookup
// to everyone but root, and its entry is never cached. And a path walk
// through entries the kernel cached is not asked again, so while they
// last the sandbox user may still walk through a directory it just took
// its own search permission from. Another user is refused
// by every request that reaches the daemon (what the kernel answers from
// its caches is not asked); the mountpoint's parent is root's and closed,
// so only the sandbox's own bind mount leads there at all.
//
// # Audit
//
// A change is recorded before it is made, so nothing happens unrecorded:
// if the sink fails, the change is refused with EIO (audit_unavailable).
// Should the store then fail it, a second record with result "error"
// follows. Refusals are recorded as "refused" with their code. Writes are
// admitted by recording the open for writing; reads and writes are
// summarised per open file at release (bytes read and written), never one
// record per read(2) or write(2). A queued sink (an audit.Log with
// Options.Queue, as loomfs mount and the sandbox's projections open it)
// fails once a write of queued records has failed: the changes whose
// records were queued by then have gone ahead, and it refuses from the
// next one.
//
// # Change journal
//
// Every change is also noted, after it is made, in the scope's change
// journal (store.Workspace.NoteChange), so a snapshot can look only at
// what changed. A renamed directory is noted with everything beneath it.
// An open for writing is noted when it is made and again at its release
// (store.Workspace.NoteOpen, NoteClose), and a snapshot looks at its file
// each time until the release: RELEASE comes after close(2) has returned,
// and nothing is sent at close(2) itself (FOPEN_NOFLUSH: a FLUSH would be
// one more round trip per file; only files that have held POSIX locks are
// sent one, see Locks). The open's line and the release's wait up to 10
// ms to go out with the next line (tar -x: an append for several files,
// not two for each; a snapshot reads the journals only once they are
// written, store.AwaitJournalLines). A change is
// refused (EIO, volume_unavailable) when the journal can't be opened to
// take its line.
// Each line also says what the change was and that this projection made
// it for its command's call id (store.Change, source projection), for the
// change feed; the health probe's file is noted as loomfs's own.
//
// # Locks
//
// Locks taken in the mount are taken on the backing file, so two mounts of
// one scope, processes on other nodes and any process locking the backing
// file exclude each other. flock locks are taken on the handle's own fd.
// fcntl record locks (F_SETLK, F_SETLKW, F_GETLK, lockf) have POSIX
// semantics: they belong to the kernel's lock owner (one per process, its
// file table), not to the open. For each owner holding locks on a file the
// mount opens a description of its own on the backing file (through
// /proc/self/fd, never by path) and takes the owner's locks there as open
// file description locks; it is closed when the owner holds no lock on the
// file any more. So a second fd of the same process takes a range the
// first holds, a forked child conflicts with its parent, and F_GETLK
// reports another owner's lock, not the caller's own. The pid F_GETLK
// reports is the holder's when the lock was taken through this mount, and
// 0 when it is held elsewhere as an open file description lock (another
// mount, another node, the tool door), which belongs to no process; the
// deadlock detection of POSIX locks (EDEADLK) is not available.
//
// Closing any fd of the owner releases its locks on the file: the kernel
// sends FLUSH with the lock owner at each close(2), but only for files
// opened without FOPEN_NOFLUSH, and a file is opened that way until it is
// first locked in the mount, so the close of a file never locked costs no
// round trip. A file opened before the first lock was taken on it is
// closed without FLUSH; the locks taken through it are released when the
// kernel releases it (after the last close of its description, shortly
// after close(2) returned), and closing it releases nothing taken through
// other fds. An unmount releases every lock held through the mount.
//
// # I/O limits
//
// The policy's io_bytes_per_s and io_ops_per_s hold the scope to a rate,
// shared with the tool door of the same process (package throttle): reads
// and writes wait for their bytes, every other request for its operation,
// so a program over the limit is slowed down, never failed. Every other
// process serving the scope, on any node, takes its share of the same
// limits (throttle.Limiter.Share). An open file that had to wait gets one
// "throttle" record at its release. statfs has
// no field for a rate; the workspace README states the limits.
//
// # Passthrough
//
// With Options.Passthrough (Linux 6.9 or later, CAP_SYS_ADMIN; off by
// default) the kernel reads files opened read-only straight from the
// backing file. Every open of such a file shares that backing file (a
// kernel rule), but files opened for writing are answered FOPEN_DIRECT_IO,
// which takes precedence for read(2) and write(2): every write still comes
// to the size, quota and audit checks here. Two things then bypass the
// daemon and are missing from the release record: bytes read through
// passthrough, and stores into a shared writable mapping of a file opened
// read-write, which can change bytes in place but never the size (truncate,
// fallocate and writes past the end all come here).
package fusefs
