package stage

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// Collected is one object collected.
type Collected struct {
	Path   string `json:"path"` // relative to the subtree collected
	Type   string `json:"type"`
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256,omitempty"`
}

// Collection is what one Collect did. Files that can't be collected
// (symlinks, hard-linked and special files, files over
// store.MaxArtifactBytes, names the destination already has) are listed
// in Refused; Truncated says the walk stopped at store.MaxArtifacts
// files.
type Collection struct {
	From      string      `json:"from"`
	Collected []Collected `json:"collected"`
	Refused   []Refused   `json:"refused"`
	Bytes     int64       `json:"bytes"`
	Truncated bool        `json:"truncated"`
}

// A Sink receives what Collect reads: each directory before what it
// holds, and each file whole (at most store.MaxArtifactBytes), checked
// and read from the descriptor that was opened. rel is relative to the
// subtree collected. A *policy.Error refuses that one object; any other
// error stops the collection.
type Sink interface {
	Dir(rel string) error
	File(rel string, perm uint32, mtime time.Time, data []byte) error
}

// Collect reads the subtree from (cleaned; "" or "." is the whole scope)
// into sink, whatever its mode says (write-only output/ and hidden .meta/
// included), with the checks and caps of artifacts. Every file handed to
// the sink is audited before it is. A from that can't be collected at all
// answers nil and the error; otherwise the collection says what was done,
// with the error that stopped it, if any.
func (p *Platform) Collect(ctx context.Context, from string, sink Sink) (*Collection, error) {
	ws := p.WS
	if from == "" {
		from = "."
	}
	rel, err := policy.CleanPath(from, ws.Scope().Main())
	if err != nil {
		return nil, err
	}
	pf := ws.Platform()
	info, err := pf.Lstat(rel)
	if err != nil {
		return nil, err
	}
	c := &Collection{From: rel, Collected: []Collected{}, Refused: []Refused{}}
	start := time.Now()
	col := &collector{p: p, pf: pf, sink: sink, c: c}
	if info.Kind == policy.KindDir && !info.OtherMount {
		err = pf.Walk(ctx, rel, func(r string, info store.Info) error {
			return col.object(ctx, r, inner(rel, r), info)
		})
	} else {
		err = col.object(ctx, rel, info.Name, info)
	}
	if errors.Is(err, errFull) {
		c.Truncated, err = true, nil
	}
	ev := audit.Event{Op: "collect", Path: rel, Result: "ok", Bytes: c.Bytes, Duration: time.Since(start),
		Detail: map[string]any{"collected": len(c.Collected), "refused": len(c.Refused), "truncated": c.Truncated}}
	if err != nil {
		ev.Result, ev.Code = "error", string(policy.AsError(err).Code)
	} else if len(c.Refused) > 0 {
		ev.Result = "refused"
	}
	if rerr := p.record(ctx, ev); err == nil {
		err = rerr
	}
	return c, err
}

// inner is rel as a path inside the subtree from.
func inner(from, rel string) string {
	if from == "." {
		return rel
	}
	return rel[len(from)+1:]
}

var errFull = errors.New("collection full")

type collector struct {
	p    *Platform
	pf   *store.Workspace
	sink Sink
	c    *Collection
}

