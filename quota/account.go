package quota

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/newname"
	"github.com/agentloom/loomfs/policy"
)

// Walk counts what the scope holds now: its files and directories, and
// the apparent size of its regular files and links.
type Walk func(ctx context.Context) (policy.Usage, error)

// Options configure an Account.
type Options struct {
	Limits policy.Limits // ScopeBytes and ScopeFiles (a subtree's cap, for its account); 0 is no limit
	Walk   Walk          // counts the scope when the ledger is new or torn
	// Idle is how long a holder goes without a change before it folds
	// what it spent into the ledger and returns its grant (default 1 s).
	Idle time.Duration
	// MaxGrant bounds one grant (default 16 MiB and 256 files).
	MaxGrant policy.Usage
	// Check refuses a change that adds addBytes and addFiles to used, as
	// all holders count it, with a message naming the limit (default
	// Limits.CheckQuota; a capped subtree's account words its own).
	Check func(used policy.Usage, addBytes, addFiles int64) error
}

// Account is one holder's share of a scope's account. Its methods are
// safe for concurrent use.
type Account struct {
	opts   Options
	dir    int // the account's directory
	ledger int // the ledger's lock file, held open
	node   nodeID
	name   string  // h-<id>: the record's name (its live file is name+liveSuffix)
	tmp    string  // t-<id>: this holder's temporary name for what it replaces
	snap   version // name.<n>: the record as last synced
	live   int     // the live file, OFD-locked while open
	mem    []byte  // its figures, mapped shared (nil where it can't be): see store

	mu      sync.Mutex
	r       record // what mem holds
	changes uint64 // changes counted, for the idle check and the reconcile
	seen    uint64 // changes when the idle check was armed
	timer   *time.Timer
	closed  bool
}

// Open joins the account kept in the directory dirfd (which it does not
// take over) as a new holder.
func Open(dirfd int, opts Options) (*Account, error) {
	if opts.Idle <= 0 {
		opts.Idle = time.Second
	}
	if opts.MaxGrant.Bytes <= 0 {
		opts.MaxGrant.Bytes = 16 << 20
	}
	if opts.MaxGrant.Files <= 0 {
		opts.MaxGrant.Files = 256
	}
	if opts.Check == nil {
		opts.Check = opts.Limits.CheckQuota
	}
	dir, err := unix.Openat(dirfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open quota dir: %w", err)
	}
	a := &Account{opts: opts, dir: dir, ledger: -1, live: -1, node: localNode(dir)}
	if err := a.open(); err != nil {
		a.release()
		return nil, err
	}
	return a, nil
}

