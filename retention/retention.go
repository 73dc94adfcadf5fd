// Package retention reclaims what a volume no longer needs (SPEC §6): the
// temporary subtrees of a scope at the end of a run, and sessions and
// snapshots older than a number of days unless pinned. It never touches a
// scope while a command runs there, its lock is held, or it is
// quarantined; a dry run removes nothing.
package retention

import (
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/snapshot"
	"github.com/agentloom/loomfs/store"
)

// DefaultMaxAge is how long sessions and snapshots are kept by default.
const DefaultMaxAge = 7 * 24 * time.Hour

// Clock tells the time ages are measured against.
type Clock interface{ Now() time.Time }

// SystemClock is the real clock.
type SystemClock struct{}

// Now returns the current time.
func (SystemClock) Now() time.Time { return time.Now() }

// Options say what Collect reclaims and how it reports.
type Options struct {
	MaxAge   time.Duration // default DefaultMaxAge
	DryRun   bool          // list what would be removed, remove nothing
	Clock    Clock         // default SystemClock
	Progress io.Writer     // lines about a long run; nil: none
	// Priority is the class of a session none of whose runs records one
	// (policy.Policy.Class); "" is normal. Sessions are reclaimed low
	// first, then by age.
	Priority policy.Priority
	// ArchiveFirst (the policy's archive_before_reclaim) keeps every old
	// session and snapshot whose archive in Archives is missing or
	// unverified, saying so; with no Archives it keeps them all.
	ArchiveFirst bool
	Archives     Archives
}

// Item is one session or snapshot Collect removed, would remove, or kept
// although it is old enough.
type Item struct {
	Kind     string    `json:"kind"` // KindSession, KindSnapshot, KindTemporary or KindJournal
	Scope    string    `json:"scope"`
	Snapshot string    `json:"snapshot,omitempty"`
	LastUsed time.Time `json:"last_used"`
	// Priority is a session's class, the highest of its runs'.
	Priority policy.Priority `json:"priority,omitempty"`
	Bytes    int64           `json:"bytes"`
	Reason   string          `json:"reason,omitempty"` // why it was kept
}

// Report is what Collect did.
type Report struct {
	DryRun  bool     `json:"dry_run"`
	Removed []Item   `json:"removed"` // or, in a dry run, would remove
	Kept    []Item   `json:"kept"`    // old enough, but pinned or busy
	Freed   int64    `json:"freed_bytes"`
	Errors  []string `json:"errors,omitempty"`
}

// Kinds of Item.
const (
	KindSession  = "session"
	KindSnapshot = "snapshot"
	// KindTemporary counts the leftover temporary files of atomic writes
	// removed from one session (store.Volume.SweepTemporaries).
	KindTemporary = "temporary"
	// KindJournal counts the change journals of ended processes removed
	// from one scope (snapshot.TrimJournals).
	KindJournal = "journal"
)

// Collect reclaims the sessions with no change for opt.MaxAge (their whole
// directory, every run's children included) and the snapshots older than
// that, except pinned ones, those of a scope that is busy and, with
// opt.ArchiveFirst, those with no verified archive. A failure on
// one item is recorded and the run goes on.
func Collect(ctx context.Context, vol *store.Volume, opt Options) (*Report, error) {
	if opt.MaxAge <= 0 {
		opt.MaxAge = DefaultMaxAge
	}
	if opt.Clock == nil {
		opt.Clock = SystemClock{}
	}
	g := &collector{vol: vol, opt: opt, rep: &Report{DryRun: opt.DryRun, Removed: []Item{}, Kept: []Item{}}, cutoff: opt.Clock.Now().Add(-opt.MaxAge)}
	if err := g.sessions(ctx); err != nil {
		return g.rep, err
	}
	if err := g.snapshots(ctx); err != nil {
		return g.rep, err
	}
	return g.rep, nil
}

type collector struct {
	vol    *store.Volume
	opt    Options
	rep    *Report
	cutoff time.Time
	last   time.Time // of the last progress line
}

// progress prints a line at most once a second, and always when final.
func (g *collector) progress(final bool, format string, args ...any) {
	if g.opt.Progress == nil {
		return
	}
	if now := time.Now(); final || now.Sub(g.last) >= time.Second {
		g.last = now
		fmt.Fprintf(g.opt.Progress, "gc: "+format+"\n", args...)
	}
}

func (g *collector) fail(format string, args ...any) {
	g.rep.Errors = append(g.rep.Errors, fmt.Sprintf(format, args...))
}

