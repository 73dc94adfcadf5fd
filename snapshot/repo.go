package snapshot

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/newname"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// Names in a scope's snapshot directory.
const (
	blobsDir     = "blobs"
	manifestsDir = "snapshots"
	indexFile    = "index"
)

// Manifest describes one snapshot.
type Manifest struct {
	Version   int       `json:"version"`
	ID        string    `json:"id"`
	Scope     string    `json:"scope"`
	ScopeHash string    `json:"scope_hash"`
	Label     string    `json:"label,omitempty"`
	Run       string    `json:"run,omitempty"`
	Created   time.Time `json:"created"`
	Files     int       `json:"files"`
	Dirs      int       `json:"dirs"`
	Bytes     int64     `json:"bytes"`     // content of all its files
	Hashed    int       `json:"hashed"`    // files read, not found unchanged in the index
	NewBlobs  int       `json:"new_blobs"` // contents stored for the first time
	NewBytes  int64     `json:"new_bytes"` // bytes of those contents: what this snapshot wrote
	Skipped   []Skipped `json:"skipped,omitempty"`
	// Walk says how changes were found: "journal" (the paths loomfs
	// recorded changing since the last snapshot) or "full" (a walk of
	// the whole scope), and WalkReason why a walk was needed.
	Walk       string `json:"walk"`
	WalkReason string `json:"walk_reason,omitempty"`
	// Base is the snapshot this one amends, Depth how many such steps
	// lead to a snapshot recorded in full (see Entries).
	Base     string  `json:"base,omitempty"`
	Depth    int     `json:"depth,omitempty"`
	Duration float64 `json:"duration_s"`
}

// Skipped is an object a snapshot did not keep, and why (its error code).
type Skipped struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

// Entry is one file or directory of a snapshot.
type Entry struct {
	Path   string `json:"path"`
	Type   string `json:"type"` // "file", "dir" or "symlink"
	Size   int64  `json:"size,omitempty"`
	Perm   uint32 `json:"perm"`
	MTime  int64  `json:"mtime_ns"`
	SHA256 string `json:"sha256,omitempty"`
}

const (
	typeFile = "file"
	typeDir  = "dir"
	// typeLink is an emulated symbolic link (store/link.go): its blob is
	// the target, and it is restored as a link, never as a symlink.
	typeLink = "symlink"
)

// hasContent reports whether e has a blob: a file's content or a link's
// target.
func (e Entry) hasContent() bool { return e.Type == typeFile || e.Type == typeLink }

const manifestVersion = 1

// Repo is the snapshot directory of one scope.
type Repo struct {
	scope store.Scope
	dir   *os.File // .agentloom-snapshots/<scope-hash>
	blobs *os.File
	mans  *os.File
}

// OpenRepo opens scope s's snapshot directory; with create it is made if
// missing, else a scope without snapshots answers not_found.
func OpenRepo(vol *store.Volume, s store.Scope, create bool) (*Repo, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return openRepoHash(vol, s, s.Hash(), create)
}

