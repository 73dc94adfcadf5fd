package artifact_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/agentloom/loomfs/artifact"
	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/snapshot"
	"github.com/agentloom/loomfs/store"
)

// A platform that embeds loomfs publishes a finished run from its
// end-of-run snapshots, serves its files to the user who started it, and
// archives a scope's snapshot off the volume. The store's address comes
// from AGENT_LOOM_S3_*, its credentials from the AWS SDK's chain.
func Example() {
	ctx := context.Background()
	cfg, err := artifact.ConfigFromEnv()
	if err != nil {
		log.Fatal(err)
	}
	st, err := artifact.Open(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}

	vcfg := store.Config{Backend: "shared_posix", Root: "/mnt/loom", VolumeID: "team-v1"}
	r, err := store.ResumeRun(ctx, vcfg, "r-42")
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()
	ws, err := r.Main(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer ws.Close()
	end, err := snapshot.Create(ctx, ws, snapshot.Options{Run: "r-42", Label: "end of run r-42"})
	if err != nil {
		log.Fatal(err)
	}
	heads, _ := audit.Heads(audit.Dir(r.Volume().Path()), time.Now())
	m, sent, err := st.Publish(ctx, r, []*snapshot.Manifest{end}, artifact.PublishOptions{Audit: &heads})
	if err != nil {
		log.Fatal(err) // nothing half-published: publishing again resumes
	}
	fmt.Printf("published %d files, sent %d new contents\n", len(m.Files), sent.Blobs)

	// Only alice, who started the run, reads it back, at most 2 MiB a file.
	if _, b, err := st.Get(ctx, "r-42", "alice", "output/report.md"); err == nil {
		fmt.Printf("%s", b)
	}

	// The scope's newest snapshot, off the volume; RestoreArchive brings
	// it back on any volume.
	if _, sent, err := st.ArchiveSnapshot(ctx, ws.Volume(), ws.Scope(), ""); err == nil {
		fmt.Printf("archived, %d contents sent\n", sent.Blobs)
	}
}
