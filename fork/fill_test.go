package fork_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentloom/loomfs/fork"
	"github.com/agentloom/loomfs/snapshot"
	"github.com/agentloom/loomfs/store"
)

// manyFiles puts a tree in main behind loomfs's back: more files than one
// worker's batch in some directories, nested ones, empty, large (over a
// copy buffer) and executable files, each with its own modification time.
// It returns each file's content by path.
func manyFiles(t *testing.T, v *volume) map[string]string {
	t.Helper()
	files := map[string]string{}
	for i := range 300 {
		dir := fmt.Sprintf("src/d%d", i%7)
		if i%3 == 0 {
			dir = fmt.Sprintf("src/d%d/sub%d/deeper", i%7, i%2)
		}
		rel := fmt.Sprintf("%s/f%03d", dir, i)
		content := strings.Repeat(fmt.Sprintf("file %d\n", i), i%11)
		if i == 5 {
			content = strings.Repeat("x", 600<<10+7) // several copy buffers
		}
		files[rel] = content
		p := v.path(mainScope, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		mode := os.FileMode(0o600)
		if i%10 == 0 {
			mode = 0o700
		}
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		mt := time.Unix(1_600_000_000+int64(i), int64(i)*1000+1)
		if err := os.Chtimes(p, mt, mt); err != nil {
			t.Fatal(err)
		}
	}
	return files
}

// manySnapshot puts manyFiles in main on a fresh volume and snapshots it;
// it returns the volume, main, the files and the snapshot's id.
func manySnapshot(t *testing.T) (*volume, *store.Workspace, map[string]string, string) {
	t.Helper()
	v := newVolume(t, t.TempDir())
	src := v.open(t, mainScope, nil)
	files := manyFiles(t, v)
	m, err := snapshot.Create(context.Background(), src, snapshot.Options{Full: true})
	if err != nil {
		t.Fatal(err)
	}
	return v, src, files, m.ID
}

// TestForkManyFiles checks that the fork's workers build every file of a
// larger tree as the source has it (content, owner's bits, modification
// time), that the base record describes each copy as fstat does, and
// that the destination's quota account is what a walk of it counts.
func TestForkManyFiles(t *testing.T) {
	for _, opt := range []fork.Options{{}, {NoClone: true}} {
		t.Run(fmt.Sprintf("no clone %v", opt.NoClone), func(t *testing.T) {
			v, src, files, id := manySnapshot(t)
			opt.Snapshot = id
			dst := v.open(t, childA, nil)
			res, err := fork.Fork(context.Background(), src, dst, opt)
			if err != nil {
				t.Fatal(err)
			}
			nonEmpty := 0
			for _, c := range files {
				if c != "" {
					nonEmpty++
				}
			}
			// An empty file has no data to clone or copy.
			if res.Files != len(files) || res.Cloned+res.Copied != nonEmpty {
				t.Fatalf("files %d (cloned %d, copied %d), want %d (%d with data)", res.Files, res.Cloned, res.Copied, len(files), nonEmpty)
			}
			// The account was counted from the entries the fork made,
			// not walked: it must be what a walk counts.
			used, err := dst.Usage(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if walked, err := dst.CountUsage(context.Background()); err != nil || used != walked {
				t.Fatalf("the fork's quota account %+v, a walk %+v (%v)", used, walked, err)
			}
			rec, err := fork.ReadRecord(v.vol, childA)
			if err != nil {
				t.Fatal(err)
			}
			byPath := map[string]fork.Entry{}
			for _, e := range rec.Entries {
				byPath[e.Path] = e
			}
			for rel, want := range files {
				got, ok := read(t, v, childA, rel)
				if !ok || got != want {
					t.Fatalf("%s in the fork: %d bytes (exists %v), want %d", rel, len(got), ok, len(want))
				}
				sfi, err := os.Stat(v.path(mainScope, rel))
				if err != nil {
					t.Fatal(err)
				}
				dfi, err := os.Stat(v.path(childA, rel))
				if err != nil {
					t.Fatal(err)
				}
				if dfi.Mode() != sfi.Mode() || !dfi.ModTime().Equal(sfi.ModTime()) {
					t.Errorf("%s in the fork: %v %v, want %v %v", rel, dfi.Mode(), dfi.ModTime(), sfi.Mode(), sfi.ModTime())
				}
				st := dfi.Sys().(*syscall.Stat_t)
				e, ok := byPath[rel]
				if !ok || e.Type != "file" || e.SHA256 != sum(want) || e.Ino != st.Ino || e.FSize != st.Size || e.FMod != st.Mtim.Nano() || e.CTime != st.Ctim.Nano() {
					t.Errorf("%s: base record %+v, want it to describe the copy (ino %d)", rel, e, st.Ino)
				}
			}
		})
	}
}

// TestForkDamagedBlob checks that a worker's failure stops the fork whole:
// a stored content cut short is found, and the destination is left as it
// was, with no file, no record and no tree beside it.
func TestForkDamagedBlob(t *testing.T) {
	v, src, files, id := manySnapshot(t)
	victim := sum(files["src/d3/f080"])
	var blob string
	filepath.WalkDir(filepath.Join(v.root, store.SnapshotsDir), func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Name() == victim {
			blob = p
		}
		return nil
	})
	if blob == "" {
		t.Fatal("the blob of src/d3/f080 is not in the snapshot store")
	}
	if err := os.Truncate(blob, 3); err != nil {
		t.Fatal(err)
	}
	for _, noClone := range []bool{false, true} {
		dst := v.open(t, childA, nil)
		_, err := fork.Fork(context.Background(), src, dst, fork.Options{Snapshot: id, NoClone: noClone})
		if err == nil || !strings.Contains(err.Error(), "damaged") || !strings.Contains(err.Error(), "src/d3/f080") {
			t.Fatalf("no clone %v: err %v, want the damaged content named", noClone, err)
		}
		if _, ok := read(t, v, childA, "src/d0/f007"); ok {
			t.Fatal("a failed fork left files in the destination")
		}
		if _, err := fork.ReadRecord(v.vol, childA); err == nil {
			t.Fatal("a failed fork left a record")
		}
		parent := filepath.Dir(v.path(childA, "."))
		names, err := os.ReadDir(parent)
		if err != nil {
			t.Fatal(err)
		}
		if len(names) != 1 {
			t.Fatalf("beside the destination: %v, want only it", names)
		}
	}
}
