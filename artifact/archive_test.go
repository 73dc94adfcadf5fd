package artifact_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/agentloom/loomfs/artifact"
	"github.com/agentloom/loomfs/snapshot"
	"github.com/agentloom/loomfs/store"
)

var archivedScope = store.Scope{Space: "sp", Agent: "ag", Session: "se"}

// openScope opens the test scope on a volume at root (made if new).
func openScope(t *testing.T, root string) *store.Workspace {
	t.Helper()
	ctx := context.Background()
	vol, err := store.OpenVolume(ctx, store.Config{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vol.Close() })
	ws, err := vol.Open(ctx, archivedScope, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	return ws
}

// dump describes every object under the scope's directory as the disk
// has it: type, owner bits, size, sha256 and, for files, the
// modification time (directories' times are not kept).
func dump(t *testing.T, root string) map[string]string {
	t.Helper()
	dir := filepath.Join(root, archivedScope.Dir())
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		info, err := os.Lstat(p)
		if err != nil {
			return err
		}
		switch {
		case info.IsDir():
			out[rel] = fmt.Sprintf("dir %o", info.Mode().Perm())
		case info.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(b)
			out[rel] = fmt.Sprintf("file %o %d %s %d", info.Mode().Perm(), len(b), hex.EncodeToString(sum[:8]), info.ModTime().UnixNano())
		default:
			out[rel] = "unexpected " + info.Mode().String()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestSnapshotArchiveRoundTrip: a scope archived twice sends only what
// changed the second time, and each archive rebuilds the scope on a fresh
// volume from the store alone, byte for byte, modes, times and emulated
// links included.
func TestSnapshotArchiveRoundTrip(t *testing.T) {
	st, _ := openStore(t)
	ctx := context.Background()
	root := t.TempDir()
	ws := openScope(t, root)
	files := map[string]os.FileMode{"a.txt": 0o600, "bin/run.sh": 0o700, "ro/notes.md": 0o400, "ro/deep/x.bin": 0o500}
	for i := range 30 {
		files[fmt.Sprintf("src/f%02d.go", i)] = 0o600
	}
	for rel, mode := range files {
		p := filepath.Join(root, archivedScope.Dir(), rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("content of "+rel+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ws.Symlink(ctx, "bin/latest", "run.sh"); err != nil {
		t.Fatal(err)
	}
	first, err := snapshot.Create(ctx, ws, snapshot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	before := dump(t, root)

	a1, sent, err := st.ArchiveSnapshot(ctx, ws.Volume(), archivedScope, "")
	if err != nil {
		t.Fatal(err)
	}
	contents := len(files) + 1 // and the link's target
	if a1.Snapshot.ID != first.ID || !sent.Manifest || sent.Blobs != contents {
		t.Fatalf("first archive: snapshot %s, sent %+v; want %s, %d contents and the archive", a1.Snapshot.ID, sent, first.ID, contents)
	}
	// Again: nothing to send.
	if _, again, err := st.ArchiveSnapshot(ctx, ws.Volume(), archivedScope, first.ID); err != nil || again.Manifest || again.Blobs != 0 {
		t.Fatalf("archiving the same snapshot again: %+v, %v; want nothing sent", again, err)
	}

	// Two files change, one is new: the second archive sends those three.
	for _, rel := range []string{"src/f03.go", "src/f17.go", "src/new.go"} {
		if _, err := ws.WriteFile(ctx, rel, []byte("changed "+rel+"\n"), nil); err != nil {
			t.Fatal(err)
		}
	}
	second, err := snapshot.Create(ctx, ws, snapshot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	after := dump(t, root)
	_, sent, err = st.ArchiveSnapshot(ctx, ws.Volume(), archivedScope, "")
	if err != nil || sent.Blobs != 3 || sent.Present != contents-2 {
		t.Fatalf("second archive: %+v, %v; want 3 sent, %d present", sent, err, contents-2)
	}
	ids, err := st.Archived(ctx, archivedScope)
	if err != nil || !slices.Equal(ids, []string{first.ID, second.ID}) {
		t.Fatalf("Archived = %v, %v; want %s and %s", ids, err, first.ID, second.ID)
	}

	cases := []struct {
		name, id string
		want     map[string]string
	}{
		{"the newest archive", "", after},
		{"an older archive by id", first.ID, before},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fresh := t.TempDir()
			ws2 := openScope(t, fresh)
			m, got, err := st.RestoreArchive(ctx, ws2, c.id, snapshot.RestoreOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got.Present != 0 || got.Blobs == 0 {
				t.Fatalf("restore on a fresh volume fetched %+v", got)
			}
			if d := dump(t, fresh); !maps.Equal(d, c.want) {
				t.Fatalf("restored %s differs:\n got %v\nwant %v", m.ID, d, c.want)
			}
			target, _, err := ws2.ReadLink("bin/latest")
			if err != nil || target != "run.sh" {
				t.Fatalf("bin/latest after restore: %q, %v; want an emulated link to run.sh", target, err)
			}
		})
	}
}

// TestArchiveDamageRefused: a restore whose archived content is missing,
// truncated or altered is refused naming the file and the object, and the
// scope it would have replaced is unchanged.
func TestArchiveDamageRefused(t *testing.T) {
	cases := []struct {
		name   string
		damage func(ctx context.Context, raw *s3.Client, bucket, key string) error
	}{
		{"missing", func(ctx context.Context, raw *s3.Client, bucket, key string) error {
			_, err := raw.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &bucket, Key: &key})
			return err
		}},
		{"truncated", func(ctx context.Context, raw *s3.Client, bucket, key string) error {
			_, err := raw.PutObject(ctx, &s3.PutObjectInput{Bucket: &bucket, Key: &key, Body: strings.NewReader("cont")})
			return err
		}},
		{"altered", func(ctx context.Context, raw *s3.Client, bucket, key string) error {
			_, err := raw.PutObject(ctx, &s3.PutObjectInput{Bucket: &bucket, Key: &key, Body: strings.NewReader("content of a.txT\n")})
			return err
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st, raw := openStore(t)
			ctx := context.Background()
			root := t.TempDir()
			ws := openScope(t, root)
			if _, err := ws.WriteFile(ctx, "a.txt", []byte("content of a.txt\n"), nil); err != nil {
				t.Fatal(err)
			}
			if _, err := ws.WriteFile(ctx, "b.txt", []byte("fine\n"), nil); err != nil {
				t.Fatal(err)
			}
			if _, err := snapshot.Create(ctx, ws, snapshot.Options{}); err != nil {
				t.Fatal(err)
			}
			a, _, err := st.ArchiveSnapshot(ctx, ws.Volume(), archivedScope, "")
			if err != nil {
				t.Fatal(err)
			}
			var sha string
			for _, e := range a.Entries {
				if e.Path == "a.txt" {
					sha = e.SHA256
				}
			}
			key := st.Config().Prefix + "blobs/" + sha[:2] + "/" + sha
			if err := c.damage(ctx, raw, st.Config().Bucket, key); err != nil {
				t.Fatal(err)
			}
			fresh := t.TempDir()
			ws2 := openScope(t, fresh)
			if _, err := ws2.WriteFile(ctx, "kept.txt", []byte("here before\n"), nil); err != nil {
				t.Fatal(err)
			}
			want := dump(t, fresh)
			_, _, err = st.RestoreArchive(ctx, ws2, "", snapshot.RestoreOptions{})
			if !errors.Is(err, artifact.ErrDamaged) || !strings.Contains(err.Error(), key) || !strings.Contains(err.Error(), "a.txt") {
				t.Fatalf("restore of a damaged archive: %v; want ErrDamaged naming a.txt and %s", err, key)
			}
			if d := dump(t, fresh); !maps.Equal(d, want) {
				t.Fatalf("the scope changed after a refused restore: %v, want %v", d, want)
			}
		})
	}
}

// TestTamperedArchiveRefused: an archive whose entries were edited to name
// a path a snapshot can't hold, or a content the store lacks, is refused
// naming the archive, and the scope is unchanged.
func TestTamperedArchiveRefused(t *testing.T) {
	content := []byte("content of a.txt\n")
	sum := sha256.Sum256(content)
	sha := hex.EncodeToString(sum[:])
	other := strings.Repeat("0", 64)
	cases := []struct {
		name, from, to string
		names          string // "archive" or the content named by the refusal
	}{
		{"a path leaving the scope", `"path":"a.txt"`, `"path":"../a.txt"`, "archive"},
		{"a size its content doesn't have", `"size":17`, `"size":18`, sha},
		{"a content never uploaded", sha, other, other},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st, raw := openStore(t)
			ctx := context.Background()
			ws := openScope(t, t.TempDir())
			if _, err := ws.WriteFile(ctx, "a.txt", content, nil); err != nil {
				t.Fatal(err)
			}
			m, err := snapshot.Create(ctx, ws, snapshot.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if _, _, err := st.ArchiveSnapshot(ctx, ws.Volume(), archivedScope, ""); err != nil {
				t.Fatal(err)
			}
			bucket := st.Config().Bucket
			key := st.Config().Prefix + "snapshots/" + archivedScope.Hash() + "/" + m.ID + ".json"
			out, err := raw.GetObject(ctx, &s3.GetObjectInput{Bucket: &bucket, Key: &key})
			if err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			if _, err := io.Copy(&b, out.Body); err != nil {
				t.Fatal(err)
			}
			out.Body.Close()
			doc := b.String()
			if !strings.Contains(doc, c.from) {
				t.Fatalf("the archive holds no %s: %s", c.from, doc)
			}
			doc = strings.Replace(doc, c.from, c.to, 1)
			if _, err := raw.PutObject(ctx, &s3.PutObjectInput{Bucket: &bucket, Key: &key, Body: strings.NewReader(doc)}); err != nil {
				t.Fatal(err)
			}
			fresh := t.TempDir()
			ws2 := openScope(t, fresh)
			want := dump(t, fresh)
			_, _, err = st.RestoreArchive(ctx, ws2, "", snapshot.RestoreOptions{})
			named := key
			if c.names != "archive" {
				named = st.Config().Prefix + "blobs/" + c.names[:2] + "/" + c.names
			}
			if !errors.Is(err, artifact.ErrDamaged) || !strings.Contains(err.Error(), named) {
				t.Fatalf("restore of a tampered archive: %v; want ErrDamaged naming %s", err, named)
			}
			if d := dump(t, fresh); !maps.Equal(d, want) {
				t.Fatalf("the scope changed after a refused restore: %v, want %v", d, want)
			}
		})
	}
}