// object collects the object at rel in the scope, out at out.
func (col *collector) object(ctx context.Context, rel, out string, info store.Info) error {
	if err := ctx.Err(); err != nil {
		return policy.Errorf(policy.Cancelled, "collect cancelled")
	}
	if rel == policy.SubagentsDir && col.p.WS.Scope().Main() {
		return store.SkipDir // not creatable; a planted one is no child
	}
	if err := policy.CheckObject(policy.OpRead, rel, info.Object()); err != nil {
		return col.refuse(ctx, rel, out, err)
	}
	if info.Kind == policy.KindDir {
		if err := col.sink.Dir(out); err != nil {
			if err := col.refuse(ctx, rel, out, err); err != nil {
				return err
			}
			return store.SkipDir
		}
		return nil
	}
	if len(col.c.Collected)+len(col.c.Refused) >= store.MaxArtifacts {
		return errFull
	}
	if info.Size > store.MaxArtifactBytes {
		return col.refuse(ctx, rel, out, policy.Errorf(policy.TooLarge, "%s is %s; the collection limit per file is %s", rel, policy.Bytes(info.Size), policy.Bytes(store.MaxArtifactBytes)))
	}
	f, info, err := col.pf.Open(policy.OpRead, rel, unix.O_RDONLY)
	if err != nil {
		return col.refuse(ctx, rel, out, err)
	}
	// Read it whole (within the cap) before handing a byte on, so a
	// refusal never leaves half a file at the destination.
	data, err := io.ReadAll(io.LimitReader(f, store.MaxArtifactBytes+1))
	f.Close()
	if err != nil {
		return col.refuse(ctx, rel, out, policy.FromErrno(err, "read", rel))
	}
	if len(data) > store.MaxArtifactBytes {
		return col.refuse(ctx, rel, out, policy.Errorf(policy.TooLarge, "%s grew past the collection limit of %s while being read", rel, policy.Bytes(store.MaxArtifactBytes)))
	}
	sum := sha256.Sum256(data)
	o := Collected{Path: out, Type: "file", Bytes: int64(len(data)), SHA256: hex.EncodeToString(sum[:])}
	if err := col.p.record(ctx, audit.Event{Op: "collect_object", Path: rel, Result: "ok", Bytes: o.Bytes, SHA256: o.SHA256}); err != nil {
		return err
	}
	if err := col.sink.File(out, policy.OwnerPerm(info.Perm), info.ModTime, data); err != nil {
		return col.refuse(ctx, rel, out, err)
	}
	col.c.Collected = append(col.c.Collected, o)
	col.c.Bytes += o.Bytes
	return nil
}

func (col *collector) refuse(ctx context.Context, rel, out string, err error) error {
	var pe *policy.Error
	if !errors.As(err, &pe) || fatal(err) {
		return err
	}
	col.c.Refused = append(col.c.Refused, Refused{Source: rel, Path: out, Code: pe.Code, Message: pe.Message})
	return col.p.record(ctx, audit.Event{Op: "collect_object", Path: rel, Result: "refused", Code: string(pe.Code), Detail: map[string]any{"message": pe.Message}})
}

// DirSink writes a collection into a host directory, made 0700 if
// missing. It never replaces anything: a name the directory already has
// is refused (exists) and listed.
type DirSink struct{ root *os.Root }

// ToDir opens (making it if missing) the host directory path as a Sink.
// Close it when done.
func ToDir(path string) (*DirSink, error) {
	if err := os.MkdirAll(path, 0o700); err != nil {
		return nil, err
	}
	root, err := os.OpenRoot(path)
	if err != nil {
		return nil, err
	}
	return &DirSink{root: root}, nil
}

// Dir makes the directory rel, or accepts one already there.
func (d *DirSink) Dir(rel string) error {
	err := d.root.Mkdir(rel, 0o700)
	if errors.Is(err, fs.ErrExist) {
		if st, serr := d.root.Lstat(rel); serr == nil && st.IsDir() {
			return nil
		}
		return policy.Errorf(policy.Exists, "%s: the destination has something else there", rel)
	}
	return err
}

// File writes data to the new file rel.
func (d *DirSink) File(rel string, perm uint32, mtime time.Time, data []byte) error {
	f, err := d.root.OpenFile(rel, os.O_CREATE|os.O_EXCL|os.O_WRONLY, fs.FileMode(perm))
	if errors.Is(err, fs.ErrExist) {
		return policy.Errorf(policy.Exists, "%s: already in the destination; nothing is replaced", rel)
	}
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Close releases the directory.
func (d *DirSink) Close() error { return d.root.Close() }

// TarSink writes a collection as a tar stream.
type TarSink struct{ tw *tar.Writer }

// ToTar returns a Sink writing a tar stream to w. Close it to end the
// stream.
func ToTar(w io.Writer) *TarSink { return &TarSink{tw: tar.NewWriter(w)} }

// Dir writes a directory entry.
func (t *TarSink) Dir(rel string) error {
	return t.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: rel + "/", Mode: 0o700, ModTime: time.Now()})
}

// File writes a file entry.
func (t *TarSink) File(rel string, perm uint32, mtime time.Time, data []byte) error {
	if err := t.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: rel, Mode: int64(perm), Size: int64(len(data)), ModTime: mtime}); err != nil {
		return err
	}
	_, err := io.Copy(t.tw, bytes.NewReader(data))
	return err
}

// Close writes the end of the stream.
func (t *TarSink) Close() error { return t.tw.Close() }
