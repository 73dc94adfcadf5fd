package store_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// sharedRoot makes an administrator's shared root under dir: the directory
// and its marker holding id.
func sharedRoot(t *testing.T, dir, id string) string {
	t.Helper()
	root := filepath.Join(dir, "volume")
	mkfile(t, filepath.Join(root, store.VolumeMarker), id+"\n")
	return root
}

func sharedCfg(root, data string) store.Config {
	return store.Config{Backend: store.BackendSharedPOSIX, Root: root, VolumeID: volID, DataDir: data}
}

func spec(run, user string) store.RunSpec {
	return store.RunSpec{Space: "sp", Agent: "ag", Session: "se", Run: run, User: user}
}

func createRun(t *testing.T, cfg store.Config, s store.RunSpec) *store.Binding {
	t.Helper()
	b, err := store.CreateRun(context.Background(), cfg, s)
	if err != nil {
		t.Fatalf("CreateRun(%s): %v", s.Run, err)
	}
	return b
}

func resume(t *testing.T, cfg store.Config, run string) *store.Run {
	t.Helper()
	r, err := store.ResumeRun(context.Background(), cfg, run)
	if err != nil {
		t.Fatalf("ResumeRun(%s): %v", run, err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func openMain(t *testing.T, r *store.Run) *store.Workspace {
	t.Helper()
	ws, err := r.Main(context.Background(), nil)
	if err != nil {
		t.Fatalf("Main of run %s: %v", r.ID(), err)
	}
	t.Cleanup(func() { ws.Close() })
	return ws
}

func openInstance(t *testing.T, r *store.Run, inst string) *store.Workspace {
	t.Helper()
	ws, err := r.Instance(context.Background(), inst, nil)
	if err != nil {
		t.Fatalf("Instance %s of run %s: %v", inst, r.ID(), err)
	}
	t.Cleanup(func() { ws.Close() })
	return ws
}

func write(t *testing.T, ws *store.Workspace, rel, content string) {
	t.Helper()
	if _, err := ws.WriteFile(context.Background(), rel, []byte(content), nil); err != nil {
		t.Fatalf("write %s: %v", rel, err)
	}
}

func read(t *testing.T, ws *store.Workspace, rel string) string {
	t.Helper()
	b, _, err := ws.ReadFile(context.Background(), rel)
	if err != nil {
		t.Fatalf("read %s: %v", rel, err)
	}
	return string(b)
}

// TestCreateRunRecordsBinding: a new run records backend, volume id,
// layout version, scope ids and the initiating user, atomically, under
// .agentloom-runs/<run_id>.json (SPEC §2.3).
func TestCreateRunRecordsBinding(t *testing.T) {
	dir := t.TempDir()
	root := sharedRoot(t, dir, volID)
	cfg := sharedCfg(root, filepath.Join(dir, "data"))
	b := createRun(t, cfg, spec("run-1", "alice@example.com"))

	raw, err := os.ReadFile(filepath.Join(root, store.RunsDir, "run-1.json"))
	if err != nil {
		t.Fatalf("binding file: %v", err)
	}
	var onDisk map[string]any
	if err := json.Unmarshal(raw, &onDisk); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"run_id": "run-1", "backend": "shared_posix", "volume_id": volID, "layout_version": float64(store.LayoutVersion),
		"space": "sp", "agent": "ag", "session": "se", "user": "alice@example.com",
	}
	for k, v := range want {
		if onDisk[k] != v {
			t.Errorf("binding field %s = %v; want %v", k, onDisk[k], v)
		}
	}
	if b.MainScope() != (store.Scope{Space: "sp", Agent: "ag", Session: "se"}) {
		t.Errorf("MainScope = %v", b.MainScope())
	}
	fi, err := os.Stat(filepath.Join(root, store.RunsDir, "run-1.json"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("binding file mode %v (%v); want 0600", fi.Mode(), err)
	}
	names := diskNames(t, filepath.Join(root, store.RunsDir))
	if !slices.Equal(names, []string{"run-1.json", store.SessionsDir}) {
		t.Errorf(".agentloom-runs holds %v; an atomic write leaves no temporary file", names)
	}
	if got := diskNames(t, filepath.Join(root, store.RunsDir, store.SessionsDir)); len(got) != 1 {
		t.Errorf("session bindings: %v; want one", got)
	}
	if _, err := os.Stat(filepath.Join(root, "spaces")); !os.IsNotExist(err) {
		t.Errorf("CreateRun made scope directories (they come on first use): %v", err)
	}
}

func TestCreateRunRefusals(t *testing.T) {
	dir := t.TempDir()
	root := sharedRoot(t, dir, volID)
	data := filepath.Join(dir, "data")
	cfg := sharedCfg(root, data)
	first := createRun(t, cfg, spec("run-1", "alice"))
	mkdir(t, filepath.Join(data, store.LegacyRunsDir, "old-1"))

	again, err := store.CreateRun(context.Background(), cfg, spec("run-1", "alice"))
	if err != nil || *again != *first {
		t.Errorf("creating the same run again (a platform retry) = %+v, %v; want the first binding", again, err)
	}
	tests := []struct {
		name string
		spec store.RunSpec
		want policy.Code
	}{
		{"a run id already bound to another user", spec("run-1", "bob"), policy.Exists},
		{"a run id already bound to another session", store.RunSpec{Space: "sp", Agent: "ag", Session: "other", Run: "run-1", User: "alice"}, policy.Exists},
		{"a run id a legacy run has", spec("old-1", "alice"), policy.Exists},
		{"an invalid run id", spec("../x", "alice"), policy.InvalidInput},
		{"an invalid session id", store.RunSpec{Space: "sp", Agent: "ag", Session: "a/b", Run: "r", User: "alice"}, policy.InvalidInput},
		{"no user", spec("run-2", ""), policy.InvalidInput},
		{"a user with a control character", spec("run-2", "al\nice"), policy.InvalidInput},
		{"a user over 256 bytes", spec("run-2", strings.Repeat("u", 257)), policy.InvalidInput},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := treeOf(t, dir)
			_, err := store.CreateRun(context.Background(), cfg, tc.spec)
			codeIs(t, "CreateRun", err, tc.want)
			if got := treeOf(t, dir); got != before {
				t.Errorf("a refused CreateRun changed the tree:\nbefore\n%s\nafter\n%s", before, got)
			}
		})
	}
}

// TestSessionBoundToOneVolume: a session's first run binds it to its
// volume; a run of that session on another volume is refused, naming both
// (SPEC §2.2). Here the other volume is the same tree relabelled, as after
// copying a volume: the only way a session's record can be seen from
// another volume.
func TestSessionBoundToOneVolume(t *testing.T) {
	dir := t.TempDir()
	root := sharedRoot(t, dir, volID)
	cfg := sharedCfg(root, filepath.Join(dir, "data"))
	createRun(t, cfg, spec("run-1", "alice"))
	createRun(t, cfg, spec("run-2", "alice")) // same session, same volume: fine

	mkfile(t, filepath.Join(root, store.VolumeMarker), "vol-copy")
	other := cfg
	other.VolumeID = "vol-copy"
	before := treeOf(t, dir)
	_, err := store.CreateRun(context.Background(), other, spec("run-3", "alice"))
	codeIs(t, "a run of the session on another volume", err, policy.VolumeUnavailable)
	if err != nil && (!strings.Contains(err.Error(), volID) || !strings.Contains(err.Error(), "vol-copy")) {
		t.Errorf("message %q does not name both volumes", err)
	}
	if got := treeOf(t, dir); got != before {
		t.Errorf("the refused run was recorded:\nbefore\n%s\nafter\n%s", before, got)
	}
	// Another session is free to start on the new volume.
	createRun(t, other, store.RunSpec{Space: "sp", Agent: "ag", Session: "fresh", Run: "run-4", User: "alice"})

	// A session started on the local backend can't move to a shared one
	// either.
	local := store.Config{Backend: store.BackendLocal, Root: filepath.Join(dir, "local"), DataDir: filepath.Join(dir, "data")}
	b := createRun(t, local, store.RunSpec{Space: "sp", Agent: "ag", Session: "l", Run: "run-5", User: "alice"})
	if b.Backend != store.BackendLocal || b.VolumeID != "" {
		t.Errorf("local binding records %q %q; the local backend has no volume id", b.Backend, b.VolumeID)
	}
	mkfile(t, filepath.Join(local.Root, store.VolumeMarker), volID)
	asShared := sharedCfg(local.Root, local.DataDir)
	_, err = store.CreateRun(context.Background(), asShared, store.RunSpec{Space: "sp", Agent: "ag", Session: "l", Run: "run-6", User: "alice"})
	codeIs(t, "a local session's run on a shared volume", err, policy.VolumeUnavailable)
}

// TestResumeUsesBinding: resuming a run uses its recorded volume and
// layout, not today's configuration, which only says where this node sees
// the volume (SPEC §2.3).
func TestResumeUsesBinding(t *testing.T) {
	dir := t.TempDir()
	root := sharedRoot(t, dir, volID)
	cfg := sharedCfg(root, filepath.Join(dir, "data"))
	created := createRun(t, cfg, spec("run-1", "alice"))
	write(t, openMain(t, resume(t, cfg, "run-1")), "f.txt", "written at creation")

	// Another mount path of the same volume, another data directory that
	// even holds a legacy directory of the same run id.
	otherPath := filepath.Join(dir, "mnt-b")
	symlink(t, root, otherPath)
	otherData := filepath.Join(dir, "data-b")
	mkfile(t, filepath.Join(otherData, store.LegacyRunsDir, "run-1", "f.txt"), "legacy decoy")
	moved := sharedCfg(otherPath, otherData)
	r := resume(t, moved, "run-1")
	if r.Legacy() || *r.Binding() != *created {
		t.Fatalf("resumed binding %+v (legacy %v); want the recorded %+v", r.Binding(), r.Legacy(), created)
	}
	if got := read(t, openMain(t, r), "f.txt"); got != "written at creation" {
		t.Errorf("resumed run reads %q; want the bound volume's file", got)
	}

	bindingFile := filepath.Join(root, store.RunsDir, "run-1.json")
	original, err := os.ReadFile(bindingFile)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		marker  string         // the root's marker during the case
		cfg     store.Config   // this node's configuration
		binding map[string]any // fields rewritten in the binding
		want    policy.Code
		mention []string
	}{
		{name: "configured for another volume id (relabelled root)", marker: "vol-new",
			cfg: store.Config{Backend: store.BackendSharedPOSIX, Root: root, VolumeID: "vol-new"}, want: policy.VolumeUnavailable, mention: []string{volID, "vol-new"}},
		{name: "configured for another volume id (marker still the old one)", marker: volID,
			cfg: store.Config{Backend: store.BackendSharedPOSIX, Root: root, VolumeID: "vol-new"}, want: policy.VolumeUnavailable, mention: []string{volID, "vol-new"}},
		{name: "configured for the local backend on the same directory", marker: volID,
			cfg: store.Config{Backend: store.BackendLocal, Root: root, DataDir: otherData}, want: policy.VolumeUnavailable, mention: []string{volID, "local"}},
		{name: "recorded layout version this loomfs does not serve", marker: volID, cfg: cfg,
			binding: map[string]any{"layout_version": store.LayoutVersion + 1}, want: policy.Unsupported, mention: []string{"layout version 2"}},
		{name: "recorded on another volume id", marker: volID, cfg: cfg,
			binding: map[string]any{"volume_id": "vol-elsewhere"}, want: policy.VolumeUnavailable, mention: []string{"vol-elsewhere", volID}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mkfile(t, filepath.Join(root, store.VolumeMarker), tc.marker)
			t.Cleanup(func() { mkfile(t, filepath.Join(root, store.VolumeMarker), volID) })
			if tc.binding != nil {
				var m map[string]any
				json.Unmarshal(original, &m)
				for k, v := range tc.binding {
					m[k] = v
				}
				b, _ := json.Marshal(m)
				mkfile(t, bindingFile, string(b))
				t.Cleanup(func() { mkfile(t, bindingFile, string(original)) })
			}
			before := treeOf(t, dir)
			r, err := store.ResumeRun(context.Background(), tc.cfg, "run-1")
			if err == nil {
				r.Close()
			}
			codeIs(t, "ResumeRun", err, tc.want)
			for _, m := range tc.mention {
				if err != nil && !strings.Contains(err.Error(), m) {
					t.Errorf("message %q does not mention %q", err, m)
				}
			}
			if got := treeOf(t, dir); got != before {
				t.Errorf("a refused resume changed the tree:\nbefore\n%s\nafter\n%s", before, got)
			}
		})
	}
}

