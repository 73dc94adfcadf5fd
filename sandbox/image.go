package sandbox

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/distribution/reference"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/client"
)

// Image names used when none is configured.
const (
	// DefaultImage holds busybox and Python; AGENT_LOOM_SANDBOX_IMAGE overrides it.
	DefaultImage = "loomfs-sandbox:latest"
	// MinimalImage holds busybox only; it builds in seconds, for tests.
	MinimalImage = "loomfs-sandbox-min:latest"
	// DevImage holds a coding agent's toolchains (DevPackages), for the
	// tests that run real builds in the workspace.
	DevImage = "loomfs-sandbox-dev:latest"
)

// DevPackages are the Debian packages the development image is built
// from, with everything they depend on.
var DevPackages = []string{
	"git", "make", "gcc", "libc6-dev", "python3", "python3-venv", "nodejs", "npm",
	"unzip", "tar", "sqlite3", "golang-go",
}

// ErrImageMissing is returned when the sandbox image is not on the local
// engine. Images are never pulled; the operator builds them.
var ErrImageMissing = errors.New("sandbox: image not found on the local engine")

// ImageFromEnv returns AGENT_LOOM_SANDBOX_IMAGE, or DefaultImage when unset.
func ImageFromEnv() string {
	if v := os.Getenv("AGENT_LOOM_SANDBOX_IMAGE"); v != "" {
		return v
	}
	return DefaultImage
}

// BuildOptions says which sandbox image to build and where.
type BuildOptions struct {
	Host     string    // engine address; "" means HostFromEnv()
	Tag      string    // "" means ImageFromEnv(), or MinimalImage when Minimal
	Minimal  bool      // busybox only, no Python
	Dev      bool      // busybox plus DevPackages and all they depend on
	Force    bool      // rebuild even when Tag already exists
	User     string    // "uid:gid" of the sandbox user in /etc/passwd; "" means 1000:1000
	Progress io.Writer // one line per step; nil for none
}

// ImageInfo describes a sandbox image on the engine.
type ImageInfo struct {
	Tag      string   `json:"tag"`
	ID       string   `json:"id"`
	Size     int64    `json:"size"`
	Packages []string `json:"packages,omitempty"` // name=version of every package; empty when not built now
	Built    bool     `json:"built"`              // false when the image already existed and Force was not set
}

// BuildImage builds the sandbox image on the local engine from Debian
// packages fetched by this host's apt (no registry is ever contacted): it
// resolves the packages' shared-library closure, extracts them into a root
// filesystem, adds busybox applet links and the sandbox user, checks that
// every ELF file's libraries are present, and imports the tree as one layer.
// It needs apt-get, apt-cache and dpkg-deb, and an apt index (apt-get update).
func BuildImage(ctx context.Context, opts BuildOptions) (ImageInfo, error) {
	if opts.Minimal && opts.Dev {
		return ImageInfo{}, fmt.Errorf("%w: an image is either minimal or dev", ErrInvalidRequest)
	}
	if opts.Dev && opts.Tag == "" {
		opts.Tag = DevImage
	}
	tag, err := normalizeTag(opts.Tag, opts.Minimal)
	if err != nil {
		return ImageInfo{}, err
	}
	uid, gid, err := parseUser(opts.User)
	if err != nil {
		return ImageInfo{}, err
	}
	say := func(format string, args ...any) {
		if opts.Progress != nil {
			fmt.Fprintf(opts.Progress, "image build: "+format+"\n", args...)
		}
	}
	cli, err := dial(ctx, opts.Host)
	if err != nil {
		return ImageInfo{}, err
	}
	defer cli.Close()

	old, err := cli.ImageInspect(ctx, tag)
	switch {
	case err == nil && !opts.Force:
		say("%s already exists (%s, %s); use --force to rebuild", tag, shortID(old.ID), mib(old.Size))
		return ImageInfo{Tag: tag, ID: old.ID, Size: old.Size}, nil
	case err != nil && !cerrdefs.IsNotFound(err):
		return ImageInfo{}, fmt.Errorf("sandbox: inspect image %s: %w", tag, err)
	}

	work, err := os.MkdirTemp("", "loomfs-image-")
	if err != nil {
		return ImageInfo{}, fmt.Errorf("sandbox: image work dir: %w", err)
	}
	defer os.RemoveAll(work)
	rootfs := filepath.Join(work, "rootfs")

	r := recipe{minimal: opts.Minimal, dev: opts.Dev}
	if err := r.assemble(ctx, work, rootfs, uid, gid, say); err != nil {
		return ImageInfo{}, err
	}

	size, err := treeSize(rootfs)
	if err != nil {
		return ImageInfo{}, err
	}
	say("importing %s root filesystem as %s", mib(size), tag)
	id, err := importTree(ctx, cli, rootfs, tag, r.changes(uid, gid), r.message())
	if err != nil {
		return ImageInfo{}, err
	}
	if old.ID != "" && old.ID != id {
		// The previous build is now untagged; drop it unless a container still uses it.
		if _, err := cli.ImageRemove(ctx, old.ID, image.RemoveOptions{}); err == nil {
			say("removed previous image %s", shortID(old.ID))
		}
	}
	info, err := cli.ImageInspect(ctx, id)
	if err != nil {
		return ImageInfo{}, fmt.Errorf("sandbox: inspect imported image %s: %w", tag, err)
	}
	say("built %s: %s, %s, %d packages", tag, shortID(info.ID), mib(info.Size), len(r.packages))
	return ImageInfo{Tag: tag, ID: info.ID, Size: info.Size, Packages: r.packages, Built: true}, nil
}