func openRepoHash(vol *store.Volume, s store.Scope, hash string, create bool) (*Repo, error) {
	dir, err := vol.Area(store.SnapshotsDir+"/"+hash, create)
	if err != nil {
		if policy.CodeOf(err) == policy.NotFound {
			return nil, policy.Errorf(policy.NotFound, "scope %s has no snapshots", s)
		}
		return nil, err
	}
	r := &Repo{scope: s, dir: dir}
	if r.blobs, err = subdir(dir, blobsDir, create); err == nil {
		r.mans, err = subdir(dir, manifestsDir, create)
	}
	if err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

func subdir(dir *os.File, name string, create bool) (*os.File, error) {
	if create {
		if err := unix.Mkdirat(int(dir.Fd()), name, policy.DirPerm); err != nil && err != unix.EEXIST {
			return nil, fmt.Errorf("create %s: %w", name, err)
		}
	}
	fd, err := unix.Openat(int(dir.Fd()), name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, policy.FromErrno(err, "open snapshot directory", name)
	}
	return os.NewFile(uintptr(fd), name), nil
}

// Close releases the directory fds.
func (r *Repo) Close() error {
	for _, f := range []*os.File{r.mans, r.blobs, r.dir} {
		if f != nil {
			f.Close()
		}
	}
	return nil
}

// List returns the manifests of every snapshot, oldest first.
func (r *Repo) List() ([]Manifest, error) {
	names, err := readNames(r.mans)
	if err != nil {
		return nil, err
	}
	var out []Manifest
	for _, n := range names {
		if !strings.HasSuffix(n, ".json") || strings.HasPrefix(n, tmpPrefix) {
			continue
		}
		m, err := r.Get(strings.TrimSuffix(n, ".json"))
		if err != nil {
			return nil, err
		}
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// A snapshot is one JSON file, snapshots/ID.json:
//
//	{"manifest": {...},
//	"files": [
//	{"path": ..., "type": ..., "size": ..., "perm": ..., "mtime_ns": ..., "sha256": ...},
//	...
//	],
//	"removed": [path, ...]}
//
// The manifest comes first so that listing reads only the start of each.
// A snapshot recorded in full lists every entry in files. One taken from
// the change journals names its base snapshot and lists only what
// changed: the paths removed (each with everything beneath it) and the
// entries added or changed, so it costs what changed.

// Get returns the manifest of snapshot id.
func (r *Repo) Get(id string) (*Manifest, error) {
	var m Manifest
	err := r.read(id, func(dec *json.Decoder) error {
		if err := expectKey(dec, "manifest"); err != nil {
			return err
		}
		return dec.Decode(&m)
	})
	if err != nil {
		return nil, err
	}
	return &m, nil
}

// snapshotDoc is a snapshot file as stored.
type snapshotDoc struct {
	Manifest Manifest `json:"manifest"`
	Files    []Entry  `json:"files"`
	Removed  []string `json:"removed"`
}

func (r *Repo) doc(id string) (*snapshotDoc, error) {
	var doc snapshotDoc
	if err := r.read(id, func(dec *json.Decoder) error { return dec.Decode(&doc) }); err != nil {
		return nil, err
	}
	return &doc, nil
}

// Entries returns the files and directories of snapshot id, in walk order
// (every directory before what it holds), its base's applied.
func (r *Repo) Entries(id string) ([]Entry, error) {
	var chain []*snapshotDoc
	for next := id; next != ""; {
		if len(chain) > maxDepth*4 {
			return nil, fmt.Errorf("snapshot %s stands on more than %d others; its chain is damaged", id, maxDepth*4)
		}
		doc, err := r.doc(next)
		if err != nil {
			if len(chain) > 0 && policy.CodeOf(err) == policy.NotFound {
				return nil, fmt.Errorf("snapshot %s is damaged: its base %s is missing", id, next)
			}
			return nil, err
		}
		chain = append(chain, doc)
		next = doc.Manifest.Base
	}
	entries := chain[len(chain)-1].Files
	for i := len(chain) - 2; i >= 0; i-- {
		entries = applyDelta(entries, chain[i].Removed, chain[i].Files, func(e Entry) string { return e.Path })
	}
	return entries, nil
}

// exists reports whether snapshot id is there.
func (r *Repo) exists(id string) bool {
	var st unix.Stat_t
	return checkID(id) == nil && unix.Fstatat(int(r.mans.Fd()), id+".json", &st, unix.AT_SYMLINK_NOFOLLOW) == nil
}

func (r *Repo) read(id string, decode func(*json.Decoder) error) error {
	if err := checkID(id); err != nil {
		return err
	}
	fd, err := unix.Openat(int(r.mans.Fd()), id+".json", unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err == unix.ENOENT {
		return policy.Errorf(policy.NotFound, "scope %s has no snapshot %q (see loomfs snapshot list)", r.scope, id)
	}
	if err != nil {
		return fmt.Errorf("read snapshot %s: %w", id, err)
	}
	f := os.NewFile(uintptr(fd), id)
	defer f.Close()
	if err := decode(json.NewDecoder(bufio.NewReaderSize(f, 1<<16))); err != nil {
		return fmt.Errorf("read snapshot %s: %w", id, err)
	}
	return nil
}

// expectKey reads the opening of an object and its first key.
func expectKey(dec *json.Decoder, key string) error {
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return fmt.Errorf("not a snapshot manifest")
	}
	if t, err := dec.Token(); err != nil || t != key {
		return fmt.Errorf("not a snapshot manifest (first key %v)", t)
	}
	return nil
}

// writeSnapshot writes manifest m, its entries (or, with a base, those
// added or changed) and the paths removed from its base as one file,
// fsynced; isNew for a snapshot just taken, not one rewritten.
func (r *Repo) writeSnapshot(m *Manifest, entries []Entry, removed []string, isNew bool) error {
	return writeAtomic(r.mans, m.ID+".json", isNew, true, func(w *bufio.Writer) error {
		b, err := json.Marshal(m)
		if err != nil {
			return err
		}
		w.WriteString(`{"manifest": `)
		w.Write(b)
		w.WriteString(",\n\"files\": ")
		if err := writeEntries(w, entries); err != nil {
			return err
		}
		if m.Base != "" {
			if b, err = json.Marshal(removed); err != nil {
				return err
			}
			if removed == nil {
				b = []byte("[]")
			}
			w.WriteString(",\n\"removed\": ")
			w.Write(b)
		}
		_, err = w.WriteString("}\n")
		return err
	})
}

// Delete removes snapshot id's manifest. Its blobs stay until Sweep. A
// snapshot that amends it is first rewritten in full.
func (r *Repo) Delete(id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	ms, err := r.List()
	if err != nil {
		return err
	}
	for _, m := range ms {
		if m.Base != id {
			continue
		}
		entries, err := r.Entries(m.ID)
		if err != nil {
			return fmt.Errorf("delete snapshot %s: rewrite %s, which amends it: %w", id, m.ID, err)
		}
		m.Base, m.Depth = "", 0
		if err := r.writeSnapshot(&m, entries, nil, false); err != nil {
			return fmt.Errorf("delete snapshot %s: rewrite %s, which amends it: %w", id, m.ID, err)
		}
	}
	if err := unix.Unlinkat(int(r.mans.Fd()), id+".json", 0); err != nil {
		return policy.FromErrno(err, "delete snapshot", id)
	}
	unix.Fsync(int(r.mans.Fd()))
	return nil
}

// Sweep removes the blobs no remaining snapshot refers to, and returns
// how many and their bytes. The caller holds the scope lock, so no
// snapshot is being made meanwhile.
func (r *Repo) Sweep(ctx context.Context) (blobs int, bytes int64, err error) {
	ms, err := r.List()
	if err != nil {
		return 0, 0, err
	}
	// Create trusts the index without looking for each blob: what it
	// names stays, unless no snapshot is left to build on.
	live := map[string]bool{}
	if len(ms) == 0 {
		unix.Unlinkat(int(r.dir.Fd()), indexFile, 0)
	} else {
		for _, e := range r.loadState().all() {
			if e.kind == kindFile || e.kind == kindRacy {
				live[e.sha] = true
			}
		}
	}
	// Every entry of a snapshot is listed in its own file or in one of
	// its bases', which are kept with it.
	for _, m := range ms {
		doc, err := r.doc(m.ID)
		if err != nil {
			return 0, 0, err
		}
		es := doc.Files
		for _, e := range es {
			if e.SHA256 != "" {
				live[e.SHA256] = true
			}
		}
	}
	fans, err := readNames(r.blobs)
	if err != nil {
		return 0, 0, err
	}
	for _, fan := range fans {
		if ctx.Err() != nil {
			return blobs, bytes, policy.Errorf(policy.Cancelled, "sweep cancelled")
		}
		fd, err := unix.Openat(int(r.blobs.Fd()), fan, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			// A leftover temporary blob of a snapshot that died.
			if strings.HasPrefix(fan, tmpPrefix) {
				unix.Unlinkat(int(r.blobs.Fd()), fan, 0)
			}
			continue
		}
		d := os.NewFile(uintptr(fd), fan)
		names, err := readNames(d)
		if err != nil {
			d.Close()
			return blobs, bytes, err
		}
		left := len(names)
		for _, n := range names {
			if live[n] {
				continue
			}
			var st unix.Stat_t
			if unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && unix.Unlinkat(fd, n, 0) == nil {
				blobs++
				bytes += st.Size
				left--
			}
		}
		d.Close()
		if left == 0 {
			unix.Unlinkat(int(r.blobs.Fd()), fan, unix.AT_REMOVEDIR)
		}
	}
	return blobs, bytes, nil
}

// checkID refuses anything but an id this package made.
func checkID(id string) error {
	if id == "" || len(id) > 64 || strings.ContainsAny(id, "/\\") || strings.HasPrefix(id, ".") {
		return policy.Errorf(policy.InvalidInput, "%q is not a snapshot id (see loomfs snapshot list)", strings.ToValidUTF8(id, "?"))
	}
	for _, c := range id {
		if !(c >= '0' && c <= '9' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c == '-' || c == '.') {
			return policy.Errorf(policy.InvalidInput, "%q is not a snapshot id (see loomfs snapshot list)", strings.ToValidUTF8(id, "?"))
		}
	}
	return nil
}

// newID names a snapshot by its time, so ids sort in time order, plus a
// random suffix.
func newID(t time.Time) string {
	var b [3]byte
	rand.Read(b[:])
	return t.UTC().Format("20060102T150405.000Z") + "-" + hex.EncodeToString(b[:])
}

const tmpPrefix = ".tmp-"

func tmpName() string {
	var b [8]byte
	rand.Read(b[:])
	return tmpPrefix + hex.EncodeToString(b[:])
}

func readNames(d *os.File) ([]string, error) {
	fd, err := unix.Openat(int(d.Fd()), ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), d.Name())
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil && err != io.EOF {
		return nil, fmt.Errorf("read %s: %w", d.Name(), err)
	}
	sort.Strings(names)
	return names, nil
}

// writeAtomic writes name in dir through a temporary file and rename, so
// a reader finds the old content or the new; with sync the file is
// fsynced before the rename. A name that must be new (a manifest) is
// placed instead (package newname): it refuses an existing name, and
// another CephFS client finds it at once, not five seconds after a rename.
func writeAtomic(dir *os.File, name string, isNew, sync bool, write func(w *bufio.Writer) error) error {
	tmp := tmpName()
	fd, err := unix.Openat(int(dir.Fd()), tmp, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, policy.FilePerm)
	if err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), tmp)
	bw := bufio.NewWriterSize(f, 1<<16)
	err = write(bw)
	if err == nil {
		err = bw.Flush()
	}
	if err == nil && sync {
		err = f.Sync()
	}
	f.Close()
	switch {
	case err != nil:
	case isNew:
		err = newname.Place(int(dir.Fd()), tmp, name)
	default:
		err = unix.Renameat(int(dir.Fd()), tmp, int(dir.Fd()), name)
	}
	if err != nil {
		unix.Unlinkat(int(dir.Fd()), tmp, 0)
		return fmt.Errorf("write %s: %w", name, err)
	}
	return nil
}

// OpenRepoHash opens the snapshot directory named by a scope hash and tells
// the scope it belongs to, read from its manifests (and checked against
// the hash). ok is false when no manifest names it.
func OpenRepoHash(vol *store.Volume, hash string) (r *Repo, sc store.Scope, ok bool, err error) {
	r, err = openRepoHash(vol, store.Scope{}, hash, false)
	if err != nil {
		return nil, sc, false, err
	}
	names, err := readNames(r.mans)
	if err != nil {
		r.Close()
		return nil, sc, false, err
	}
	for _, n := range names {
		if !strings.HasSuffix(n, ".json") || strings.HasPrefix(n, tmpPrefix) {
			continue
		}
		m, err := r.Get(strings.TrimSuffix(n, ".json"))
		if err != nil {
			continue
		}
		if s, err := store.ParseScope(m.Scope); err == nil && s.Hash() == hash {
			r.scope = s
			return r, s, true, nil
		}
	}
	return r, sc, false, nil
}
