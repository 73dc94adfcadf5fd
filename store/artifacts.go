package store

import (
	"context"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
)

// Artifacts: what a run made, for the user who started it (SPEC §2.1). The
// listing shows the session's main workspace as it is now (shared by all
// the session's runs; not a snapshot) and each child instance of the run
// under subagents/<instance>/<path>. That name is only a view: no child
// directory is ever placed in the main workspace.

// MaxArtifactBytes caps one artifact download.
const MaxArtifactBytes = 2 << 20

// MaxArtifacts bounds one listing; a longer one is flagged truncated.
const MaxArtifacts = 10000

// Artifact is one object of a run's listing. Objects that can't be
// downloaded (symlinks, hard-linked or special files, files over the cap)
// are listed for what they are, with the code a download would get.
type Artifact struct {
	Path    string      `json:"path"`
	Type    string      `json:"type"`
	Size    int64       `json:"size"`
	ModTime time.Time   `json:"mtime"`
	Refused policy.Code `json:"refused,omitempty"`
}

// ArtifactList is a run's listing, sorted by path.
type ArtifactList struct {
	Run       string     `json:"run"`
	Artifacts []Artifact `json:"artifacts"`
	Truncated bool       `json:"truncated"`
}

// authorize lets only the run's initiating user at its artifacts, and
// checks the volume again.
func (r *Run) authorize(user string) error {
	owner := ""
	if r.binding != nil {
		owner = r.binding.User
	}
	if err := CheckArtifactUser(r.id, owner, user); err != nil {
		return err
	}
	return r.vol.recheck()
}

// CheckArtifactUser is the rule of every door to a run's artifacts, here
// and in a published copy (package artifact): only owner, the user who
// started run, is served; an empty owner is a legacy run, never served.
func CheckArtifactUser(run, owner, user string) error {
	if owner == "" {
		return policy.Errorf(policy.PermissionDenied, "run %s is a legacy run: its initiating user was never recorded, so its artifacts are not served", run)
	}
	if user == "" || user != owner {
		// The owner's name is not told to someone else.
		return policy.Errorf(policy.PermissionDenied, "the artifacts of run %s are served only to the user who started it", run)
	}
	return nil
}

// Artifacts lists the run's files for user. pol (nil: the open layout)
// decides what is hidden; nothing is created.
func (r *Run) Artifacts(ctx context.Context, user string, pol *policy.Policy) (*ArtifactList, error) {
	if err := r.authorize(user); err != nil {
		return nil, err
	}
	list := &ArtifactList{Run: r.id, Artifacts: []Artifact{}}
	add := func(ws *Workspace, prefix string) error {
		defer ws.Close()
		return ws.Walk(ctx, ".", func(rel string, info Info) error {
			if prefix == "" && rel == policy.SubagentsDir {
				// Not creatable through loomfs; one planted in the main
				// workspace would shadow the children's view.
				return SkipDir
			}
			if info.Kind == policy.KindDir {
				return nil
			}
			if len(list.Artifacts) == MaxArtifacts {
				list.Truncated = true
				return io.ErrShortBuffer
			}
			a := Artifact{Path: prefix + rel, Type: info.Kind.String(), Size: info.Size, ModTime: info.ModTime.UTC()}
			if err := policy.CheckObject(policy.OpRead, rel, info.Object()); err != nil {
				a.Refused = policy.CodeOf(err)
			} else if info.Size > MaxArtifactBytes {
				a.Refused = policy.TooLarge
			}
			list.Artifacts = append(list.Artifacts, a)
			return nil
		})
	}
	done := func(err error) bool { return err == io.ErrShortBuffer }
	main, err := r.vol.openExisting(r.binding.MainScope(), pol)
	if err != nil && policy.CodeOf(err) != policy.NotFound {
		return nil, err
	}
	if main != nil {
		if err := add(main, ""); err != nil && !done(err) {
			return nil, err
		}
	}
	instances, err := r.instances()
	if err != nil {
		return nil, err
	}
	for _, inst := range instances {
		if list.Truncated {
			break
		}
		ws, err := r.vol.openExisting(r.binding.InstanceScope(inst), pol)
		if err != nil {
			continue // removed or replaced meanwhile
		}
		if err := add(ws, policy.SubagentsDir+"/"+inst+"/"); err != nil && !done(err) {
			return nil, err
		}
	}
	sort.Slice(list.Artifacts, func(i, j int) bool { return list.Artifacts[i].Path < list.Artifacts[j].Path })
	return list, nil
}

// instances lists the run's child instances: the directories under
// runs/<run>/children whose names are valid ids. Anything else there
// (a symlink, a file) is no instance of the run.
func (r *Run) instances() ([]string, error) {
	rel := r.binding.MainScope().Dir()
	rel = strings.TrimSuffix(rel, "/main") + "/runs/" + r.id + "/children"
	fd, err := openBeneath(int(r.vol.root.Fd()), rel, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err == unix.ENOENT {
		return nil, nil
	}
	if err != nil {
		return nil, policy.FromErrno(err, "list instances of run", r.id)
	}
	dir := os.NewFile(uintptr(fd), rel)
	defer dir.Close()
	names, err := dir.Readdirnames(-1)
	if err != nil {
		return nil, policy.FromErrno(err, "list instances of run", r.id)
	}
	sort.Strings(names)
	var out []string
	for _, n := range names {
		var st unix.Stat_t
		if ValidateID("instance", n) != nil || unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW) != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		out = append(out, n)
	}
	return out, nil
}

