package retention_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/retention"
	"github.com/agentloom/loomfs/store"
)

// Reclaim takes low-priority work first (seed 001 §5.3): a session is as
// high as the highest of its runs, one with no run is the policy's
// default, and within a class the oldest goes first. The dry run lists
// that order.
func TestCollectByPriority(t *testing.T) {
	ctx := context.Background()
	v := newVolume(t)
	run := func(session, id string, p policy.Priority) {
		t.Helper()
		_, err := store.CreateRun(ctx, store.Config{Root: v.root}, store.RunSpec{Space: "sp", Agent: "ag", Session: session, Run: id, User: "u", Priority: p})
		if err != nil {
			t.Fatal(err)
		}
	}
	// Made oldest first: ages alone would put "high" first.
	for _, s := range []struct {
		session string
		runs    map[string]policy.Priority
	}{
		{"high", map[string]policy.Priority{"r-h1": policy.PriorityLow, "r-h2": policy.PriorityHigh}},
		{"low-old", map[string]policy.Priority{"r-lo1": policy.PriorityLow}},
		{"default", nil},
		{"normal", map[string]policy.Priority{"r-n1": ""}},
		{"low-new", map[string]policy.Priority{"r-lo2": policy.PriorityLow}},
	} {
		for id, p := range s.runs {
			run(s.session, id, p)
		}
		v.open(t, "sp/ag/"+s.session)
		time.Sleep(20 * time.Millisecond) // distinct change times
	}
	later := fakeClock{time.Now().Add(8 * 24 * time.Hour)}
	var progress bytes.Buffer
	rep, err := retention.Collect(ctx, v.vol, retention.Options{DryRun: true, Clock: later, Progress: &progress})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, it := range rep.Removed {
		if it.Kind == retention.KindSession {
			got = append(got, strings.TrimPrefix(it.Scope, "sp/ag/")+":"+string(it.Priority))
		}
	}
	want := "low-old:low low-new:low default:normal normal:normal high:high"
	if strings.Join(got, " ") != want {
		t.Fatalf("dry-run order %v, want %s", got, want)
	}
	// The policy's default class applies to a session with no run and to
	// a run recorded without a class.
	rep, err = retention.Collect(ctx, v.vol, retention.Options{DryRun: true, Clock: later, Priority: policy.PriorityLow})
	if err != nil {
		t.Fatal(err)
	}
	got = got[:0]
	for _, it := range rep.Removed {
		if it.Kind == retention.KindSession {
			got = append(got, strings.TrimPrefix(it.Scope, "sp/ag/")+":"+string(it.Priority))
		}
	}
	want = "low-old:low default:low normal:low low-new:low high:high"
	if strings.Join(got, " ") != want {
		t.Fatalf("dry-run order with a low default %v, want %s", got, want)
	}
	for _, s := range []string{"high", "low-old", "default", "normal", "low-new"} {
		if !v.exists(t, "sp/ag/"+s) {
			t.Errorf("the dry run removed %s", s)
		}
	}
}
