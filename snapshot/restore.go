package snapshot

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strings"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// RestoreOptions say how a restore is made.
type RestoreOptions struct {
	// Locked says the caller already holds the scope lock; otherwise
	// Restore takes it, waiting as long as ctx allows.
	Locked bool
}

// Restore replaces the whole content of the scope with snapshot id, as one
// atomic change: the tree is built beside the scope directory and swapped
// in (store.ReplaceTree), so a tool or a projection sees the old tree or
// the restored one, never a mix. Every content is checked against its
// sha256 on the way. It refuses while a command runs in the scope or the
// scope is quarantined, and holds the scope lock throughout.
//
// ws follows the restore. Another process that pinned the scope directory
// (a "loomfs mount" elsewhere) keeps the old, removed tree and must be
// remounted; see store.Workspace.ReplaceTree.
func Restore(ctx context.Context, ws *store.Workspace, id string, opt RestoreOptions) (*Manifest, error) {
	// Refuse at once rather than wait for a running command's lock.
	if err := ws.CheckIdle(); err != nil {
		return nil, err
	}
	if !opt.Locked {
		unlock, err := ws.Lock(ctx)
		if err != nil {
			return nil, err
		}
		defer unlock()
	}
	repo, err := OpenRepo(ws.Volume(), ws.Scope(), false)
	if err != nil {
		return nil, err
	}
	defer repo.Close()
	m, err := repo.Get(id)
	if err != nil {
		return nil, err
	}
	entries, err := repo.Entries(id)
	if err != nil {
		return nil, err
	}
	// Check everything before touching the scope.
	for _, e := range entries {
		if err := checkEntryPath(e.Path); err != nil {
			return nil, fmt.Errorf("snapshot %s is damaged: %w", id, err)
		}
		if e.Type == typeLink && (e.Size < 1 || e.Size > policy.MaxLinkTarget) {
			return nil, fmt.Errorf("snapshot %s is damaged: the link %s has a target of %d bytes; nothing was changed", id, e.Path, e.Size)
		}
		if e.hasContent() {
			var st unix.Stat_t
			if len(e.SHA256) != 64 || unix.Fstatat(int(repo.blobs.Fd()), blobPath(e.SHA256), &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
				return nil, fmt.Errorf("snapshot %s is damaged: the content of %s (sha256 %.12s…) is missing; nothing was changed", id, e.Path, e.SHA256)
			}
		}
	}
	var files []named
	err = ws.ReplaceTree(ctx, func(dir *os.File) error {
		return repo.fill(ctx, dir, entries, &files)
	})
	if err != nil {
		return nil, err
	}
	// The files just written are known: the next snapshot, a walk (the
	// index has no base), need not read them again (those changed in the
	// probe's clock tick excepted).
	if now, err := repo.fsNow(); err == nil {
		for i := range files {
			if files[i].ctime >= now {
				files[i].kind = kindRacy
			}
		}
		repo.saveState(files, commit{})
	}
	return m, nil
}

// checkEntryPath refuses a path a snapshot could not have recorded: it
// must be relative, with no empty, "." or ".." component and no loomfs
// name.
func checkEntryPath(p string) error {
	if p == "" || !utf8.ValidString(p) {
		return fmt.Errorf("invalid path %q", strings.ToValidUTF8(p, "?"))
	}
	for _, c := range strings.Split(p, "/") {
		if c == "" || c == "." || c == ".." || !policy.Visible(c) || strings.IndexByte(c, 0) >= 0 {
			return fmt.Errorf("invalid path %q", p)
		}
	}
	return nil
}

type openDir struct {
	rel string
	fd  int
}

// fill builds entries in dir. Entries come in walk order, every directory
// before its contents, so the directories open at any time are one chain.
func (r *Repo) fill(ctx context.Context, dir *os.File, entries []Entry, files *[]named) error {
	stack := []openDir{{".", int(dir.Fd())}}
	defer func() {
		for _, d := range stack[1:] {
			unix.Close(d.fd)
		}
	}()
	for _, e := range entries {
		if ctx.Err() != nil {
			return policy.Errorf(policy.Cancelled, "restore cancelled before the swap; the scope is unchanged")
		}
		parent, name := policy.Split(e.Path)
		for len(stack) > 1 && stack[len(stack)-1].rel != parent {
			unix.Close(stack[len(stack)-1].fd)
			stack = stack[:len(stack)-1]
		}
		top := stack[len(stack)-1]
		if top.rel != parent {
			return fmt.Errorf("snapshot entries out of order at %s", e.Path)
		}
		switch e.Type {
		case typeDir:
			if err := unix.Mkdirat(top.fd, name, policy.DirPerm); err != nil {
				return fmt.Errorf("restore %s: %w", e.Path, err)
			}
			fd, err := unix.Openat(top.fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("restore %s: %w", e.Path, err)
			}
			unix.Fchmod(fd, policy.DirPerm)
			stack = append(stack, openDir{e.Path, fd})
		case typeFile, typeLink:
			st, err := r.restoreFile(top.fd, name, e)
			if err != nil {
				return err
			}
			*files = append(*files, named{e.Path, indexEntry{kind: kindFile, perm: st.Mode & 0o7777, size: st.Size, mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano(), ino: st.Ino, sha: e.SHA256}})
		default:
			return fmt.Errorf("snapshot entry %s has unknown type %q", e.Path, e.Type)
		}
	}
	return nil
}

// restoreFile writes the blob of e as name in dirfd, checking its sha256,
// and gives it e's owner permission bits and modification time.
func (r *Repo) restoreFile(dirfd int, name string, e Entry) (unix.Stat_t, error) {
	var st unix.Stat_t
	bfd, err := unix.Openat(int(r.blobs.Fd()), blobPath(e.SHA256), unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return st, fmt.Errorf("restore %s: content missing: %w", e.Path, err)
	}
	src := os.NewFile(uintptr(bfd), e.SHA256)
	defer src.Close()
	fd, err := unix.Openat(dirfd, name, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, policy.FilePerm)
	if err != nil {
		return st, fmt.Errorf("restore %s: %w", e.Path, err)
	}
	dst := os.NewFile(uintptr(fd), name)
	defer dst.Close()
	h := sha256.New()
	buf := bufPool.Get().(*[]byte)
	n, err := io.CopyBuffer(io.MultiWriter(dst, h), src, *buf)
	bufPool.Put(buf)
	if err != nil {
		return st, fmt.Errorf("restore %s: %w", e.Path, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != e.SHA256 || n != e.Size {
		return st, fmt.Errorf("restore %s: stored content is damaged (sha256 %s, want %s); nothing was changed", e.Path, got, e.SHA256)
	}
	perm := e.Perm & 0o700
	if e.Type == typeLink {
		// The link's marker is what makes it a link again; only a
		// manifest loomfs wrote, under the volume root, can ask for it.
		perm = policy.LinkPerm
	}
	if err := unix.Fchmod(fd, perm); err != nil {
		return st, fmt.Errorf("restore %s: %w", e.Path, err)
	}
	ts := []unix.Timespec{unix.NsecToTimespec(e.MTime), unix.NsecToTimespec(e.MTime)}
	if err := unix.UtimesNanoAt(dirfd, name, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return st, fmt.Errorf("restore %s: %w", e.Path, err)
	}
	if err := unix.Fstat(fd, &st); err != nil {
		return st, fmt.Errorf("restore %s: %w", e.Path, err)
	}
	return st, nil
}