// TestLegacyRun: a run created before bindings (no record) keeps using
// data/runs/<run_id>, whose files are neither moved nor added to by
// loomfs (SPEC §2.3).
func TestLegacyRun(t *testing.T) {
	for _, backend := range []string{store.BackendLocal, store.BackendSharedPOSIX} {
		t.Run(backend, func(t *testing.T) {
			dir := t.TempDir()
			data := filepath.Join(dir, "data")
			cfg := store.Config{Backend: backend, Root: filepath.Join(dir, "local"), DataDir: data}
			if backend == store.BackendSharedPOSIX {
				cfg = sharedCfg(sharedRoot(t, dir, volID), data)
			}
			legacy := filepath.Join(data, store.LegacyRunsDir, "old-1")
			mkfile(t, filepath.Join(legacy, "notes.md"), "from the old days")
			mkfile(t, filepath.Join(legacy, "subagents", "kept.txt"), "no reserved names in a legacy run")
			runsBefore := diskNames(t, filepath.Join(data, store.LegacyRunsDir))

			r := resume(t, cfg, "old-1")
			if !r.Legacy() || r.Binding() != nil {
				t.Fatalf("run without a record: Legacy %v, Binding %+v", r.Legacy(), r.Binding())
			}
			ws := openMain(t, r)
			if got := read(t, ws, "notes.md"); got != "from the old days" {
				t.Errorf("read %q", got)
			}
			if got := read(t, ws, "subagents/kept.txt"); got != "no reserved names in a legacy run" {
				t.Errorf("read %q", got)
			}
			unlock, err := ws.Lock(context.Background())
			if err != nil {
				t.Fatalf("lock a legacy run: %v", err)
			}
			write(t, ws, "new.md", "written after the upgrade")
			unlock()
			if b, err := os.ReadFile(filepath.Join(legacy, "new.md")); err != nil || string(b) != "written after the upgrade" {
				t.Errorf("the write did not land in data/runs/old-1: %q %v", b, err)
			}
			if got := diskNames(t, legacy); !slices.Equal(got, []string{"new.md", "notes.md", "subagents"}) {
				t.Errorf("data/runs/old-1 holds %v; loomfs adds nothing of its own to it", got)
			}
			if got := diskNames(t, filepath.Join(data, store.LegacyRunsDir)); !slices.Equal(got, runsBefore) {
				t.Errorf("data/runs holds %v, was %v", got, runsBefore)
			}
			if _, err := os.Stat(filepath.Join(cfg.Root, store.RunsDir, "old-1.json")); !os.IsNotExist(err) {
				t.Errorf("a legacy run was silently given a binding: %v", err)
			}
			_, err = r.Instance(context.Background(), "sub-1", nil)
			codeIs(t, "Instance of a legacy run", err, policy.Unsupported)
		})
	}
}

