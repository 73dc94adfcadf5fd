package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/agentloom/loomfs/policy"
)

// RuntimeReport is what `loomfs check` says about the sandbox runtime.
type RuntimeReport struct {
	OK bool `json:"ok"`
	// Runtime is the configured runtime (AGENT_LOOM_SANDBOX_RUNTIME); ""
	// means the engine's default, named in EngineDefault.
	Runtime       string   `json:"runtime"`
	EngineDefault string   `json:"engine_default,omitempty"`
	EngineRuntime []string `json:"engine_runtimes,omitempty"`
	// Known says whether the engine has the configured runtime registered.
	Known bool `json:"known"`
	// Probed says whether a probe container was run; ProbeOK whether it
	// started and exited 0 under the runtime.
	Probed  bool `json:"probed"`
	ProbeOK bool `json:"probe_ok"`
	// Message is the engine's or the runtime's own answer when something
	// failed, host paths masked.
	Message string `json:"message,omitempty"`
}

// CheckRuntime asks the engine whether it knows cfg's runtime and, with
// probe, runs `true` in a container under it with the whole sandbox
// posture over an empty scratch workspace, so a runtime that can't start
// containers (gVisor without --network=none) shows before any command does.
func CheckRuntime(ctx context.Context, cfg Config, probe bool) RuntimeReport {
	rep := RuntimeReport{Runtime: cfg.Runtime}
	r, err := NewRunner(ctx, cfg)
	if err != nil {
		rep.Message = policy.MaskHostPaths(err.Error())
		return rep
	}
	defer r.Close()
	info, err := r.cli.Info(ctx)
	if err != nil {
		rep.Message = policy.MaskHostPaths(fmt.Sprintf("engine info: %v", err))
		return rep
	}
	rep.EngineDefault = info.DefaultRuntime
	for name := range info.Runtimes {
		rep.EngineRuntime = append(rep.EngineRuntime, name)
	}
	slices.Sort(rep.EngineRuntime)
	want := cfg.Runtime
	if want == "" {
		want = info.DefaultRuntime
	}
	if rep.Known = slices.Contains(rep.EngineRuntime, want); !rep.Known {
		rep.Message = fmt.Sprintf("the engine has no runtime %q (it has %s): register it in the engine's daemon.json and reload the engine (see DEPLOY.md)",
			want, strings.Join(rep.EngineRuntime, ", "))
		return rep
	}
	if !probe {
		rep.OK = true
		return rep
	}
	rep.Probed = true
	if err := r.probe(ctx); err != nil {
		rep.Message = policy.MaskHostPaths(err.Error())
		return rep
	}
	rep.ProbeOK, rep.OK = true, true
	return rep
}

// probe runs `true` through Run over a scratch directory, with a marker
// kept in memory: the probe container belongs to no scope.
func (r *Runner) probe(ctx context.Context) error {
	ws, err := os.MkdirTemp("", "loomfs-probe-")
	if err != nil {
		return fmt.Errorf("probe workspace: %w", err)
	}
	defer os.RemoveAll(ws)
	if err := os.Chmod(ws, 0o777); err != nil {
		return fmt.Errorf("probe workspace: %w", err)
	}
	var b [8]byte
	rand.Read(b[:])
	hash := "probe" + hex.EncodeToString(b[:])
	res, err := r.Run(ctx, Request{
		Command: "true", Timeout: 30 * time.Second, Workspace: ws,
		Scope: "loomfs-check-probe", ScopeHash: hash, Run: "check", Call: "probe",
		Marker: memMarker{},
	})
	if err != nil {
		if res.ContainerID != "" {
			time.Sleep(holderGrace)
			if left, _ := Holders("", 0, res.ContainerID); len(left) > 0 {
				err = fmt.Errorf("%w; the runtime left processes of the probe container behind: %s (stop them)", err, holderNames(left))
			}
		}
		return err
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("the probe container exited %d (stderr %q)", res.ExitCode, res.Stderr)
	}
	return nil
}

// memMarker keeps no marker: nothing of a probe outlives the check.
type memMarker struct{}

func (memMarker) Set(context.Context, Marker) error { return nil }
func (memMarker) Clear(context.Context) error       { return nil }
