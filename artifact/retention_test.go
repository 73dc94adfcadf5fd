package artifact_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/agentloom/loomfs/retention"
	"github.com/agentloom/loomfs/snapshot"
)

type laterClock struct{ t time.Time }

func (c laterClock) Now() time.Time { return c.t }

// TestReclaimNeedsArchive: under archive_before_reclaim, gc keeps an old
// session and its snapshot, saying why, while the object store has no
// verified archive of them (no store, none archived, a content lost), and
// reclaims them once archiving again has made the archive whole.
func TestReclaimNeedsArchive(t *testing.T) {
	st, raw := openStore(t)
	ctx := context.Background()
	ws := openScope(t, t.TempDir())
	if _, err := ws.WriteFile(ctx, "a.txt", []byte("content of a.txt\n"), nil); err != nil {
		t.Fatal(err)
	}
	m, err := snapshot.Create(ctx, ws, snapshot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ws.Close()
	later := laterClock{time.Now().Add(8 * 24 * time.Hour)}
	var sha string
	steps := []struct {
		name     string
		do       func()
		archives retention.Archives
		kept     string // in every kept item's reason; "" when both are removed
	}{
		{"no object store", nil, nil, "no object store is configured"},
		{"never archived", nil, st, "missing: loomfs snapshot archive --scope sp/ag/se --id " + m.ID},
		{"a content lost", func() {
			a, _, err := st.ArchiveSnapshot(ctx, ws.Volume(), archivedScope, "")
			if err != nil {
				t.Fatal(err)
			}
			sha = a.Entries[0].SHA256
			bucket, key := st.Config().Bucket, st.Config().Prefix+"blobs/"+sha[:2]+"/"+sha
			if _, err := raw.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &bucket, Key: &key}); err != nil {
				t.Fatal(err)
			}
		}, st, "unverified"},
		{"archived again, whole", func() {
			if _, sent, err := st.ArchiveSnapshot(ctx, ws.Volume(), archivedScope, ""); err != nil || sent.Blobs != 1 {
				t.Fatalf("archiving again: %+v, %v; want the lost content sent", sent, err)
			}
		}, st, ""},
	}
	for _, s := range steps {
		if s.do != nil {
			s.do()
		}
		rep, err := retention.Collect(ctx, ws.Volume(), retention.Options{Clock: later, ArchiveFirst: true, Archives: s.archives})
		if err != nil || len(rep.Errors) > 0 {
			t.Fatalf("%s: gc: %v %v", s.name, err, rep.Errors)
		}
		if s.kept == "" {
			if len(rep.Kept) != 0 || countKind(rep.Removed, retention.KindSession) != 1 || countKind(rep.Removed, retention.KindSnapshot) != 1 {
				t.Fatalf("%s: removed %+v, kept %+v; want the session and the snapshot removed", s.name, rep.Removed, rep.Kept)
			}
			continue
		}
		if len(rep.Kept) != 2 || countKind(rep.Removed, retention.KindSession)+countKind(rep.Removed, retention.KindSnapshot) != 0 {
			t.Fatalf("%s: removed %+v, kept %+v; want the session and the snapshot kept", s.name, rep.Removed, rep.Kept)
		}
		for _, it := range rep.Kept {
			if !strings.Contains(it.Reason, s.kept) || (sha != "" && s.kept == "unverified" && !strings.Contains(it.Reason, sha)) {
				t.Fatalf("%s: kept %s for %q; want a reason saying %q", s.name, it.Kind, it.Reason, s.kept)
			}
		}
	}
}

func countKind(items []retention.Item, kind string) int {
	n := 0
	for _, it := range items {
		if it.Kind == kind {
			n++
		}
	}
	return n
}