// sessions reclaims the sessions old enough, in priority order (low
// first, then the oldest first; a dry run lists them in that order), so
// that high-priority work is the last to lose anything.
func (g *collector) sessions(ctx context.Context) error {
	ss, err := g.vol.Sessions(ctx)
	if err != nil {
		return err
	}
	classes, err := g.vol.SessionPriorities(ctx, g.opt.Priority.Or(policy.PriorityNormal))
	if err != nil {
		return err
	}
	var old []candidate
	for i, s := range ss {
		if ctx.Err() != nil {
			return policy.Errorf(policy.Cancelled, "gc cancelled after %d of %d sessions", i, len(ss))
		}
		g.progress(false, "sessions: %d of %d checked, %d old enough", i, len(ss), len(old))
		last, err := g.age(ctx, s)
		if err != nil {
			g.fail("session %s: %v", s.Main, err)
			continue
		}
		if last.Before(g.cutoff) {
			c, ok := classes[s.Main]
			if !ok {
				c = g.opt.Priority.Or(policy.PriorityNormal)
			}
			old = append(old, candidate{s, c, last})
		}
	}
	sort.SliceStable(old, func(i, j int) bool {
		a, b := old[i], old[j]
		if a.class.Rank() != b.class.Rank() {
			return a.class.Rank() < b.class.Rank()
		}
		return a.last.Before(b.last)
	})
	for i, c := range old {
		if ctx.Err() != nil {
			return policy.Errorf(policy.Cancelled, "gc cancelled after %d of %d old sessions", i, len(old))
		}
		if err := g.session(ctx, c); err != nil {
			g.fail("session %s: %v", c.s.Main, err)
		}
	}
	g.progress(true, "sessions: %d checked, %d %s", len(ss), countKind(g.rep.Removed, KindSession), removed(g.opt.DryRun))
	return nil
}

// tempAge is how old a leftover temporary file must be to be removed: an
// atomic write holds its temporary file for the time of one write.
const tempAge = time.Hour

// candidate is a session old enough to be reclaimed.
type candidate struct {
	s     store.Session
	class policy.Priority
	last  time.Time
}

// age sweeps a session's leftover temporary files and ended journals and
// returns when it last changed.
func (g *collector) age(ctx context.Context, s store.Session) (time.Time, error) {
	if n, b, err := g.vol.SweepTemporaries(ctx, s, g.opt.Clock.Now().Add(-tempAge), g.opt.DryRun); err != nil {
		g.fail("session %s: leftover temporary files: %v", s.Main, err)
	} else if n > 0 {
		g.rep.Removed = append(g.rep.Removed, Item{Kind: KindTemporary, Scope: s.Main.String(), Bytes: b, Reason: fmt.Sprintf("%d leftover temporary files of interrupted writes", n)})
		g.rep.Freed += b
	}
	for _, sc := range s.Scopes() {
		g.journals(sc)
	}
	return g.vol.LastChange(ctx, s, func(n int) { g.progress(false, "session %s: %d entries walked", s.Main, n) })
}

// session reclaims one old session unless it is pinned or busy.
func (g *collector) session(ctx context.Context, c candidate) error {
	s := c.s
	item := Item{Kind: KindSession, Scope: s.Main.String(), LastUsed: c.last.UTC(), Priority: c.class}
	if p, err := isPinned(g.vol, s.Main, ""); err != nil || p {
		item.Reason = "pinned"
		if err != nil {
			item.Reason = err.Error()
		}
		g.rep.Kept = append(g.rep.Kept, item)
		return nil
	}
	unlock, why := g.lockAll(s.Scopes())
	if why != "" {
		item.Reason = why
		g.rep.Kept = append(g.rep.Kept, item)
		return nil
	}
	defer unlock()
	// Under the locks nothing can change the session through loomfs:
	// look again, so a change made while we were getting them counts.
	last, err := g.vol.LastChange(ctx, s, nil)
	if err != nil {
		return err
	}
	if !last.Before(g.cutoff) {
		return nil
	}
	item.LastUsed = last.UTC()
	if why := g.sessionArchiveReason(ctx, s, last); why != "" {
		item.Reason = why
		g.rep.Kept = append(g.rep.Kept, item)
		return nil
	}
	if g.opt.DryRun {
		g.rep.Removed = append(g.rep.Removed, item)
		return nil
	}
	u, err := g.vol.RemoveSession(ctx, s)
	item.Bytes = u.Bytes
	g.rep.Freed += u.Bytes
	if err != nil {
		return err
	}
	g.rep.Removed = append(g.rep.Removed, item)
	return nil
}

// journals trims the change journals of scope sc if it is idle now (a
// busy scope is trimmed by a later run).
func (g *collector) journals(sc store.Scope) {
	unlock, ok, err := g.vol.TryLock(sc)
	if err != nil || !ok {
		return
	}
	defer unlock()
	n, err := snapshot.TrimJournals(g.vol, sc, g.opt.DryRun)
	if err != nil {
		g.fail("scope %s: change journals: %v", sc, err)
		return
	}
	if n > 0 {
		g.rep.Removed = append(g.rep.Removed, Item{Kind: KindJournal, Scope: sc.String(), Reason: fmt.Sprintf("%d change journals of ended processes", n)})
	}
}