func TestResumeRefusals(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	cfg := sharedCfg(sharedRoot(t, dir, volID), data)
	mkfile(t, filepath.Join(dir, "outside", "secret"), "x")
	mkdir(t, filepath.Join(data, store.LegacyRunsDir))
	symlink(t, filepath.Join(dir, "outside"), filepath.Join(data, store.LegacyRunsDir, "linked"))
	mkfile(t, filepath.Join(data, store.LegacyRunsDir, "afile"), "x")
	mkfile(t, filepath.Join(cfg.Root, store.RunsDir, "garbled.json"), "{not json")
	symlink(t, filepath.Join(dir, "outside", "secret"), filepath.Join(cfg.Root, store.RunsDir, "planted.json"))

	tests := []struct {
		name, run string
		want      policy.Code
	}{
		{"a run with neither binding nor legacy directory", "nope", policy.NotFound},
		{"an invalid run id", "../../etc", policy.InvalidInput},
		{"a legacy run that is a symlink", "linked", policy.NotDir},
		{"a legacy run that is a file", "afile", policy.NotDir},
		{"a garbled binding", "garbled", policy.Internal},
		{"a binding that is a symlink", "planted", policy.SymlinkRefused},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := store.ResumeRun(context.Background(), cfg, tc.run)
			if err == nil {
				r.Close()
			}
			codeIs(t, "ResumeRun", err, tc.want)
		})
	}
}

