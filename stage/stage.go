package stage

import (
	"archive/tar"
	"context"
	"io"
	"os"
	"path/filepath"
	"sort"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// Platform is the platform's door into one open scope.
type Platform struct {
	WS    *store.Workspace
	Audit audit.Sink // nil: audit.Discard
	// Actor is copied into every record: the scope's ids, and Operator,
	// the identity of whoever stages or collects (loomfs stage --actor).
	Actor audit.Actor
}

// Source is something to stage: a host file or directory (Path), or a
// tar stream (Tar).
type Source struct {
	name string
	path string
	tar  io.Reader
}

// Path stages the file at path as <into>/<its name>, or the contents of
// the directory at path into <into>. path itself may not be a symlink.
func Path(path string) Source { return Source{name: path, path: path} }

// Tar stages the entries of the tar stream r into <into>; name says where
// it came from in results ("-" for stdin). A symlink entry becomes an
// emulated link where the policy emulates them.
func Tar(name string, r io.Reader) Source { return Source{name: name, tar: r} }

// Staged is one object staged.
type Staged struct {
	Path    string `json:"path"`
	Type    string `json:"type"`
	Bytes   int64  `json:"bytes"`
	SHA256  string `json:"sha256,omitempty"`
	Created bool   `json:"created"`
}

// Refused is one object not staged or not collected, and why.
type Refused struct {
	Source  string      `json:"source"`         // where it was: source name and path inside
	Path    string      `json:"path,omitempty"` // where it would have gone, in the scope or the collection
	Code    policy.Code `json:"code"`
	Message string      `json:"message"`
}

// Result is what one Stage did. Refused is empty when everything was
// staged.
type Result struct {
	Into    string    `json:"into"`
	Staged  []Staged  `json:"staged"`
	Refused []Refused `json:"refused"`
	Bytes   int64     `json:"bytes"`
}

// Stage copies srcs into the subtree into (cleaned; "" or "." is the
// root) of the scope, holding the scope lock. Objects the rules refuse
// are listed in the result and the rest staged; the error is for what
// stops the whole stage (a bad into, a quarantined scope, the audit log,
// a corrupt tar stream), with the result of what was done before it.
func (p *Platform) Stage(ctx context.Context, into string, srcs ...Source) (*Result, error) {
	ws := p.WS
	if into == "" {
		into = "."
	}
	rel, err := policy.CleanPath(into, ws.Scope().Main())
	if err != nil {
		return nil, err
	}
	res := &Result{Into: rel, Staged: []Staged{}, Refused: []Refused{}}
	// Every change staging makes (directories and links as well as files)
	// is the platform's in the change journal and so in the change feed.
	ctx = store.WithChange(ctx, store.Change{Source: store.SourcePlatform})
	if err := ws.CheckQuarantine(); err != nil {
		return res, err
	}
	unlock, err := ws.Lock(ctx)
	if err != nil {
		return res, err
	}
	defer unlock()
	names := make([]string, len(srcs))
	for i, s := range srcs {
		names[i] = s.name
	}
	if err := p.record(ctx, audit.Event{Op: "stage", Path: rel, Result: "started", Detail: map[string]any{"sources": names}}); err != nil {
		return res, err
	}
	st := &stager{p: p, pf: ws.Platform(), res: res}
	start := time.Now()
	err = st.run(ctx, rel, srcs)
	ev := audit.Event{Op: "stage", Path: rel, Result: "ok", Bytes: res.Bytes, Duration: time.Since(start),
		Detail: map[string]any{"staged": len(res.Staged), "refused": len(res.Refused)}}
	if err != nil {
		ev.Result, ev.Code = "error", string(policy.AsError(err).Code)
	} else if len(res.Refused) > 0 {
		ev.Result = "refused"
	}
	if rerr := p.record(ctx, ev); err == nil {
		err = rerr
	}
	return res, err
}

type stager struct {
	p   *Platform
	pf  *store.Workspace // the platform view: no path modes
	res *Result
}

func (s *stager) run(ctx context.Context, into string, srcs []Source) error {
	if into != "." {
		if err := s.mkdir(ctx, into); err != nil {
			return err
		}
	}
	for _, src := range srcs {
		var err error
		if src.tar != nil {
			err = s.tarStream(ctx, src.name, src.tar, into)
		} else {
			err = s.path(ctx, src.name, into)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// fatal reports whether err must stop the whole stage rather than refuse
// one object.
func fatal(err error) bool {
	switch policy.CodeOf(err) {
	case policy.AuditUnavailable, policy.VolumeUnavailable, policy.NoSpace, policy.Quarantined, policy.Cancelled, policy.Internal:
		return true
	}
	return false
}

// refuse lists err for the object at source (going to dst) and audits it,
// or returns it when it must stop the stage.
func (s *stager) refuse(ctx context.Context, source, dst string, err error) error {
	if fatal(err) {
		return err
	}
	pe := policy.AsError(err)
	s.res.Refused = append(s.res.Refused, Refused{Source: source, Path: dst, Code: pe.Code, Message: pe.Message})
	return s.p.record(ctx, audit.Event{Op: "stage_object", Path: dst, Result: "refused", Code: string(pe.Code), Detail: map[string]any{"source": source, "message": pe.Message}})
}

// staged lists an object staged and audits it.
func (s *stager) staged(ctx context.Context, source string, o Staged) error {
	s.res.Staged = append(s.res.Staged, o)
	s.res.Bytes += o.Bytes
	return s.p.record(ctx, audit.Event{Op: "stage_object", Path: o.Path, Result: "ok", Bytes: o.Bytes, SHA256: o.SHA256, Detail: map[string]any{"source": source, "type": o.Type, "created": o.Created}})
}

// mkdir makes the directory rel and its missing parents.
func (s *stager) mkdir(ctx context.Context, rel string) error {
	if info, err := s.pf.Lstat(rel); err == nil && info.Kind == policy.KindDir && !info.OtherMount {
		return nil
	}
	_, err := s.pf.Mkdir(ctx, rel, true)
	return err
}

// path stages one host path: a directory's contents into into, a file as
// into/<name>.
func (s *stager) path(ctx context.Context, path, into string) error {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return s.refuse(ctx, path, "", policy.FromErrno(err, "open", path))
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return s.refuse(ctx, path, "", policy.FromErrno(err, "stat", path))
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		dfd, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return s.refuse(ctx, path, into, policy.FromErrno(err, "open", path))
		}
		return s.dir(ctx, dfd, st.Dev, path, into)
	}
	dir, name := filepath.Split(filepath.Clean(path))
	if dir == "" {
		dir = "."
	}
	pfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return s.refuse(ctx, path, "", policy.FromErrno(err, "open", dir))
	}
	defer unix.Close(pfd)
	return s.entry(ctx, pfd, st.Dev, path, name, policy.Join(into, name))
}

// dir stages the entries of the open host directory dfd (closed here)
// into the scope directory into, which exists.
func (s *stager) dir(ctx context.Context, dfd int, dev uint64, source, into string) error {
	f := os.NewFile(uintptr(dfd), source)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return s.refuse(ctx, source, into, policy.FromErrno(err, "list", source))
	}
	sort.Strings(names)
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return policy.Errorf(policy.Cancelled, "staging cancelled")
		}
		if err := s.entry(ctx, dfd, dev, source+"/"+name, name, policy.Join(into, name)); err != nil {
			return err
		}
	}
	return nil
}

