package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"

	"github.com/agentloom/loomfs/policy"
)

// Platform returns a view of w for the platform's own door (package
// stage): the path modes don't apply, so ro, wo and hidden subtrees can be
// filled and read, while every object check, limit, quota, subtree cap and
// reserved name does (policy.WithoutModes). The view shares w's fds and
// journal: never Close it, nor use it after w is closed. It draws on w's
// quota accounts, the scope's and its capped subtrees'.
func (w *Workspace) Platform() *Workspace {
	v := w.Unfiltered()
	v.pol = w.pol.WithoutModes()
	return v
}

// PlaceFile atomically puts the size bytes read from r at rel: the content
// goes to a temporary file in the same directory, fsynced, then takes the
// name (newname.Place for a new file, a rename over an existing regular one),
// and the directory is fsynced, so a reader sees the old file or the whole
// new one and a refusal leaves nothing. It is the streaming sibling of
// WriteFile, under the filesystem's per-file limit (Limits.FileBytes), not
// the text tools'. The size is reserved against the quota and caps before
// a byte is written; r must give exactly size bytes, and a source that
// grows or shrinks meanwhile is refused. perm is kept within
// policy.OwnerPerm. Callers hold the scope lock.
func (w *Workspace) PlaceFile(ctx context.Context, rel string, r io.Reader, size int64, perm uint32) (WriteResult, error) {
	if err := w.checkWritable(policy.OpWrite, rel); err != nil {
		return WriteResult{}, err
	}
	if err := w.pol.Limits.CheckFileSize(rel, size); err != nil {
		return WriteResult{}, err
	}
	parent, name, err := w.Parent(rel)
	if err != nil {
		return WriteResult{}, err
	}
	defer parent.Close()
	var old int64
	exists := false
	if st, mnt, err := lstatAt(int(parent.Fd()), name); err == nil {
		info := w.infoOf(name, &st, mnt)
		if info.Kind == policy.KindDir {
			return WriteResult{}, policy.Errorf(policy.IsDir, "%s is a directory", rel)
		}
		if err := policy.CheckObject(policy.OpWrite, rel, info.Object()); err != nil {
			return WriteResult{}, err
		}
		old, exists = info.Size, true
	} else if err := w.pol.Check(policy.OpCreate, rel); err != nil {
		return WriteResult{}, err
	}
	var addFiles int64
	if !exists {
		addFiles = 1
	}
	if err := w.ReserveAt(ctx, rel, size-old, addFiles); err != nil {
		return WriteResult{}, err
	}
	undo := func() { w.AdjustAt(rel, old-size, -addFiles) }
	if err := ctx.Err(); err != nil {
		undo()
		return WriteResult{}, policy.Errorf(policy.Cancelled, "placing %s cancelled before it started", rel)
	}
	h := sha256.New()
	src := io.TeeReader(&exactReader{r: r, left: size, rel: rel}, h)
	by := changeBy(ctx, OpWrite)
	if !exists {
		by.Op = OpCreate
	}
	if by.Source == "" {
		by.Source = SourcePlatform
	}
	if err := w.replaceFrom(parent, name, rel, src, policy.OwnerPerm(perm), !exists, by); err != nil {
		undo()
		return WriteResult{}, err
	}
	return WriteResult{Bytes: size, SHA256: hex.EncodeToString(h.Sum(nil)), Created: !exists}, nil
}

// exactReader gives exactly left bytes of r, and fails if r has fewer or
// more: a file that changes while it is copied is refused, not cut.
type exactReader struct {
	r    io.Reader
	left int64
	rel  string
}

func (e *exactReader) Read(p []byte) (int, error) {
	if e.left == 0 {
		var one [1]byte
		if n, _ := io.ReadFull(e.r, one[:]); n > 0 {
			return 0, policy.Errorf(policy.Conflict, "%s: the source grew while it was being copied; nothing was placed", e.rel)
		}
		return 0, io.EOF
	}
	if int64(len(p)) > e.left {
		p = p[:e.left]
	}
	n, err := e.r.Read(p)
	e.left -= int64(n)
	if err == io.EOF && e.left > 0 {
		return n, policy.Errorf(policy.Conflict, "%s: the source shrank while it was being copied; nothing was placed", e.rel)
	}
	if err != nil && err != io.EOF {
		return n, err
	}
	return n, nil
}