// TestEntryPointsVolumeUnavailable: with the shared root missing, or its
// marker missing, empty or different, every entry point refuses with
// volume_unavailable (creating a run, resuming one, reading artifacts,
// touching instance files, taking the lock writes and commands hold) and
// nothing is created anywhere: not on the volume, not in the data
// directory (SPEC §2.2). Handles opened while the volume was good are
// refused too.
func TestEntryPointsVolumeUnavailable(t *testing.T) {
	states := []struct {
		name     string
		breakVol func(t *testing.T, root string)
	}{
		{"root missing", func(t *testing.T, root string) {
			if err := os.Rename(root, root+".unmounted"); err != nil {
				t.Fatal(err)
			}
		}},
		{"marker missing", func(t *testing.T, root string) {
			if err := os.Remove(filepath.Join(root, store.VolumeMarker)); err != nil {
				t.Fatal(err)
			}
		}},
		{"marker empty", func(t *testing.T, root string) { mkfile(t, filepath.Join(root, store.VolumeMarker), "") }},
		{"marker different", func(t *testing.T, root string) { mkfile(t, filepath.Join(root, store.VolumeMarker), "vol-other") }},
	}
	for _, st := range states {
		t.Run(st.name, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			root := sharedRoot(t, dir, volID)
			data := filepath.Join(dir, "data")
			cfg := sharedCfg(root, data)
			createRun(t, cfg, spec("run-1", "alice"))
			r := resume(t, cfg, "run-1")
			main := openMain(t, r)
			write(t, main, "a.txt", "x")
			write(t, openInstance(t, r, "sub-1"), "b.txt", "y")
			// A legacy run: with the volume gone, loomfs can't tell whether
			// a run has a binding, so this must not be used instead.
			mkfile(t, filepath.Join(data, store.LegacyRunsDir, "old-1", "f"), "z")

			st.breakVol(t, root)
			before := treeOf(t, dir)
			entry := []struct {
				name string
				call func() error
			}{
				{"CreateRun", func() error { _, err := store.CreateRun(ctx, cfg, spec("run-2", "alice")); return err }},
				{"CreateRun of a new session", func() error {
					_, err := store.CreateRun(ctx, cfg, store.RunSpec{Space: "s2", Agent: "a2", Session: "n", Run: "run-3", User: "alice"})
					return err
				}},
				{"ResumeRun", func() error { _, err := store.ResumeRun(ctx, cfg, "run-1"); return err }},
				{"ResumeRun of a legacy run", func() error { _, err := store.ResumeRun(ctx, cfg, "old-1"); return err }},
				{"ResumeRun of an unknown run", func() error { _, err := store.ResumeRun(ctx, cfg, "nope"); return err }},
				{"Artifacts", func() error { _, err := r.Artifacts(ctx, "alice", nil); return err }},
				{"OpenArtifact", func() error { _, err := r.OpenArtifact(ctx, "alice", "a.txt", nil); return err }},
				{"OpenArtifact of a child", func() error { _, err := r.OpenArtifact(ctx, "alice", "subagents/sub-1/b.txt", nil); return err }},
				{"Instance (existing)", func() error { _, err := r.Instance(ctx, "sub-1", nil); return err }},
				{"Instance (new)", func() error { _, err := r.Instance(ctx, "sub-9", nil); return err }},
				{"Main", func() error { _, err := r.Main(ctx, nil); return err }},
				{"Lock (writes and commands)", func() error {
					unlock, err := main.Lock(ctx)
					if err == nil {
						unlock()
					}
					return err
				}},
				{"WriteFile", func() error { _, err := main.WriteFile(ctx, "c.txt", []byte("z"), nil); return err }},
			}
			for _, e := range entry {
				codeIs(t, e.name, e.call(), policy.VolumeUnavailable)
			}
			if got := treeOf(t, dir); got != before {
				t.Errorf("something was created:\nbefore\n%s\nafter\n%s", before, got)
			}
		})
	}
}
