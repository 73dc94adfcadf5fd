package retention

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/snapshot"
	"github.com/agentloom/loomfs/store"
)

// Archives says whether a snapshot has a whole copy off the volume, so
// that reclaiming it loses nothing (package artifact's Store, on an S3
// object store, is one).
type Archives interface {
	// VerifyArchive returns nil if snapshot id of sc is archived and every
	// content it names is there; an error says what is missing (a
	// not_found one: the snapshot was never archived).
	VerifyArchive(ctx context.Context, sc store.Scope, id string) error
}

// archiveReason says why snapshot id of sc must be kept under
// archive_before_reclaim, or "" if its archive is verified.
func (g *collector) archiveReason(ctx context.Context, sc store.Scope, id string) string {
	if !g.opt.ArchiveFirst {
		return ""
	}
	if g.opt.Archives == nil {
		return "archive required (archive_before_reclaim) but no object store is configured"
	}
	err := g.opt.Archives.VerifyArchive(ctx, sc, id)
	switch {
	case err == nil:
		return ""
	case policy.CodeOf(err) == policy.NotFound:
		return fmt.Sprintf("archive required (archive_before_reclaim) but missing: loomfs snapshot archive --scope %s --id %s", sc, id)
	default:
		return "archive required (archive_before_reclaim) but unverified: " + strings.ReplaceAll(err.Error(), "\n", " ")
	}
}

// sessionArchiveReason says why session s, last changed at last, must be
// kept under archive_before_reclaim: each of its scopes (main and every
// run's children) needs a snapshot taken since that change, archived and
// verified.
func (g *collector) sessionArchiveReason(ctx context.Context, s store.Session, last time.Time) string {
	if !g.opt.ArchiveFirst {
		return ""
	}
	for _, sc := range s.Scopes() {
		newest := ""
		if repo, err := snapshot.OpenRepo(g.vol, sc, false); err == nil {
			ms, err := repo.List()
			repo.Close()
			if err == nil && len(ms) > 0 && !ms[len(ms)-1].Created.Before(last) {
				newest = ms[len(ms)-1].ID
			}
		}
		if newest == "" {
			return fmt.Sprintf("archive required (archive_before_reclaim) but scope %s changed after its last snapshot: loomfs snapshot create --scope %s, then loomfs snapshot archive", sc, sc)
		}
		if why := g.archiveReason(ctx, sc, newest); why != "" {
			return why
		}
	}
	return ""
}
