package fork

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/snapshot"
	"github.com/agentloom/loomfs/store"
)

// Conflict types: what the fork and the target each did to one path since
// the fork's base.
const (
	BothModified    = "both_modified"    // both changed the file, differently
	ModifiedDeleted = "modified_deleted" // the fork changed it, the target deleted it
	DeletedModified = "deleted_modified" // the fork deleted it, the target changed it
	BothAdded       = "both_added"       // both made it, differently
	TypeChanged     = "type_changed"     // a file on one side, a directory or link on another
)

// MergeOptions say what a merge carries.
type MergeOptions struct {
	// DryRun compares and lists, and changes nothing.
	DryRun bool
	// Partial applies the changes that conflict with nothing even when
	// others do; without it a conflict or a refusal applies nothing.
	Partial bool
	// Paths limits the merge to these paths and what is under them.
	Paths []string
	// Markers writes, for each text file both sides changed, the file
	// with conflict markers beside the target's as PATH.conflict (never
	// over it).
	Markers bool
	// Call is the call id the change feed shows the merge as (one call);
	// "" makes one. Source is the door it shows it from: store.SourceTool
	// for an agent's own merge, "" the platform's.
	Call   string
	Source string
	// Preview, if set, is the Preview of a dry run the merge must still
	// match: otherwise nothing is applied (a conflict), so what is merged
	// is what was previewed.
	Preview string
}

// Applied is one change a merge brought over, or would in a dry run.
type Applied struct {
	Path string `json:"path"`
	Op   string `json:"op"`             // "create", "write", "delete", "mkdir", "rmdir"
	Base string `json:"base,omitempty"` // sha256 the target had (and the base)
	Fork string `json:"fork,omitempty"` // sha256 the target has now
}

// Conflict is a path both sides changed since the base, with each side's
// sha256 ("" absent, "dir" a directory, "link:SHA" an emulated link).
type Conflict struct {
	Path   string `json:"path"`
	Type   string `json:"type"`
	Base   string `json:"base"`
	Target string `json:"target"`
	Fork   string `json:"fork"`
	Marker string `json:"marker,omitempty"` // the PATH.conflict written beside
}