// ArtifactFile is one artifact opened for download. It reads from the file
// descriptor that was opened and checked (never reopening the path), and
// fails with too_large rather than pass the cap if the file grows.
type ArtifactFile struct {
	Artifact
	f    *os.File
	read int64
}

// Read reads the artifact's bytes.
func (a *ArtifactFile) Read(p []byte) (int, error) {
	if left := MaxArtifactBytes + 1 - a.read; int64(len(p)) > left {
		p = p[:left]
	}
	n, err := a.f.Read(p)
	a.read += int64(n)
	if a.read > MaxArtifactBytes {
		return 0, policy.Errorf(policy.TooLarge, "%s grew past the download limit of %s while being read", a.Path, policy.Bytes(MaxArtifactBytes))
	}
	return n, err
}

// Close releases the file.
func (a *ArtifactFile) Close() error { return a.f.Close() }

// OpenArtifact opens the artifact at path (as the listing names it) for
// user. The object is checked before and after the open (no symlink, hard
// link or special file; not over MaxArtifactBytes); the caller reads the
// returned file, which is that same descriptor.
func (r *Run) OpenArtifact(ctx context.Context, user, path string, pol *policy.Policy) (*ArtifactFile, error) {
	if err := r.authorize(user); err != nil {
		return nil, err
	}
	rel, err := policy.CleanPath(path, false)
	if err != nil {
		return nil, err
	}
	if rel == "." {
		return nil, policy.Errorf(policy.IsDir, "name one file of the listing (loomfs artifacts list)")
	}
	sc := r.binding.MainScope()
	inner := rel
	if first, rest, _ := strings.Cut(rel, "/"); first == policy.SubagentsDir {
		inst, file, ok := strings.Cut(rest, "/")
		if rest == "" || !ok {
			return nil, policy.Errorf(policy.IsDir, "%s is a directory of the listing; name a file: %s/<instance>/<path>", rel, policy.SubagentsDir)
		}
		if ValidateID("instance", inst) != nil {
			return nil, policy.Errorf(policy.NotFound, "%s: no such artifact", rel)
		}
		sc, inner = r.binding.InstanceScope(inst), file
	}
	ws, err := r.vol.openExisting(sc, pol)
	if err != nil {
		if policy.CodeOf(err) == policy.NotFound {
			return nil, policy.Errorf(policy.NotFound, "%s: no such artifact", rel)
		}
		return nil, err
	}
	defer ws.Close()
	if ws.pol.ModeOf(inner) == policy.ModeHidden {
		return nil, policy.Errorf(policy.NotFound, "%s: no such artifact", rel)
	}
	f, info, err := ws.Open(policy.OpRead, inner, unix.O_RDONLY)
	if err != nil {
		return nil, err
	}
	if info.Kind == policy.KindDir {
		f.Close()
		return nil, policy.Errorf(policy.IsDir, "%s is a directory; name a file of the listing", rel)
	}
	if info.Size > MaxArtifactBytes {
		f.Close()
		return nil, policy.Errorf(policy.TooLarge, "%s is %d bytes; the download limit is %d bytes (%s)", rel, info.Size, MaxArtifactBytes, policy.Bytes(MaxArtifactBytes))
	}
	if err := ctx.Err(); err != nil {
		f.Close()
		return nil, policy.Errorf(policy.Cancelled, "download of %s cancelled", rel)
	}
	a := Artifact{Path: rel, Type: info.Kind.String(), Size: info.Size, ModTime: info.ModTime.UTC()}
	return &ArtifactFile{Artifact: a, f: f}, nil
}

// openExisting opens scope s for reading without creating anything: no
// scope directory, no state directory. The workspace it returns can list
// and open; it must not be locked or written.
func (v *Volume) openExisting(s Scope, pol *policy.Policy) (*Workspace, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	if err := v.recheck(); err != nil {
		return nil, err
	}
	if pol == nil {
		pol = policy.Default()
	}
	fd, err := openBeneath(int(v.root.Fd()), s.Dir(), unix.O_PATH|unix.O_DIRECTORY, 0)
	if err == unix.ENOTDIR {
		// O_DIRECTORY|O_NOFOLLOW answers a symlink with ENOTDIR: say
		// what it is.
		dir, name := policy.Split(s.Dir())
		if pfd, perr := openBeneath(int(v.root.Fd()), dir, unix.O_PATH|unix.O_DIRECTORY, 0); perr == nil {
			var st unix.Stat_t
			if unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
				err = unix.ELOOP
			}
			unix.Close(pfd)
		}
	}
	if err != nil {
		return nil, policy.FromErrno(err, "open scope", s.String())
	}
	st, mnt, err := lstatAt(fd, "")
	if err != nil {
		unix.Close(fd)
		return nil, policy.FromErrno(err, "open scope", s.String())
	}
	return &Workspace{vol: v, scope: s, pol: pol.WithScope(s.Main()), dir: os.NewFile(uintptr(fd), s.Dir()), dev: st.Dev, mnt: mnt}, nil
}