// entry stages the object name of the host directory dfd, found on
// device dev, to dst.
func (s *stager) entry(ctx context.Context, dfd int, dev uint64, source, name, dst string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return s.refuse(ctx, source, dst, policy.FromErrno(err, "stat", source))
	}
	obj := sourceObject(&st, dev)
	if err := policy.CheckObject(policy.OpRead, source, obj); err != nil {
		return s.refuse(ctx, source, dst, err)
	}
	if obj.Kind == policy.KindDir {
		existed := s.exists(dst)
		if err := s.mkdir(ctx, dst); err != nil {
			return s.refuse(ctx, source, dst, err)
		}
		if !existed {
			if err := s.staged(ctx, source, Staged{Path: dst, Type: "dir", Created: true}); err != nil {
				return err
			}
		}
		sub, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return s.refuse(ctx, source, dst, policy.FromErrno(err, "open", source))
		}
		if err := sameObject(sub, &st, source); err != nil {
			unix.Close(sub)
			return s.refuse(ctx, source, dst, err)
		}
		return s.dir(ctx, sub, dev, source, dst)
	}
	// A regular file, opened without following and non-blocking (a FIFO
	// swapped in is caught by the check on the fd, never waited on).
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return s.refuse(ctx, source, dst, policy.FromErrno(err, "open", source))
	}
	f := os.NewFile(uintptr(fd), source)
	defer f.Close()
	if err := sameObject(fd, &st, source); err != nil {
		return s.refuse(ctx, source, dst, err)
	}
	return s.place(ctx, source, dst, f, st.Size, st.Mode&0o777)
}

// place stages one file's content.
func (s *stager) place(ctx context.Context, source, dst string, r io.Reader, size int64, perm uint32) error {
	res, err := s.pf.PlaceFile(ctx, dst, r, size, perm)
	if err != nil {
		return s.refuse(ctx, source, dst, err)
	}
	return s.staged(ctx, source, Staged{Path: dst, Type: "file", Bytes: res.Bytes, SHA256: res.SHA256, Created: res.Created})
}

func (s *stager) exists(rel string) bool {
	_, err := s.pf.Lstat(rel)
	return err == nil
}

// sourceObject describes a host object for policy.CheckObject. The
// sticky bit marks an emulated link only inside a scope: on the
// platform's side a sticky file is a file.
func sourceObject(st *unix.Stat_t, dev uint64) policy.Object {
	o := policy.ObjectOf(st)
	if o.Kind == policy.KindLink {
		o.Kind = policy.KindRegular
	}
	o.OtherMount = st.Dev != dev
	return o
}