// Refused is a change the target's policy does not take, or one a merge
// does not carry (Skipped), with the reason.
type Refused struct {
	Path    string `json:"path"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

// MergeResult is the outcome of a merge, or its preview.
type MergeResult struct {
	From      string     `json:"from"`
	Into      string     `json:"into"`
	Base      string     `json:"base"` // the source snapshot the fork was made from
	DryRun    bool       `json:"dry_run"`
	Merged    bool       `json:"merged"` // the changes listed in Applied were made
	Call      string     `json:"call_id,omitempty"`
	Applied   []Applied  `json:"applied"`
	Same      []string   `json:"same,omitempty"` // changed alike on both sides
	Conflicts []Conflict `json:"conflicts"`
	Refused   []Refused  `json:"refused,omitempty"`
	Skipped   []Refused  `json:"skipped,omitempty"`
	// Preview names this plan (what is applied, held back and refused);
	// MergeOptions.Preview asks a merge to apply it and nothing else.
	Preview string `json:"preview"`
	// ScanS is the time taken to find what the fork changed (a walk of
	// it, reading only files fstat finds changed); Duration the whole.
	ScanS    float64 `json:"scan_s"`
	Duration float64 `json:"duration_s"`
}

// state is one side's view of a path.
type state struct {
	kind string // "", "file", "dir", "symlink"
	sha  string
}

func (s state) String() string {
	switch s.kind {
	case "dir":
		return "dir"
	case "symlink":
		return "link:" + s.sha
	}
	return s.sha
}

// forkChange is a path the fork changed since its base.
type forkChange struct {
	path string
	base state
	fork state
	st   unix.Stat_t // the fork's copy, to become the base after a merge
}

// Merge brings what the fork scope changed since its base into target,
// which must be the scope it was forked from. Per path: changed only in
// the fork, it is applied with the base's sha256 as the expected one, so a
// change in the target since is never overwritten; changed in both, it is
// a conflict of a type above. All the files are applied as one change set
// under the target's scope lock (and the fork's), all or none; with
// conflicts or refusals nothing is applied unless opt.Partial. The
// result lists everything, and err is a conflict error when the merge was
// held back by conflicts or refusals.
func Merge(ctx context.Context, fork, target *store.Workspace, opt MergeOptions) (*MergeResult, error) {
	h, err := HoldRecord(fork.Volume(), fork.Scope())
	if err != nil {
		return nil, err
	}
	defer h.Close()
	return h.Merge(ctx, fork, target, opt)
}

// Merge is the package's Merge with the fork's record held already: a
// caller that read it to find the target (From) has it read no second
// time.
func (h *HeldRecord) Merge(ctx context.Context, fork, target *store.Workspace, opt MergeOptions) (*MergeResult, error) {
	if err := h.check(fork); err != nil {
		return nil, err
	}
	// The record stays open until the locks are held, so that it is
	// decoded once unless it moved on meanwhile (recordCurrent).
	start, recFile, rec := h.read, h.f, h.Record
	if rec.From != target.Scope() {
		return nil, policy.Errorf(policy.InvalidInput, "scope %s was forked from %s, not %s: merge it into %s", fork.Scope(), rec.From, target.Scope(), rec.From)
	}
	paths, err := cleanPaths(target.Policy(), opt.Paths)
	if err != nil {
		return nil, err
	}
	res := &MergeResult{From: fork.Scope().String(), Into: target.Scope().String(), Base: rec.Snapshot, DryRun: opt.DryRun,
		Applied: []Applied{}, Conflicts: []Conflict{}}
	if !opt.DryRun {
		unlockFork, err := fork.Lock(ctx)
		if err != nil {
			return nil, err
		}
		defer unlockFork()
		unlock, err := target.Lock(ctx)
		if err != nil {
			return nil, err
		}
		defer unlock()
		// The record may have moved on while this waited.
		current, err := recordCurrent(fork.Volume(), fork.Scope(), recFile)
		if err != nil {
			return nil, err
		}
		if !current {
			if rec, err = ReadRecord(fork.Volume(), fork.Scope()); err != nil {
				return nil, err
			}
		}
	}
	scan := time.Now()
	index := rec.index()
	changed, skipped, err := forkChanges(ctx, fork, rec, index, paths)
	if err != nil {
		return nil, err
	}
	res.ScanS = time.Since(scan).Seconds()
	res.Skipped = skipped

	var changes []store.FileChange
	var mkdirs, rmdirs []string
	var links []link         // made after the change set
	var modes []forkChange   // new files that keep the fork's mode
	var settled []forkChange // applied or the same: they take the fork's state as base
	for _, c := range changed {
		tgt, err := targetState(target, c.path)
		if err != nil {
			res.Refused = append(res.Refused, refusal(c.path, err))
			continue
		}
		if tgt == c.fork {
			res.Same = append(res.Same, c.path)
			settled = append(settled, c)
			continue
		}
		if tgt != c.base {
			res.Conflicts = append(res.Conflicts, Conflict{Path: c.path, Type: conflictType(c.base, tgt, c.fork), Base: c.base.String(), Target: tgt.String(), Fork: c.fork.String()})
			continue
		}
		if c.base.kind != "" && c.fork.kind != "" && c.base.kind != c.fork.kind {
			// A file became a directory or the other way: more than one
			// change set can say; left to whoever merges by hand.
			res.Conflicts = append(res.Conflicts, Conflict{Path: c.path, Type: TypeChanged, Base: c.base.String(), Target: tgt.String(), Fork: c.fork.String()})
			continue
		}
		op := policy.OpWrite
		switch {
		case c.fork.kind == "":
			op = policy.OpDelete
		case c.base.kind == "":
			op = policy.OpCreate
		}
		if err := target.Policy().Check(op, c.path); err != nil {
			res.Refused = append(res.Refused, refusal(c.path, err))
			continue
		}
		a := Applied{Path: c.path, Base: c.base.sha, Fork: c.fork.sha}
		if c.fork.kind == "symlink" || (c.base.kind == "symlink" && c.fork.kind == "") {
			// An emulated link is carried as the target's policy says of
			// links (symlinks: emulate makes them, refuse does not).
			l, err := linkChange(fork, target.Policy(), c, opt.DryRun)
			if err != nil {
				res.Refused = append(res.Refused, refusal(c.path, err))
				continue
			}
			a.Op = l.op
			if l.remove {
				changes = append(changes, store.FileChange{Path: c.path, Delete: true, Link: true})
			}
			if l.op != "delete" {
				links = append(links, l)
			}
			res.Applied = append(res.Applied, a)
			settled = append(settled, c)
			continue
		}
		switch {
		case c.fork.kind == "dir":
			a.Op = "mkdir"
			mkdirs = append(mkdirs, c.path)
		case c.base.kind == "dir":
			a.Op = "rmdir"
			rmdirs = append(rmdirs, c.path)
		case c.fork.kind == "":
			a.Op = "delete"
			changes = append(changes, store.FileChange{Path: c.path, Delete: true, Expected: c.base.sha})
		default:
			a.Op = "write"
			if c.base.kind == "" {
				a.Op = "create"
				// A new file keeps the owner's bits the fork gave it (an
				// executable stays one, SPEC §2.1); a replaced one keeps
				// the target's mode, as a replace through the tool door.
				if perm := policy.OwnerPerm(c.st.Mode); perm != policy.FilePerm {
					modes = append(modes, c)
				}
			}
			if !opt.DryRun {
				data, err := readFork(fork, c.path, c.fork.sha)
				if err != nil {
					return nil, err
				}
				changes = append(changes, store.FileChange{Path: c.path, Data: data, Expected: c.base.sha})
			}
		}
		res.Applied = append(res.Applied, a)
		settled = append(settled, c)
	}

	res.Preview = planID(res)
	if opt.Preview != "" && opt.Preview != res.Preview {
		res.Duration = time.Since(start).Seconds()
		return res, policy.Errorf(policy.Conflict, "merge of %s into %s: what a merge would do changed since the preview (%d changes, %d conflicts, %d refusals now); nothing was merged: preview again",
			res.From, res.Into, len(res.Applied), len(res.Conflicts), len(res.Refused))
	}
	if !opt.DryRun && opt.Markers {
		for i := range res.Conflicts {
			markConflict(ctx, fork, target, &res.Conflicts[i])
		}
	}
	held := len(res.Conflicts) > 0 || len(res.Refused) > 0
	if opt.DryRun || (held && !opt.Partial) || len(settled) == 0 {
		res.Duration = time.Since(start).Seconds()
		if held && !opt.DryRun {
			return res, heldBack(res)
		}
		return res, nil
	}

	call := opt.Call
	if call == "" {
		call = newCallID()
	}
	res.Call = call
	source := opt.Source
	if source == "" {
		source = store.SourcePlatform
	}
	actx := store.WithChange(ctx, store.Change{Source: source, Call: call})
	// The fork's next record, its base moved on to what is merged, is
	// written and fsynced while the changes are applied, and put in place
	// after them: a merge that fails leaves the record as it was.
	next := startRecord(fork, rec, index, settled)
	defer next.discard()
	if len(changes) > 0 {
		if _, err := target.ApplyChanges(actx, changes); err != nil {
			return nil, fmt.Errorf("merge %s into %s: %w", fork.Scope(), target.Scope(), err)
		}
	}
	for _, c := range modes {
		if err := chmod(target, c.path, policy.OwnerPerm(c.st.Mode)); err != nil {
			res.Skipped = append(res.Skipped, refusal(c.path, fmt.Errorf("merged with mode 0600, not the fork's %#o: %w", policy.OwnerPerm(c.st.Mode), err)))
		}
	}
	for _, l := range links {
		if _, err := target.Symlink(actx, l.path, l.target); err != nil {
			return nil, fmt.Errorf("merge %s into %s: the files were merged, making link %s failed: %w", fork.Scope(), target.Scope(), l.path, err)
		}
	}
	// Directories come after the files: new ones (their files made them
	// already, or they are empty), then removed ones deepest first, each
	// only when empty in the target too.
	for _, d := range mkdirs {
		if _, err := target.Mkdir(actx, d, true); err != nil && policy.CodeOf(err) != policy.Exists {
			return nil, fmt.Errorf("merge %s into %s: the files were merged, making directory %s failed: %w", fork.Scope(), target.Scope(), d, err)
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(rmdirs)))
	for _, d := range rmdirs {
		if err := target.Remove(actx, d, nil); err != nil {
			res.Skipped = append(res.Skipped, refusal(d, fmt.Errorf("the fork removed this directory; it stays in the target: %w", err)))
		}
	}
	res.Merged = true
	if err := next.commit(); err != nil {
		return res, fmt.Errorf("merge %s into %s: merged, but the fork's base could not be moved on (the next merge will find these files the same): %w", fork.Scope(), target.Scope(), err)
	}
	res.Duration = time.Since(start).Seconds()
	if held {
		return res, heldBack(res)
	}
	return res, nil
}

// planID names what a merge would do: the base, each change with the
// fork's hash, each conflict's and refusal's path and kind. The target's
// hashes are left out (a conflict's type says enough, and a change in the
// target since is caught by the expected hashes), so the name tells
// nothing of a file its reader may not read.
func planID(res *MergeResult) string {
	h := sha256.New()
	fmt.Fprintf(h, "base %s\n", res.Base)
	for _, a := range res.Applied {
		fmt.Fprintf(h, "apply %q %s %s\n", a.Path, a.Op, a.Fork)
	}
	for _, c := range res.Conflicts {
		fmt.Fprintf(h, "conflict %q %s\n", c.Path, c.Type)
	}
	for _, r := range res.Refused {
		fmt.Fprintf(h, "refused %q %s\n", r.Path, r.Code)
	}
	return hex.EncodeToString(h.Sum(nil))[:32]
}

// heldBack is the error of a merge that conflicts or refusals stopped.
func heldBack(res *MergeResult) error {
	var paths []string
	for _, c := range res.Conflicts {
		paths = append(paths, c.Path+" ("+c.Type+")")
	}
	for _, r := range res.Refused {
		paths = append(paths, r.Path+" ("+r.Code+")")
	}
	if len(paths) > 5 {
		paths = append(paths[:5], fmt.Sprintf("and %d more", len(paths)-5))
	}
	what := "nothing was merged"
	if res.Merged {
		what = fmt.Sprintf("the other %d changes were merged", len(res.Applied))
	}
	return policy.Errorf(policy.Conflict, "merge of %s into %s: %d conflicts and %d refusals: %s; %s. Resolve them in either scope, or merge with --partial",
		res.From, res.Into, len(res.Conflicts), len(res.Refused), strings.Join(paths, ", "), what)
}

// cleanPaths checks --paths as a model-facing path would be.
func cleanPaths(pol *policy.Policy, raw []string) ([]string, error) {
	var out []string
	for _, p := range raw {
		tg, err := pol.Target(policy.OpStat, p)
		if err != nil {
			return nil, err
		}
		out = append(out, tg.Rel)
	}
	return out, nil
}

func under(rel string, paths []string) bool {
	if len(paths) == 0 {
		return true
	}
	for _, p := range paths {
		if p == "." || rel == p || strings.HasPrefix(rel, p+"/") {
			return true
		}
	}
	return false
}

// forkChanges walks the fork and returns each path whose state differs from
// the base, in path order. A file fstat finds as the base left it is not
// read. Paths hidden in the fork are not looked at: the agent there could
// not have changed them. index is rec.index().
func forkChanges(ctx context.Context, fork *store.Workspace, rec *Record, index map[string]int, paths []string) ([]forkChange, []Refused, error) {
	pol := fork.Policy()
	seen := make([]bool, len(rec.Entries)) // by index, the base's paths the walk found
	var mu sync.Mutex                      // out and skipped: the walk calls visit from several goroutines
	var out []forkChange
	var skipped []Refused
	skip := func(r Refused) {
		mu.Lock()
		skipped = append(skipped, r)
		mu.Unlock()
	}
	view := fork.Unfiltered()
	err := walkParallel(ctx, view, walkerCount(), func(rel string, info store.Info) error {
		if pol.ModeOf(rel) == policy.ModeHidden {
			if info.Kind == policy.KindDir {
				return store.SkipDir
			}
			return nil
		}
		var e *Entry
		if i, ok := index[rel]; ok {
			seen[i] = true
			e = &rec.Entries[i]
		}
		if !under(rel, paths) {
			return nil
		}
		var cur state
		switch info.Kind {
		case policy.KindDir:
			cur = state{kind: "dir"}
		case policy.KindRegular, policy.KindLink:
			kind := "file"
			if info.Kind == policy.KindLink {
				kind = "symlink"
			}
			if e != nil && e.Type == kind && e.unchanged(&info.Stat) {
				return nil
			}
			sha, err := hashOf(view, rel, info.Kind)
			if err != nil {
				skip(refusal(rel, err))
				return nil
			}
			cur = state{kind: kind, sha: sha}
		default:
			skip(Refused{Path: rel, Code: string(policy.SpecialFileRefused), Message: "not a file, directory or link: not merged"})
			return nil
		}
		if b := baseState(e); b != cur {
			mu.Lock()
			out = append(out, forkChange{path: rel, base: b, fork: cur, st: info.Stat})
			mu.Unlock()
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("read the fork %s: %w", fork.Scope(), err)
	}
	for i, e := range rec.Entries {
		if !seen[i] && under(e.Path, paths) && pol.ModeOf(e.Path) != policy.ModeHidden {
			out = append(out, forkChange{path: e.Path, base: baseState(&e)})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].path < out[j].path })
	sort.Slice(skipped, func(i, j int) bool { return skipped[i].Path < skipped[j].Path })
	return out, skipped, nil
}

// walkerCount is how many goroutines walk a fork at once for a merge.
func walkerCount() int { return min(runtime.GOMAXPROCS(0)*walkersPerCPU, maxWorkers) }

// walkersPerCPU is how many walkers a merge starts per CPU: the fork's
// subtrees are independent, and a stat is CPU on a local disk and a round
// trip on a network one, which more walkers than CPUs overlap. One a CPU
// gained nothing measurable on two CPUs; four took the walk of 12,800
// entries from about 38 to 31 ms there.
const walkersPerCPU = 4

// walkParallel visits view's tree as view.Walk(ctx, ".", fn) does, but
// hands a directory to a goroutine that is idle, up to n at once; fn is
// called from several goroutines, in no set order. A subtree handed over
// and removed or replaced before it is walked is passed over, as Walk
// passes over one it finds so.
func walkParallel(ctx context.Context, view *store.Workspace, n int, fn store.WalkFunc) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		pending sync.WaitGroup // subtrees handed over, not walked yet
		mu      sync.Mutex
		first   error
	)
	fail := func(err error) {
		mu.Lock()
		if first == nil {
			first = err
			cancel()
		}
		mu.Unlock()
	}
	subtrees := make(chan string) // unbuffered: a send succeeds only to an idle walker
	visit := func(rel string, info store.Info) error {
		if err := fn(rel, info); err == store.SkipDir {
			return err
		} else if err != nil {
			return fnError{err}
		}
		if info.Kind != policy.KindDir || info.OtherMount {
			return nil
		}
		pending.Add(1)
		select {
		case subtrees <- rel:
			return store.SkipDir
		default:
			pending.Done()
			return nil
		}
	}
	for range n - 1 {
		go func() {
			for rel := range subtrees {
				if err := view.Walk(ctx, rel, visit); err != nil && !goneMeanwhile(err) {
					fail(err)
				}
				pending.Done()
			}
		}()
	}
	if err := view.Walk(ctx, ".", visit); err != nil {
		fail(err)
	}
	pending.Wait()
	close(subtrees)
	var fe fnError
	if errors.As(first, &fe) {
		return fe.err
	}
	return first
}

// fnError is an error of walkParallel's fn, hidden from goneMeanwhile (it
// does not unwrap) so that it is never taken for the walk's own.
type fnError struct{ err error }

func (e fnError) Error() string { return e.err.Error() }

// goneMeanwhile reports whether err, from walking a directory a listing
// named, means it was removed, replaced, or made unreadable since. Only
// opening it can fail so: below it, Walk passes over such entries itself.
func goneMeanwhile(err error) bool {
	for _, e := range []error{unix.ENOENT, unix.ENOTDIR, unix.ELOOP, unix.ESTALE, unix.EACCES, unix.EPERM} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

func baseState(e *Entry) state {
	if e == nil {
		return state{}
	}
	if e.Type == "dir" {
		return state{kind: "dir"}
	}
	return state{kind: e.Type, sha: e.SHA256}
}

// hashOf is the sha256 of a file's content or of a link's target (as a
// snapshot keeps it).
func hashOf(ws *store.Workspace, rel string, kind policy.Kind) (string, error) {
	if kind == policy.KindLink {
		target, _, err := ws.ReadLink(rel)
		if err != nil {
			return "", err
		}
		sum := sha256.Sum256([]byte(target))
		return hex.EncodeToString(sum[:]), nil
	}
	sha, _, err := ws.ContentHash(rel)
	return sha, err
}

// targetState is the target's view of rel, whatever its path modes say
// (its content's hash is compared, never shown).
func targetState(ws *store.Workspace, rel string) (state, error) {
	view := ws.Unfiltered()
	info, err := view.Lstat(rel)
	switch policy.CodeOf(err) {
	case "":
	case policy.NotFound:
		return state{}, nil
	case policy.NotDir:
		// A parent became a file: the path is absent.
		return state{}, nil
	default:
		return state{}, err
	}
	switch info.Kind {
	case policy.KindDir:
		return state{kind: "dir"}, nil
	case policy.KindRegular, policy.KindLink:
		sha, err := hashOf(view, rel, info.Kind)
		if err != nil {
			return state{}, err
		}
		if info.Kind == policy.KindLink {
			return state{kind: "symlink", sha: sha}, nil
		}
		return state{kind: "file", sha: sha}, nil
	}
	return state{}, policy.Errorf(policy.SpecialFileRefused, "%s in the target is not a file, directory or link", rel)
}

func conflictType(base, target, fork state) string {
	present := func(s state) bool { return s.kind != "" }
	switch {
	case present(target) && present(fork) && target.kind != fork.kind,
		present(base) && present(fork) && base.kind != fork.kind,
		present(base) && present(target) && base.kind != target.kind:
		return TypeChanged
	case !present(base):
		return BothAdded
	case !present(fork):
		return DeletedModified
	case !present(target):
		return ModifiedDeleted
	}
	return BothModified
}

func refusal(rel string, err error) Refused {
	code := policy.CodeOf(err)
	if code == "" {
		code = policy.Internal
	}
	return Refused{Path: rel, Code: string(code), Message: policy.Public(err).Error()}
}

// link is an emulated link a merge makes or removes in the target.
type link struct {
	path, target string
	op           string // "symlink" (made), "relink" (replaced), "delete"
	remove       bool   // the base's link goes first, in the change set
}

// linkChange is what a merge does with a link the fork made, changed or
// removed; the target's policy must let a link be made there.
func linkChange(fork *store.Workspace, pol *policy.Policy, c forkChange, dryRun bool) (link, error) {
	l := link{path: c.path, remove: c.base.kind == "symlink"}
	switch {
	case c.fork.kind == "":
		l.op = "delete"
		return l, nil
	case l.remove:
		l.op = "relink"
	default:
		l.op = "symlink"
	}
	target, _, err := fork.Unfiltered().ReadLink(c.path)
	if err != nil {
		return l, fmt.Errorf("read link %s in the fork: %w", c.path, err)
	}
	if sum := sha256.Sum256([]byte(target)); hex.EncodeToString(sum[:]) != c.fork.sha && !dryRun {
		return l, policy.Errorf(policy.Conflict, "%s changed in the fork during the merge; merge again", c.path)
	}
	l.target = target
	return l, pol.CheckSymlink(c.path, target)
}

// chmod gives the target's file at rel the mode perm, as the policy
// lets a program ask for one.
func chmod(ws *store.Workspace, rel string, perm uint32) error {
	if err := policy.CheckChmod(rel, perm); err != nil {
		return err
	}
	f, _, err := ws.Open(policy.OpSetattr, rel, unix.O_RDONLY)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Fchmod(int(f.Fd()), perm)
}

// readFork reads the fork's file at rel, which must still have sha.
func readFork(fork *store.Workspace, rel, sha string) ([]byte, error) {
	f, _, err := fork.Unfiltered().Open(policy.OpRead, rel, unix.O_RDONLY)
	if err != nil {
		return nil, fmt.Errorf("read %s in the fork: %w", rel, err)
	}
	defer f.Close()
	max := fork.Policy().Limits.FileBytes
	var r io.Reader = f
	if max > 0 {
		r = io.LimitReader(f, max+1)
	}
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("read %s in the fork: %w", rel, err)
	}
	sum := sha256.Sum256(data)
	if hex.EncodeToString(sum[:]) != sha {
		return nil, policy.Errorf(policy.Conflict, "%s changed in the fork during the merge; nothing was merged: merge again", rel)
	}
	return data, nil
}

// rebase makes the fork's state of each settled path its new base in rec.
// index is rec.index().
func rebase(rec *Record, index map[string]int, settled []forkChange) {
	drop := map[string]bool{}
	for _, c := range settled {
		i, ok := index[c.path]
		if c.fork.kind == "" {
			drop[c.path] = true
			continue
		}
		e := Entry{Entry: snapshot.Entry{Path: c.path, Type: c.fork.kind, SHA256: c.fork.sha, Size: c.st.Size, Perm: c.st.Mode & 0o700, MTime: c.st.Mtim.Nano()}}
		if c.fork.kind == "dir" {
			e.Size, e.SHA256 = 0, ""
		} else {
			e.setStat(&c.st)
		}
		if ok {
			rec.Entries[i] = e
		} else {
			rec.Entries = append(rec.Entries, e)
		}
	}
	if len(drop) == 0 {
		return
	}
	kept := rec.Entries[:0]
	for _, e := range rec.Entries {
		if !drop[e.Path] {
			kept = append(kept, e)
		}
	}
	rec.Entries = kept
}

// nextRecord is a fork's record moved on by a merge, being written beside
// the merge's changes.
type nextRecord struct {
	done      chan struct{}
	staged    *stagedRecord
	err       error
	committed bool
}

// startRecord rebases rec on the settled paths and starts writing it,
// fsynced, under a temporary name. rec is the record's until the merge
// ends; index is rec.index().
func startRecord(fork *store.Workspace, rec *Record, index map[string]int, settled []forkChange) *nextRecord {
	rebase(rec, index, settled)
	n := &nextRecord{done: make(chan struct{})}
	go func() {
		defer close(n.done)
		n.staged, n.err = stageRecord(fork.Volume(), fork.Scope(), rec)
	}()
	return n
}

// commit puts the record in place once it is written, durably.
func (n *nextRecord) commit() error {
	<-n.done
	if n.err != nil {
		return n.err
	}
	n.committed = true
	return n.staged.commit()
}

// discard removes the record written, unless it was put in place.
func (n *nextRecord) discard() {
	<-n.done
	if n.staged != nil && !n.committed {
		n.staged.discard()
	}
}

// markConflict writes, for a text file both sides changed, the target's
// and the fork's versions with conflict markers around the lines that
// differ, as PATH.conflict beside the target's file. Where the target
// may not be read back (write-only, hidden) nothing is written: the
// markers would carry its content out.
func markConflict(ctx context.Context, fork, target *store.Workspace, c *Conflict) {
	if c.Type != BothModified && c.Type != BothAdded {
		return
	}
	if target.Policy().Check(policy.OpRead, c.Path) != nil {
		return
	}
	ours, _, err := target.ReadFile(ctx, c.Path)
	if err != nil {
		return
	}
	theirs, _, err := fork.Unfiltered().ReadFile(ctx, c.Path)
	if err != nil || !text(ours) || !text(theirs) {
		return
	}
	name := c.Path + ".conflict"
	data := markers(ours, theirs, target.Scope().String(), fork.Scope().String())
	if _, err := target.WriteFile(ctx, name, data, nil); err == nil {
		c.Marker = name
	}
}

func text(b []byte) bool { return utf8.Valid(b) && bytes.IndexByte(b, 0) < 0 }

// markers keeps the lines both versions start and end with and puts the
// differing middle of each between conflict markers.
func markers(ours, theirs []byte, oursName, theirsName string) []byte {
	a, b := lines(ours), lines(theirs)
	p := 0
	for p < len(a) && p < len(b) && a[p] == b[p] {
		p++
	}
	s := 0
	for s < len(a)-p && s < len(b)-p && a[len(a)-1-s] == b[len(b)-1-s] {
		s++
	}
	var out strings.Builder
	write := func(lines []string) {
		for _, l := range lines {
			out.WriteString(l)
		}
		if n := len(lines); n > 0 && !strings.HasSuffix(lines[n-1], "\n") {
			out.WriteString("\n")
		}
	}
	write(a[:p])
	out.WriteString("<<<<<<< " + oursName + "\n")
	write(a[p : len(a)-s])
	out.WriteString("=======\n")
	write(b[p : len(b)-s])
	out.WriteString(">>>>>>> " + theirsName + "\n")
	write(a[len(a)-s:])
	return []byte(out.String())
}

// lines splits b after each newline; a last line without one is kept.
func lines(b []byte) []string {
	l := strings.SplitAfter(string(b), "\n")
	if l[len(l)-1] == "" {
		l = l[:len(l)-1]
	}
	return l
}

func newCallID() string {
	var b [8]byte
	rand.Read(b[:])
	return "merge-" + hex.EncodeToString(b[:])
}