func (a *Account) open() error {
	var err error
	if a.ledger, err = openLedgerLock(a.dir); err != nil {
		return err
	}
	var id [8]byte
	rand.Read(id[:])
	a.name = recordPrefix + hex.EncodeToString(id[:])
	a.tmp = "t-" + hex.EncodeToString(id[:])
	a.snap = version{base: a.name}
	// The live file is made whole and locked under a name no reaper
	// looks at, then placed (newname): a live file seen without its
	// lock is a dead holder's.
	a.live, err = unix.Openat(a.dir, a.tmp, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, policy.FilePerm)
	if err != nil {
		return fmt.Errorf("create quota record: %w", err)
	}
	fail := func(what string, err error) error {
		unix.Unlinkat(a.dir, a.tmp, 0)
		return fmt.Errorf("%s: %w", what, err)
	}
	lk := unix.Flock_t{Type: unix.F_WRLCK}
	if err := unix.FcntlFlock(uintptr(a.live), unix.F_OFD_SETLK, &lk); err != nil {
		return fail("lock quota record", err)
	}
	// The record is written, and its blocks allocated, before it is
	// mapped: a store into a page with no block behind it (a full
	// volume) would be a SIGBUS, so a full volume refuses here.
	buf := make([]byte, recordSize)
	a.r.put(buf, a.node)
	if _, err := unix.Pwrite(a.live, buf, 0); err != nil {
		return fail("write quota record", err)
	}
	if err := unix.Fallocate(a.live, 0, 0, recordSize); err != nil && !unsupported(err) {
		return fail("allocate quota record", err)
	}
	if mem, err := unix.Mmap(a.live, 0, recordSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err == nil {
		a.mem = mem
	}
	if err := a.sync(); err != nil {
		return fail("write quota record", err)
	}
	if err := newname.Place(a.dir, a.tmp, a.name+liveSuffix); err != nil {
		return fail("place quota record", err)
	}
	return nil
}

// sync writes the record where holders on other nodes read it: the live
// file is current only for those sharing this node's page cache.
func (a *Account) sync() error {
	buf := make([]byte, recordSize)
	a.r.put(buf, a.node)
	if err := a.store(); err != nil || a.mem == nil {
		if _, err := unix.Pwrite(a.live, buf, 0); err != nil {
			return fmt.Errorf("write quota record: %w", err)
		}
	}
	if err := a.snap.publish(a.dir, a.tmp+".rec", buf); err != nil {
		return fmt.Errorf("write quota record: %w", err)
	}
	return nil
}

func (a *Account) limited() (bytes, files bool) {
	return a.opts.Limits.ScopeBytes > 0, a.opts.Limits.ScopeFiles > 0
}

// Reserve checks that adding bytes and files (either may be negative)
// stays within the quota as all holders see it, and counts them. A caller
// whose change then fails gives them back with Adjust.
//
// A change refused only for what other holders hold as grants, unspent,
// waits for them, up to twice Options.Idle: a holder that goes idle gives
// its grant back within Options.Idle, and one still writing spends it or is
// refused too. So a write that fits is not refused because another
// process wrote a moment before. This holder's other changes go on
// meanwhile: a file deleted here to make room counts at once. When ctx
// ends first (an interrupted request, a tool call's budget spent), it
// stops waiting and answers the refusal it waited to lift.
func (a *Account) Reserve(ctx context.Context, bytes, files int64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	lb, lf := a.limited()
	pb, pf := max(bytes, 0), max(files, 0)
	var deadline time.Time
	for {
		if a.closed {
			return errClosed
		}
		if !(lb && pb > a.r.grant.Bytes || lf && pf > a.r.grant.Files) {
			break
		}
		held, err := a.refill(ctx, pb, pf)
		if err == nil {
			break
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(2 * a.opts.Idle)
		}
		if !held || time.Now().After(deadline) {
			return err
		}
		a.mu.Unlock()
		done := sleep(ctx, a.opts.Idle/10)
		a.mu.Lock()
		if !done {
			return err // stopped waiting: the refusal it waited to lift
		}
	}
	a.spend(bytes, files)
	return nil
}

// Adjust counts a change without checking it (shrinking, or undoing a
// Reserve).
func (a *Account) Adjust(bytes, files int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.closed {
		a.spend(bytes, files)
	}
}

var errClosed = errors.New("quota account closed")

// sleep waits d and reports true, or false as soon as ctx ends.
func sleep(ctx context.Context, d time.Duration) bool {
	wait, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	<-wait.Done()
	return ctx.Err() == nil
}

// spend counts a change in the record: growth comes out of the grant.
// a.mu is held.
func (a *Account) spend(bytes, files int64) {
	if bytes == 0 && files == 0 {
		return
	}
	a.r.grant.Bytes = max(a.r.grant.Bytes-max(bytes, 0), 0)
	a.r.grant.Files = max(a.r.grant.Files-max(files, 0), 0)
	a.r.spent.Bytes += bytes
	a.r.spent.Files += files
	// A record that could not be stored is written by the next sync; a
	// holder on this node reads it late until then, as one on another
	// node always does.
	a.store()
	a.changes++
	if a.timer == nil {
		a.seen = a.changes
		a.timer = time.AfterFunc(a.opts.Idle, a.idleCheck)
	}
}

// idleCheck folds what this holder spent and returns its grant once it
// has gone Options.Idle without a change.
func (a *Account) idleCheck() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return
	}
	if a.changes != a.seen {
		a.seen = a.changes
		a.timer.Reset(a.opts.Idle)
		return
	}
	// The fold waits for the ledger's lock only briefly: it holds a.mu,
	// and a change that fits this holder's grant, which needs no lock,
	// must not wait behind it for the storage.
	if err := a.settle(a.opts.Idle / idleFoldWait); err != nil {
		// The record stays as it stands (read, or folded by a reaper,
		// as it is) and the fold is tried again as briefly later: a
		// holder that goes on idle must not keep its grant and its
		// unfolded spending for good because one try failed.
		a.timer.Reset(a.opts.Idle / idleFoldWait)
		return
	}
	a.timer = nil
}