// normalizeTag validates a local image reference and adds ":latest" when no
// tag is given. Digests are refused: an import can only be tagged.
func normalizeTag(tag string, minimal bool) (string, error) {
	if tag == "" {
		tag = ImageFromEnv()
		if minimal {
			tag = MinimalImage
		}
	}
	named, err := reference.ParseNormalizedNamed(tag)
	if err != nil {
		return "", fmt.Errorf("%w: image tag %q: %v", ErrInvalidRequest, tag, err)
	}
	if _, ok := named.(reference.Digested); ok {
		return "", fmt.Errorf("%w: image tag %q: a digest can't name a locally built image", ErrInvalidRequest, tag)
	}
	return reference.FamiliarString(reference.TagNameOnly(named)), nil
}

// importTree streams dir as a tar archive into the engine's image import and
// returns the new image's ID.
func importTree(ctx context.Context, cli *client.Client, dir, tag string, changes []string, message string) (string, error) {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeTar(pw, dir)) }()
	defer pr.Close()

	rc, err := cli.ImageImport(ctx, image.ImportSource{Source: pr, SourceName: "-"}, tag,
		image.ImportOptions{Changes: changes, Message: message})
	if err != nil {
		return "", fmt.Errorf("sandbox: import image %s: %w", tag, err)
	}
	defer rc.Close()
	var id string
	dec := json.NewDecoder(rc)
	for {
		var msg struct {
			Status      string `json:"status"`
			ErrorDetail *struct {
				Message string `json:"message"`
			} `json:"errorDetail"`
			Error string `json:"error"`
		}
		if err := dec.Decode(&msg); err == io.EOF {
			break
		} else if err != nil {
			return "", fmt.Errorf("sandbox: import image %s: read engine reply: %w", tag, err)
		}
		if msg.ErrorDetail != nil || msg.Error != "" {
			text := msg.Error
			if msg.ErrorDetail != nil && msg.ErrorDetail.Message != "" {
				text = msg.ErrorDetail.Message
			}
			return "", fmt.Errorf("sandbox: import image %s: %s", tag, text)
		}
		if strings.HasPrefix(msg.Status, "sha256:") {
			id = strings.TrimSpace(msg.Status)
		}
	}
	if id == "" {
		return "", fmt.Errorf("sandbox: import image %s: engine reported no image id", tag)
	}
	return id, nil
}

// writeTar writes the tree under dir to w as a tar archive owned by root,
// with set-id bits stripped. Entries come in lexical order.
func writeTar(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		var link string
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		hdr.Name = filepath.ToSlash(rel)
		if fi.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "root", "root"
		hdr.Mode &^= 0o6000 // never setuid/setgid in the sandbox
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return fmt.Errorf("sandbox: tar root filesystem: %w", err)
	}
	return tw.Close()
}

// treeSize sums the sizes of the regular files under dir.
func treeSize(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		fi, err := d.Info()
		if err == nil {
			n += fi.Size()
		}
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("sandbox: size root filesystem: %w", err)
	}
	return n, nil
}

func shortID(id string) string {
	id = strings.TrimPrefix(id, "sha256:")
	if len(id) > 12 {
		id = id[:12]
	}
	return id
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
