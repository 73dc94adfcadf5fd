package store_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// TestChangeSetRecovery: the next lock take finishes a change set a crash
// cut: a record still staging is rolled back (its temporaries removed,
// nothing in place), a committed one rolled forward (each rename and
// delete not yet done is done).
func TestChangeSetRecovery(t *testing.T) {
	for _, c := range []struct {
		name   string
		state  string
		placed bool // whether the first file was in place before the crash
		want   map[string]string
	}{
		{"staging is rolled back", "staging", false, map[string]string{"a": "old a", "b": "old b", "gone": "x"}},
		{"commit is rolled forward", "commit", false, map[string]string{"a": "new a", "b": "new b"}},
		{"commit half done is rolled forward", "commit", true, map[string]string{"a": "new a", "b": "new b"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			sc := store.Scope{Space: "sp", Agent: "ag", Session: "se"}
			ws := e.open(t, sc, nil)
			dir := filepath.Join(e.root, sc.Dir())
			for n, s := range map[string]string{"a": "old a", "b": "old b", "gone": "x"} {
				os.WriteFile(filepath.Join(dir, n), []byte(s), 0o600)
			}
			tmpA, tmpB := policy.InternalPrefix+"tmp-aaaa", policy.InternalPrefix+"tmp-bbbb"
			os.WriteFile(filepath.Join(dir, tmpA), []byte("new a"), 0o600)
			os.WriteFile(filepath.Join(dir, tmpB), []byte("new b"), 0o600)
			if c.placed {
				os.Rename(filepath.Join(dir, tmpA), filepath.Join(dir, "a"))
			}
			rec := `{"state":"` + c.state + `","src":"tool","call":"p-1","entries":[` +
				`{"path":"a","temp":"` + tmpA + `","op":"write"},{"path":"b","temp":"` + tmpB + `","op":"write"},{"path":"gone","delete":true,"op":"delete"}]}`
			state := filepath.Join(e.root, store.LocksDir, sc.Hash(), store.IntentFile)
			got := recoverFrom(t, ws, state, rec, dir)
			if len(got) != len(c.want) {
				t.Errorf("after recovery: %v, want %v", got, c.want)
			}
			for k, v := range c.want {
				if got[k] != v {
					t.Errorf("%s = %q, want %q (all: %v)", k, got[k], v, got)
				}
			}
			if _, err := os.Stat(state); !os.IsNotExist(err) {
				t.Errorf("the record is still there: %v", err)
			}
		})
	}
}

// TestChangeSetRollForwardDeletesOnlyItsFile: a committed record left
// behind (its removal failed after every file was placed, or a crash came
// between) is rolled forward at the next lock take; a delete entry removes
// the file it checked, never one made again at its path since.
func TestChangeSetRollForwardDeletesOnlyItsFile(t *testing.T) {
	for _, c := range []struct {
		name   string
		remade bool
		want   map[string]string
	}{
		{"the checked file is deleted", false, map[string]string{"a": "new a"}},
		{"a file made again is kept", true, map[string]string{"a": "new a", "gone": "made again"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			sc := store.Scope{Space: "sp", Agent: "ag", Session: "se"}
			ws := e.open(t, sc, nil)
			dir := filepath.Join(e.root, sc.Dir())
			os.WriteFile(filepath.Join(dir, "gone"), []byte("x"), 0o600)
			var st syscall.Stat_t
			if err := syscall.Lstat(filepath.Join(dir, "gone"), &st); err != nil {
				t.Fatal(err)
			}
			if _, err := ws.ApplyChanges(context.Background(), []store.FileChange{{Path: "a", Data: []byte("new a")}}); err != nil {
				t.Fatal(err)
			}
			if c.remade {
				os.Remove(filepath.Join(dir, "gone"))
				time.Sleep(20 * time.Millisecond) // past the clock's grain
				os.WriteFile(filepath.Join(dir, "gone"), []byte("made again"), 0o600)
			}
			tmp := policy.InternalPrefix + "tmp-placed"
			rec := fmt.Sprintf(`{"state":"commit","src":"tool","call":"p-1","entries":[`+
				`{"path":"a","temp":%q,"op":"write"},{"path":"gone","delete":true,"op":"delete","ino":%d,"ctime_ns":%d}]}`,
				tmp, st.Ino, syscall.TimespecToNsec(st.Ctim))
			state := filepath.Join(e.root, store.LocksDir, sc.Hash(), store.IntentFile)
			got := recoverFrom(t, ws, state, rec, dir)
			if !maps.Equal(got, c.want) {
				t.Errorf("after the roll-forward: %v, want %v", got, c.want)
			}
			if _, err := os.Stat(state); !os.IsNotExist(err) {
				t.Errorf("the record is still there: %v", err)
			}
		})
	}
}

// recoverFrom writes the intent record rec at state, takes the scope lock
// (which finishes the change set it names) and returns dir's files.
func recoverFrom(t *testing.T, ws *store.Workspace, state, rec, dir string) map[string]string {
	t.Helper()
	if err := os.WriteFile(state, []byte(rec), 0o600); err != nil {
		t.Fatal(err)
	}
	unlock, err := ws.Lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	unlock()
	got := map[string]string{}
	ents, _ := os.ReadDir(dir)
	for _, en := range ents {
		b, _ := os.ReadFile(filepath.Join(dir, en.Name()))
		got[en.Name()] = string(b)
	}
	return got
}

// TestChangeSetRecordDamaged: a record that can't be read stops the lock
// take rather than guess.
func TestChangeSetRecordDamaged(t *testing.T) {
	e := newEnv(t)
	sc := store.Scope{Space: "sp", Agent: "ag", Session: "se"}
	ws := e.open(t, sc, nil)
	for _, rec := range []string{`{"state":`, `{"state":"commit","entries":[{"path":"../x","temp":".agentloom-tmp-1"}]}`} {
		os.WriteFile(filepath.Join(e.root, store.LocksDir, sc.Hash(), store.IntentFile), []byte(rec), 0o600)
		if unlock, err := ws.Lock(context.Background()); err == nil {
			unlock()
			t.Errorf("lock taken over the record %s", rec)
		}
	}
}

// TestChangeSetOfManyFiles: a change set larger than one staging batch
// places every file, new and changed, and leaves no temporary behind.
func TestChangeSetOfManyFiles(t *testing.T) {
	e := newEnv(t)
	sc := store.Scope{Space: "sp", Agent: "ag", Session: "se"}
	ws := e.open(t, sc, nil)
	dir := filepath.Join(e.root, sc.Dir())
	if err := os.WriteFile(filepath.Join(dir, "old"), []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"old": "changed"}
	changes := []store.FileChange{{Path: "old", Data: []byte("changed"), Expected: sha256Hex("old")}}
	for i := range 70 {
		p := fmt.Sprintf("d%d/f%d", i%3, i)
		want[p] = fmt.Sprint("content ", i)
		changes = append(changes, store.FileChange{Path: p, Data: []byte(want[p])})
	}
	res, err := ws.ApplyChanges(context.Background(), changes)
	if err != nil || len(res) != len(changes) {
		t.Fatalf("ApplyChanges: %d results, %v", len(res), err)
	}
	got := map[string]string{}
	err = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		rel, _ := filepath.Rel(dir, p)
		got[rel] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(got, want) {
		t.Fatalf("after the change set: %d files %v, want %d", len(got), got, len(want))
	}
}

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}