// locked runs fn with the ledger lock held and the ledger read (counted
// first if it is new or torn) and dead holders folded in; fn returns
// whether the ledger changed, and after, if not nil, runs once the ledger
// is written. With heal, an unsure ledger is counted again if no other
// node's holder is active: only off the path of a write waiting for its
// grant, since a walk of a large scope can take seconds. a.mu is held.
func (a *Account) locked(ctx context.Context, heal bool, fn func(l *ledger, live []holder) (bool, error), after func() error) error {
	if err := lockLedger(ctx, a.ledger); err != nil {
		return fmt.Errorf("lock quota ledger: %w", err)
	}
	defer unlockFD(a.ledger)
	names, err := listDir(a.dir)
	if err != nil {
		return err
	}
	lv := versionOf(names, LedgerFile)
	l, ok, err := readLedger(a.dir, lv)
	if err != nil {
		return err
	}
	hs, err := holders(a.dir, names, a.name, a.node)
	if err != nil {
		return err
	}
	changed, recount := false, !ok || heal && l.Unsure
	var live []holder
	for _, h := range hs {
		if h.live {
			live = append(live, h)
			continue
		}
		// Its holder is gone: what it spent stays counted, its grant
		// comes back. One on another node may have spent some of its
		// grant since its last sync: the whole grant is counted as
		// spent, and the scope counted again once no other node's
		// holder is changing it (now, or by a later holder: Unsure).
		l.Bytes += h.rec.spent.Bytes
		l.Files += h.rec.spent.Files
		if !h.local {
			l.Bytes += h.rec.grant.Bytes
			l.Files += h.rec.grant.Files
			recount = true
		}
		h.remove(a.dir)
		changed = true
	}
	switch {
	case !recount:
	case !ok || quiet(live):
		cctx, cancel := a.countContext(ctx, heal)
		c, err := a.count(cctx, live)
		cancel()
		switch {
		case err == nil:
			l, changed = c, true
		case !ok:
			return err
		case !l.Unsure:
			// Counted by the next holder: a walk that outlasts this
			// call's wait must not keep a holder from folding.
			l.Unsure, changed = true, true
		}
	case !l.Unsure:
		l.Unsure, changed = true, true
	}
	fnChanged, err := fn(&l, live)
	if err != nil {
		if changed {
			writeLedger(a.dir, a.tmp+".ledger", &lv, l)
		}
		return err
	}
	if changed || fnChanged {
		if err := writeLedger(a.dir, a.tmp+".ledger", &lv, l); err != nil {
			return err
		}
	}
	if after != nil {
		return after()
	}
	return nil
}

// countContext bounds a count of the scope under the ledger's lock. On a
// write's path (no heal) that is the write's own ctx; off it, a fold's or
// a reconcile's count is bounded by closeWait idle spells, not by a fold's
// brief wait for the lock, which a walk of a large scope outlasts.
func (a *Account) countContext(ctx context.Context, heal bool) (context.Context, context.CancelFunc) {
	if !heal {
		return ctx, func() {}
	}
	return context.WithTimeout(context.WithoutCancel(ctx), closeWait*a.opts.Idle)
}

// settled reports whether no live holder holds a grant or unfolded
// changes: each has gone idle and folded what it spent into the ledger.
func settled(live []holder) bool {
	for _, h := range live {
		if h.rec != (record{}) {
			return false
		}
	}
	return true
}

// quiet reports whether the live holders' figures are known exactly: none
// on another node holds a grant or unfolded changes (what it did since its
// last sync is unknown here). Those on this node are read live.
func quiet(live []holder) bool {
	for _, h := range live {
		if !h.local && h.rec != (record{}) {
			return false
		}
	}
	return true
}

// count makes a new ledger from a walk: what the scope holds less what
// the live holders hs (and this one) have spent and not folded in.
func (a *Account) count(ctx context.Context, hs []holder) (ledger, error) {
	if a.opts.Walk == nil {
		return ledger{}, errors.New("quota ledger is missing and nothing can count the scope")
	}
	u, err := a.opts.Walk(ctx)
	if err != nil {
		return ledger{}, fmt.Errorf("count scope for quota: %w", err)
	}
	l := ledger{Bytes: u.Bytes - a.r.spent.Bytes, Files: u.Files - a.r.spent.Files}
	for _, h := range hs {
		l.Bytes -= h.rec.spent.Bytes
		l.Files -= h.rec.spent.Files
	}
	return l, nil
}

// refill takes a grant of at least pb bytes and pf files, or refuses with
// the figures; held says the refusal is only for what other holders hold
// as grants, unspent. Its wait for the ledger's lock ends with ctx. a.mu
// is held.
func (a *Account) refill(ctx context.Context, pb, pf int64) (held bool, err error) {
	err = a.locked(ctx, false, func(l *ledger, live []holder) (bool, error) {
		taken := policy.Usage{Bytes: l.Bytes + a.r.spent.Bytes, Files: l.Files + a.r.spent.Files}
		var others policy.Usage
		for _, h := range live {
			taken.Bytes += h.rec.spent.Bytes + h.rec.grant.Bytes
			taken.Files += h.rec.spent.Files + h.rec.grant.Files
			others.Bytes += h.rec.grant.Bytes
			others.Files += h.rec.grant.Files
		}
		if err := a.opts.Check(taken, pb, pf); err != nil {
			spent := policy.Usage{Bytes: taken.Bytes - others.Bytes, Files: taken.Files - others.Files}
			held = others != (policy.Usage{}) && a.opts.Check(spent, pb, pf) == nil
			return false, err
		}
		n := int64(len(live) + 1)
		if lim := a.opts.Limits.ScopeBytes; lim > 0 {
			a.r.grant.Bytes = grant(lim-taken.Bytes, pb, a.opts.MaxGrant.Bytes, n)
		}
		if lim := a.opts.Limits.ScopeFiles; lim > 0 {
			a.r.grant.Files = grant(lim-taken.Files, pf, a.opts.MaxGrant.Files, n)
		}
		return false, a.sync()
	}, nil)
	return held, err
}

