package snapshot

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
)

// A snapshot copied off the volume (package artifact archives one in an
// object store) comes back through HasBlob, AddBlob and Import: its
// contents first, then the snapshot, so that Restore rebuilds the scope
// from it as from one taken here.

// ErrBadEntry is wrapped by every refusal of what a copy brings back: a
// content that isn't what its name says, or an entry a snapshot could not
// have recorded.
var ErrBadEntry = errors.New("not as recorded")

// HasBlob reports whether the content named by sha256 is stored.
func (r *Repo) HasBlob(sha string) bool {
	var st unix.Stat_t
	return len(sha) == 64 && isHex(sha) && unix.Fstatat(int(r.blobs.Fd()), blobPath(sha), &st, unix.AT_SYMLINK_NOFOLLOW) == nil
}

// AddBlob stores src as the content named sha, which it must be (size
// bytes with that sha256); what is read otherwise is refused, naming what,
// and stored under no name it lacks. The blob is not fsynced: Import syncs
// them all before the snapshot that names them.
func (r *Repo) AddBlob(what, sha string, size int64, src io.Reader) error {
	got, n, _, err := r.storeBlob(io.LimitReader(src, size+1), false)
	if err != nil {
		return fmt.Errorf("store the content of %s: %w", what, err)
	}
	if got != sha || n != size {
		return fmt.Errorf("%w: the content of %s has %d bytes with sha256 %.12s…, want %d with %.12s…", ErrBadEntry, what, n, got, size, sha)
	}
	return nil
}

// Import records snapshot m with entries (every entry, not a change set)
// under m's id, once every content it names is stored: a cut import leaves
// contents and no snapshot. The entries are checked as Restore checks
// them, plus their order (walk order, every directory before what it
// holds). A snapshot of that id already there is kept and returned.
func (r *Repo) Import(m Manifest, entries []Entry) (*Manifest, error) {
	if err := checkID(m.ID); err != nil {
		return nil, err
	}
	if r.exists(m.ID) {
		return r.Get(m.ID)
	}
	dirs := map[string]bool{".": true}
	for i, e := range entries {
		if err := checkEntryPath(e.Path); err != nil {
			return nil, fmt.Errorf("%w: snapshot %s: %v", ErrBadEntry, m.ID, err)
		}
		if i > 0 && walkOrder(entries[i-1].Path, e.Path) >= 0 {
			return nil, fmt.Errorf("%w: snapshot %s: entries out of order at %s", ErrBadEntry, m.ID, e.Path)
		}
		if parent, _ := policy.Split(e.Path); !dirs[parent] {
			return nil, fmt.Errorf("%w: snapshot %s: %s comes before its directory", ErrBadEntry, m.ID, e.Path)
		}
		switch e.Type {
		case typeDir:
			dirs[e.Path] = true
		case typeLink:
			if e.Size < 1 || e.Size > policy.MaxLinkTarget {
				return nil, fmt.Errorf("%w: snapshot %s: the link %s has a target of %d bytes", ErrBadEntry, m.ID, e.Path, e.Size)
			}
			fallthrough
		case typeFile:
			if !r.HasBlob(e.SHA256) {
				return nil, fmt.Errorf("%w: snapshot %s: the content of %s (sha256 %.12s…) is missing", ErrBadEntry, m.ID, e.Path, e.SHA256)
			}
		default:
			return nil, fmt.Errorf("%w: snapshot %s: %s has unknown type %q", ErrBadEntry, m.ID, e.Path, e.Type)
		}
	}
	if err := unix.Syncfs(int(r.blobs.Fd())); err != nil {
		return nil, fmt.Errorf("snapshot %s: sync its contents: %w", m.ID, err)
	}
	m.Scope, m.ScopeHash = r.scope.String(), r.scope.Hash()
	m.Base, m.Depth = "", 0
	m.Hashed, m.NewBlobs, m.NewBytes = 0, 0, 0
	m.Walk, m.WalkReason = "import", ""
	entries = slices.Clone(entries)
	if err := r.writeSnapshot(&m, entries, nil, true); err != nil {
		return nil, err
	}
	return &m, nil
}

func isHex(s string) bool {
	return strings.Trim(s, "0123456789abcdef") == ""
}