// sameObject refuses an fd that is not the object stat described: one
// swapped in between the stat and the open.
func sameObject(fd int, want *unix.Stat_t, source string) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return policy.FromErrno(err, "stat", source)
	}
	if st.Ino != want.Ino || st.Dev != want.Dev || st.Mode&unix.S_IFMT != want.Mode&unix.S_IFMT {
		return policy.Errorf(policy.Conflict, "%s changed while it was being staged; stage it again", source)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFREG && st.Nlink > 1 {
		return policy.Errorf(policy.HardlinkRefused, "%s has %d hard links; files with more than one link are refused", source, st.Nlink)
	}
	return nil
}

// tarStream stages the entries of a tar stream into into.
func (s *stager) tarStream(ctx context.Context, name string, r io.Reader, into string) error {
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return policy.Errorf(policy.Cancelled, "staging cancelled")
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return policy.Errorf(policy.InvalidInput, "%s: not a valid tar stream: %v", name, err)
		}
		if err := s.tarEntry(ctx, name, tr, hdr, into); err != nil {
			return err
		}
	}
}

func (s *stager) tarEntry(ctx context.Context, name string, tr *tar.Reader, hdr *tar.Header, into string) error {
	source := name + ":" + hdr.Name
	rel, err := policy.CleanPath(hdr.Name, false)
	if err != nil {
		return s.refuse(ctx, source, "", err)
	}
	if rel == "." {
		return nil
	}
	dst := policy.Join(into, rel)
	obj := policy.Object{Perm: uint32(hdr.Mode) & 0o7777, Nlink: 1, Size: hdr.Size}
	switch hdr.Typeflag {
	case tar.TypeReg: // the reader turns the old TypeRegA into TypeReg
		obj.Kind = policy.KindRegular
	case tar.TypeDir:
		obj.Kind = policy.KindDir
	case tar.TypeSymlink:
		obj.Kind = policy.KindSymlink
	case tar.TypeLink:
		return s.refuse(ctx, source, dst, policy.Errorf(policy.HardlinkRefused, "%s is a hard link to %s; hard links are refused, stage the file itself", source, hdr.Linkname))
	case tar.TypeChar, tar.TypeBlock:
		obj.Kind = policy.KindDevice
	case tar.TypeFifo:
		obj.Kind = policy.KindFIFO
	case tar.TypeXGlobalHeader:
		return nil
	default:
		return s.refuse(ctx, source, dst, policy.Errorf(policy.InvalidInput, "%s: tar entry type %q is not staged; only files and directories (and symbolic links where the policy emulates them)", source, hdr.Typeflag))
	}
	if obj.Kind == policy.KindSymlink && s.pf.Policy().EmulatesLinks() {
		return s.link(ctx, source, dst, hdr.Linkname)
	}
	if err := policy.CheckObject(policy.OpRead, source, obj); err != nil {
		return s.refuse(ctx, source, dst, err)
	}
	if obj.Kind == policy.KindDir {
		existed := s.exists(dst)
		if err := s.mkdir(ctx, dst); err != nil {
			return s.refuse(ctx, source, dst, err)
		}
		if existed {
			return nil
		}
		return s.staged(ctx, source, Staged{Path: dst, Type: "dir", Created: true})
	}
	if err := s.parents(ctx, dst); err != nil {
		return s.refuse(ctx, source, dst, err)
	}
	return s.place(ctx, source, dst, tr, hdr.Size, obj.Perm&0o777)
}

// link stages a tar symlink entry as an emulated link.
func (s *stager) link(ctx context.Context, source, dst, target string) error {
	if err := s.parents(ctx, dst); err != nil {
		return s.refuse(ctx, source, dst, err)
	}
	if _, err := s.pf.Symlink(ctx, dst, target); err != nil {
		return s.refuse(ctx, source, dst, err)
	}
	return s.staged(ctx, source, Staged{Path: dst, Type: "symlink", Bytes: int64(len(target)), Created: true})
}

// parents makes the missing directories above rel.
func (s *stager) parents(ctx context.Context, rel string) error {
	dir, _ := policy.Split(rel)
	if dir == "." || s.exists(dir) {
		return nil
	}
	return s.mkdir(ctx, dir)
}

// record writes one audit record with the platform's source and actor; a
// record that can't be written stops what it describes.
func (p *Platform) record(ctx context.Context, ev audit.Event) error {
	sink := p.Audit
	if sink == nil {
		sink = audit.Discard
	}
	ev.Source = audit.SourcePlatform
	ev.Actor = p.Actor
	ev.Scope = p.WS.Scope().Hash()
	if err := sink.Record(ctx, ev); err != nil {
		return policy.Unavailable(policy.AuditUnavailable, "the audit log", err)
	}
	return nil
}

// RecordLayout audits the layout directories the workspace's Open made
// (store.Workspace.LayoutMade) as the platform's: the opener of a scope
// calls it once, before serving any door.
func (p *Platform) RecordLayout(ctx context.Context) error {
	for _, rel := range p.WS.LayoutMade() {
		if err := p.record(ctx, audit.Event{Op: "layout_mkdir", Path: rel, Result: "ok"}); err != nil {
			return err
		}
	}
	return nil
}