// grant sizes a grant of need out of free, with some to spare: a share of
// what is left, so that near the limit grants shrink and the last of the
// quota goes to whoever asks for it.
// The spare is a whole number of needs, so a holder writing in equal
// pieces is left no remnant too small for its next piece, which other
// holders could not use either.
func grant(free, need, most, holders int64) int64 {
	spare := min(max(free-need, 0)/(4*holders), most)
	if need > 0 {
		spare -= spare % need
	}
	return min(need+spare, free)
}

// An idle holder's fold waits a quarter of an idle spell for the ledger's
// lock (Options.Idle / idleFoldWait), and tries again a quarter later.
const idleFoldWait = 4

// closeWait bounds Close's wait for the ledger's lock, in idle spells
// (10 s by default): a holder that can't fold its spending in leaves its
// record as it stands, which is read, or folded in by whoever finds it
// dead, as it stands.
const closeWait = 10

// settle folds what this holder spent into the ledger and returns its
// grant, waiting up to wait for the ledger's lock. a.mu is held.
func (a *Account) settle(wait time.Duration) error {
	if a.r == (record{}) {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	// The ledger is written before the record is cleared: a crash in
	// between counts the spending twice (refusing early, until a
	// reconcile) rather than not at all.
	return a.locked(ctx, true, func(l *ledger, _ []holder) (bool, error) {
		l.Bytes += a.r.spent.Bytes
		l.Files += a.r.spent.Files
		return true, nil
	}, func() error {
		a.r = record{}
		return a.sync()
	})
}

// Usage returns what the scope holds as all holders have counted it.
func (a *Account) Usage(ctx context.Context) (policy.Usage, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return policy.Usage{}, errClosed
	}
	st, err := inspect(a.dir, a.ledger, a.name, a.node)
	if err == nil && !st.Known {
		// New or torn: count it under the lock, and look again.
		err = a.locked(ctx, false, func(*ledger, []holder) (bool, error) { return false, nil }, nil)
		if err == nil {
			st, err = inspect(a.dir, a.ledger, a.name, a.node)
		}
	}
	if err != nil {
		return policy.Usage{}, err
	}
	u := st.Used
	u.Bytes += a.r.spent.Bytes
	u.Files += a.r.spent.Files
	return u, nil
}

// Close folds what this holder spent into the ledger, returns its grant
// and drops its record.
func (a *Account) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil
	}
	a.closed = true
	if a.timer != nil {
		a.timer.Stop()
		a.timer = nil
	}
	err := a.settle(closeWait * a.opts.Idle)
	if err == nil {
		holder{id: a.name, snap: a.snap}.remove(a.dir)
	}
	a.release()
	return err
}

// store puts the record into the live file's mapping, where holders on
// this node read it as it changes without a write per change. A fault on
// the page (an I/O error of a network filesystem, a block the volume could
// not give after all) is a SIGBUS that would kill the process: it is
// turned into an error, and the mapping given up for writes (sync). a.mu
// is held.
func (a *Account) store() (err error) {
	if a.mem == nil {
		return nil
	}
	defer func() {
		if r := recover(); r != nil {
			if _, fault := r.(interface{ Addr() uintptr }); !fault {
				panic(r)
			}
			a.unmap()
			err = fmt.Errorf("quota record mapping faulted: %v", r)
		}
	}()
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	storeRecord(a.mem, a.r, a.node)
	return nil
}

func (a *Account) unmap() {
	if a.mem != nil {
		unix.Munmap(a.mem)
		a.mem = nil
	}
}

// unsupported reports whether err says the filesystem does not do an
// operation at all (rather than failed it).
func unsupported(err error) bool {
	return errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS)
}

func (a *Account) release() {
	a.unmap()
	if a.live >= 0 {
		unix.Close(a.live)
	}
	if a.ledger >= 0 {
		unix.Close(a.ledger)
	}
	unix.Close(a.dir)
}
