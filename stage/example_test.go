package stage_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/retention"
	"github.com/agentloom/loomfs/snapshot"
	"github.com/agentloom/loomfs/stage"
	"github.com/agentloom/loomfs/store"
	"github.com/agentloom/loomfs/tools"
)

// The lifecycle of one task in the standard layout, as a platform written
// in Go runs it: create the run, open its workspace (which lays out src/,
// data/, output/, logs/, tmp/ and .meta/), stage the inputs into data/ and
// the task into .meta/, let the agent work through the tools, collect
// output/, and finish the run with a snapshot.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "loomfs-example-")
	defer os.RemoveAll(dir)
	cfg := store.Config{Root: filepath.Join(dir, "volume")}

	// 1. Create the run: its binding fixes the volume, layout and scope.
	if _, err := store.CreateRun(ctx, cfg, store.RunSpec{Space: "acme", Agent: "coder", Session: "s1", Run: "r-42", User: "alice"}); err != nil {
		log.Fatal(err)
	}
	run, err := store.ResumeRun(ctx, cfg, "r-42")
	if err != nil {
		log.Fatal(err)
	}
	defer run.Close()
	pol, _ := policy.Preset("standard")
	ws, err := run.Main(ctx, pol) // makes the layout's directories
	if err != nil {
		log.Fatal(err)
	}
	defer ws.Close()
	auditLog, err := audit.Open(run.Volume().Path(), audit.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer auditLog.Close()
	scopeActor := audit.Actor{Space: "acme", Agent: "coder", Session: "s1", Run: "r-42"}
	platformActor := scopeActor
	platformActor.Operator = "scheduler"
	platform := &stage.Platform{WS: ws, Audit: auditLog, Actor: platformActor}
	if err := platform.RecordLayout(ctx); err != nil {
		log.Fatal(err)
	}

	// 2. Stage the inputs into read-only data/, and the task into hidden
	// .meta/ (here as a tar stream).
	inputs := filepath.Join(dir, "inputs")
	os.Mkdir(inputs, 0o700)
	os.WriteFile(filepath.Join(inputs, "numbers.txt"), []byte("1\n2\n"), 0o600)
	res, err := platform.Stage(ctx, "data", stage.Path(inputs))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("staged:", res.Staged[0].Path, "refused:", len(res.Refused))
	var task bytes.Buffer
	tw := tar.NewWriter(&task)
	tw.WriteHeader(&tar.Header{Name: "task.json", Mode: 0o600, Size: 15})
	tw.Write([]byte(`{"goal":"sum"}` + "\n"))
	tw.Close()
	if _, err := platform.Stage(ctx, ".meta", stage.Tar("task", &task)); err != nil {
		log.Fatal(err)
	}

	// 3. The agent works through the tools (workspace_command would run
	// it in a sandbox container over the same policy).
	agent := &tools.Toolbox{WS: ws, Audit: auditLog, Actor: scopeActor}
	read, _ := agent.Call(ctx, tools.Read, "call-1", json.RawMessage(`{"path":"data/numbers.txt"}`))
	var r struct{ Content string }
	json.Unmarshal(read, &r)
	fmt.Printf("agent reads data/numbers.txt: %q\n", r.Content)
	_, err = agent.Call(ctx, tools.Write, "call-2", json.RawMessage(`{"path":"data/numbers.txt","content":"9\n"}`))
	fmt.Println("agent writes data/:", policy.CodeOf(err))
	_, err = agent.Call(ctx, tools.Read, "call-3", json.RawMessage(`{"path":".meta/task.json"}`))
	fmt.Println("agent reads .meta/:", policy.CodeOf(err))
	agent.Call(ctx, tools.Write, "call-4", json.RawMessage(`{"path":"output/report/sum.txt","content":"3\n"}`))

	// 4. Collect output/ (write-only for the agent) into a directory.
	dest, _ := stage.ToDir(filepath.Join(dir, "results"))
	got, err := platform.Collect(ctx, "output", dest)
	dest.Close()
	if err != nil {
		log.Fatal(err)
	}
	sum, _ := os.ReadFile(filepath.Join(dir, "results", "report", "sum.txt"))
	fmt.Printf("collected %s: %q\n", got.Collected[0].Path, sum)

	// 5. Finish the run: clear tmp/, snapshot the workspace.
	unlock, err := ws.Lock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	retention.ClearTemporary(ctx, ws, retention.ClearOptions{Locked: true})
	m, err := snapshot.Create(ctx, ws, snapshot.Options{Run: "r-42", Label: "end of run r-42", Locked: true})
	unlock()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("snapshot of run", m.Run, "holds", m.Files, "files")
	// Output:
	// staged: data/numbers.txt refused: 0
	// agent reads data/numbers.txt: "1\n2\n"
	// agent writes data/: read_only
	// agent reads .meta/: not_found
	// collected report/sum.txt: "3\n"
	// snapshot of run r-42 holds 3 files
}