// lockAll takes every scope's lock without waiting, after checking that
// none runs a command or is quarantined. why says which scope is busy.
func (g *collector) lockAll(scopes []store.Scope) (unlock func(), why string) {
	var unlocks []func()
	release := func() {
		for _, u := range unlocks {
			u()
		}
	}
	for _, sc := range scopes {
		if err := g.vol.CheckIdle(sc); err != nil {
			release()
			return nil, fmt.Sprintf("scope %s is busy: %s", sc, idleReason(err))
		}
		u, ok, err := g.vol.TryLock(sc)
		if err != nil {
			release()
			return nil, fmt.Sprintf("scope %s: %v", sc, err)
		}
		if !ok {
			release()
			return nil, fmt.Sprintf("scope %s is busy: its lock is held", sc)
		}
		unlocks = append(unlocks, u)
		// The marker is written under the lock: look again now we hold it.
		if err := g.vol.CheckIdle(sc); err != nil {
			release()
			return nil, fmt.Sprintf("scope %s is busy: %s", sc, idleReason(err))
		}
	}
	return release, ""
}

func idleReason(err error) string {
	if policy.CodeOf(err) == policy.Quarantined {
		return "quarantined"
	}
	if policy.CodeOf(err) == policy.Conflict {
		if strings.Contains(err.Error(), "session sandbox") {
			return "a session sandbox is running (session marker present)"
		}
		return "a command is running (execution marker present)"
	}
	return err.Error()
}

func (g *collector) snapshots(ctx context.Context) error {
	area, err := g.vol.Area(store.SnapshotsDir, false)
	if policy.CodeOf(err) == policy.NotFound {
		return nil
	}
	if err != nil {
		return err
	}
	defer area.Close()
	hashes, err := area.Readdirnames(-1)
	if err != nil && err != io.EOF {
		return fmt.Errorf("read %s: %w", store.SnapshotsDir, err)
	}
	sort.Strings(hashes)
	before := countKind(g.rep.Removed, KindSnapshot)
	for i, h := range hashes {
		if ctx.Err() != nil {
			return policy.Errorf(policy.Cancelled, "gc cancelled after %d of %d snapshot directories", i, len(hashes))
		}
		g.progress(false, "snapshots: %d of %d scopes checked", i, len(hashes))
		if err := g.scopeSnapshots(ctx, area, h); err != nil {
			g.fail("snapshots of %s: %v", h, err)
		}
	}
	g.progress(true, "snapshots: %d scopes checked, %d snapshots %s", len(hashes), countKind(g.rep.Removed, KindSnapshot)-before, removed(g.opt.DryRun))
	return nil
}

func (g *collector) scopeSnapshots(ctx context.Context, area *os.File, hash string) error {
	repo, sc, ok, err := snapshot.OpenRepoHash(g.vol, hash)
	if err != nil {
		return err
	}
	defer repo.Close()
	if !ok {
		return g.emptyRepo(area, hash)
	}
	ms, err := repo.List()
	if err != nil {
		return err
	}
	var old []Item
	for _, m := range ms {
		if !m.Created.Before(g.cutoff) {
			continue
		}
		it := Item{Kind: KindSnapshot, Scope: sc.String(), Snapshot: m.ID, LastUsed: m.Created, Bytes: m.NewBytes}
		if p, err := isPinned(g.vol, sc, m.ID); err != nil || p {
			it.Reason = "pinned"
			g.rep.Kept = append(g.rep.Kept, it)
			continue
		}
		if why := g.archiveReason(ctx, sc, m.ID); why != "" {
			it.Reason = why
			g.rep.Kept = append(g.rep.Kept, it)
			continue
		}
		old = append(old, it)
	}
	if len(old) == 0 {
		return nil
	}
	unlock, why := g.lockAll([]store.Scope{sc})
	if why != "" {
		for _, it := range old {
			it.Reason = why
			g.rep.Kept = append(g.rep.Kept, it)
		}
		return nil
	}
	defer unlock()
	if g.opt.DryRun {
		g.rep.Removed = append(g.rep.Removed, old...)
		return nil
	}
	for _, it := range old {
		if err := repo.Delete(it.Snapshot); err != nil {
			g.fail("snapshot %s of %s: %v", it.Snapshot, sc, err)
			continue
		}
		it.Bytes = 0 // counted by the sweep below: shared contents stay
		g.rep.Removed = append(g.rep.Removed, it)
	}
	_, bytes, err := repo.Sweep(ctx)
	g.rep.Freed += bytes
	return err
}

// emptyRepo removes a snapshot directory with no snapshot left once it has
// not been used for the retention period (a snapshot being made probes
// the directory first, which renews its time).
func (g *collector) emptyRepo(area *os.File, hash string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(int(area.Fd()), hash, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return nil
	}
	if !time.Unix(st.Mtim.Unix()).Before(g.cutoff) || g.opt.DryRun {
		return nil
	}
	freed, err := g.vol.RemoveArea(context.Background(), store.SnapshotsDir+"/"+hash)
	g.rep.Freed += freed
	return err
}

func countKind(items []Item, kind string) int {
	n := 0
	for _, it := range items {
		if it.Kind == kind {
			n++
		}
	}
	return n
}

func removed(dryRun bool) string {
	if dryRun {
		return "would be removed (dry run)"
	}
	return "removed"
}
