package audit

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/agentloom/loomfs/nodeid"

	"go.uber.org/zap"
	"go.uber.org/zap/buffer"
	"go.uber.org/zap/zapcore"
)

// DefaultMaxFileBytes is the size at which a node's chain starts a new
// file when Options.MaxFileBytes is zero.
const DefaultMaxFileBytes = 64 << 20

// DefaultQueue is the queue a long-lived writer such as a mount gives
// Options.Queue: far more records than a mount has requests in flight.
const DefaultQueue = 1024

// DefaultSealEvery is how often a writer with a key signs its node's heads
// when Options.SealEvery is zero.
const DefaultSealEvery = 5 * time.Minute

// Options tune a Log. The zero value is ready to use.
type Options struct {
	// Node names this worker node in records and file names; default the
	// host name. Two nodes sharing a root must use different names; all
	// writers of one node share its chain.
	Node string
	// MaxFileBytes starts a new file of the chain once the current one
	// would grow past it; default DefaultMaxFileBytes. A chain also starts
	// a new file when the day (UTC) changes.
	MaxFileBytes int64
	// Sync makes every Record fsync before it returns, for callers that
	// need each record durable before the operation goes ahead. Without it
	// records reach the kernel at once (they survive a crash of loomfs, not
	// of the machine); rotation and Close always sync. Sync makes the Log
	// synchronous: Queue is ignored.
	Sync bool
	// Queue, when positive, lets Record return as soon as its record is
	// in a queue of at most Queue records, which one goroutine of the Log
	// writes to the chain (see "Queued writers" in the package doc). Zero
	// keeps the Log synchronous: Record returns once its record is in the
	// file. Long-lived writers on a request's path (a mount) use
	// DefaultQueue; a short-lived process gains nothing from it.
	Queue int
	// KeyFile is the node's signing key (loomfs audit keygen); default the
	// file named by $AGENT_LOOM_AUDIT_KEY, and no signing if that is unset.
	// A key that is named but can't be used makes Open fail.
	KeyFile string
	// SealEvery is how often a long-running writer signs a checkpoint;
	// default DefaultSealEvery. Writers also sign at rotation and close.
	SealEvery time.Duration
	// Clock returns the time stamped on records; default time.Now.
	Clock func() time.Time
}

// Log is a Sink that appends hash-chained records to its node's chain,
// shared with every other writer of the node: each append takes an OFD
// lock on the chain's current file, continues the chain from its last
// line and releases the lock. The Log is registered in the node's ledger
// from Open to Close. Its methods are safe for concurrent use.
//
// A synchronous Log appends on the goroutine of Record; a queued one
// (Options.Queue) on its writer goroutine, which appends everything
// queued in one lock hold and one write(2), and lets the lock go soon
// after the queue ran empty.
type Log struct {
	dir   string
	node  string // as in file names
	opts  Options
	key   *NodeKey
	pid   int
	start time.Time
	enc   zapcore.Encoder // JSON, with node, pid and writer already added

	// mu guards the chain state below; whoever appends (Record in a
	// synchronous Log, the writer goroutine in a queued one) holds it for
	// the length of one append.
	mu       sync.Mutex
	led      *os.File // the node's ledger; holds this writer's liveness lock
	id       uint64   // writer number: seq of its open entry in the ledger
	f        *os.File // the chain's current file, as far as this writer knows
	ws       zapcore.WriteSyncer
	fileN    int    // its number
	fileDay  string // its day
	size     int64  // its size when this writer last looked; -1 unknown
	seq      uint64 // the chain's last seq
	prev     string // hex sha256 of the chain's last line
	last     lineFields
	events   uint64 // events this writer recorded
	records  uint64 // lines this writer wrote, checkpoints included
	lastSeq  uint64 // its last record
	lastHash string
	lastSeal time.Time
	held     bool            // a synchronous Log keeps the chain lock through a burst of records
	heldAt   time.Time       // when it was taken
	lastRec  time.Time       // when this writer last recorded
	release  *time.Timer     // lets the lock go once the burst is over
	gap      time.Duration   // a synchronous Log's burst: records at most gap apart,
	most     time.Duration   // for most at a stretch (holds, of what the lock costs)
	fields   []zapcore.Field // reused per record, under mu
	actor    actorFields     // reused per record, under mu
	group    []byte          // the lines of one write, reused under mu
	lastErr  error           // last failure; nil after a success
	broken   error           // set when the chain can no longer be continued
	room     room            // what the chain's current file has allocated past its end
	closed   bool

	q *queue // nil in a synchronous Log
}

var _ Sink = (*Log)(nil)

// Open registers a new writer in the node's ledger under root's audit
// directory, creating the directory (mode 0700) if it is missing but never
// root itself, and the node's chain if it has none. An unwritable log or
// an unusable key is reported here.
func Open(root string, opts Options) (*Log, error) {
	if opts.Node == "" {
		h, err := nodeid.Name()
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		opts.Node = h
	}
	if opts.MaxFileBytes <= 0 {
		opts.MaxFileBytes = DefaultMaxFileBytes
	}
	if opts.SealEvery <= 0 {
		opts.SealEvery = DefaultSealEvery
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	if opts.KeyFile == "" {
		opts.KeyFile = os.Getenv(KeyEnv)
	}
	l := &Log{dir: Dir(root), node: fileNode(opts.Node), opts: opts, pid: os.Getpid(), size: -1}
	l.gap, l.most, _ = holds(0)
	if opts.KeyFile != "" {
		k, err := LoadKey(opts.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		if k.Node != opts.Node {
			return nil, fmt.Errorf("%w: audit key %s is node %q's, this node is %q", ErrUnavailable, opts.KeyFile, k.Node, opts.Node)
		}
		l.key = k
	}
	if err := makeDir(l.dir); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if err := l.register(); err != nil {
		l.closeFiles()
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	enc := zapcore.NewJSONEncoder(zapcore.EncoderConfig{
		TimeKey:    "time",
		EncodeTime: encodeTime,
		LineEnding: "\n",
	})
	enc.AddString("node", opts.Node)
	enc.AddInt("pid", l.pid)
	enc.AddUint64("writer", l.id)
	l.enc = enc
	if opts.Queue > 0 && !opts.Sync {
		l.q = newQueue(opts.Queue)
		l.q.status = Status{File: l.f.Name(), Writer: l.id}
		go l.run()
	}
	return l, nil
}

// register opens the node's ledger and chain and enters this writer in
// the ledger, with the chain's head as it starts.
func (l *Log) register() error {
	led, err := openLedger(l.dir, l.node)
	if err != nil {
		return err
	}
	l.led = led
	if err := l.openCurrent(); err != nil {
		return err
	}
	if err := l.lockChain(); err != nil {
		return err
	}
	defer l.unlockChain()
	l.start = l.opts.Clock().UTC()
	id, err := l.appendLedger(&LedgerEntry{Time: l.start, Kind: LedgerOpen, Node: l.opts.Node, PID: l.pid, Start: l.start,
		ChainSeq: l.seq, ChainHead: l.prev}, false)
	if err != nil {
		return err
	}
	l.id = id
	l.lastSeal = l.start
	if err := tryLockRange(l.led, writerLockBase+int64(id), 1); err != nil {
		return fmt.Errorf("ledger: hold writer %d: %w", id, err)
	}
	return nil
}

// openCurrent opens the newest file of the node's chain, or starts the
// chain.
func (l *Log) openCurrent() error {
	for {
		ents, err := os.ReadDir(l.dir)
		if err != nil {
			return fmt.Errorf("read audit directory: %w", err)
		}
		var cur, before parsedName
		var curName, beforeName string
		for _, e := range ents {
			p := parseName(e.Name())
			if p.kind != nodeChainFile || p.w.node != l.node {
				continue
			}
			if p.n > cur.n {
				before, beforeName = cur, curName
				cur, curName = p, e.Name()
			} else if p.n > before.n {
				before, beforeName = p, e.Name()
			}
		}
		if curName == "" {
			day := l.opts.Clock().UTC().Format(dayLayout)
			f, err := l.create(chainFileName(l.node, day, 1))
			if errors.Is(err, fs.ErrExist) {
				continue // another writer started the chain first
			}
			if err != nil {
				return err
			}
			l.f, l.ws, l.fileN, l.fileDay, l.size = f, f, 1, day, 0
			return nil
		}
		if fi, err := os.Stat(filepath.Join(l.dir, curName)); err == nil && fi.Size() == 0 && cur.n > 1 {
			// A rotation made it and may still be under way: start from the
			// file before, whose lock the rotating writer holds until its
			// checkpoint names this one, and follow that checkpoint.
			if beforeName == "" || before.n != cur.n-1 {
				return fmt.Errorf("audit chain of node %s: file %d is missing, the chain can't be continued", l.node, cur.n-1)
			}
			cur, curName = before, beforeName
		}
		f, err := os.OpenFile(filepath.Join(l.dir, curName), os.O_RDWR|os.O_APPEND, 0)
		if err != nil {
			return fmt.Errorf("open audit chain: %w", err)
		}
		l.f, l.ws, l.fileN, l.fileDay = f, f, cur.n, cur.day.Format(dayLayout)
		return nil
	}
}

func (l *Log) setHead(line []byte) error {
	if line == nil {
		l.seq, l.prev, l.last = 0, "", lineFields{}
		return nil
	}
	lf, err := parseLineFields(line)
	if err != nil {
		return fmt.Errorf("audit chain of node %s: %w", l.node, err)
	}
	sum := sha256.Sum256(line)
	l.seq, l.prev, l.last = lf.Seq, hex.EncodeToString(sum[:]), lf
	return nil
}

// lockChain takes the chain's append lock and brings this writer's view
// of the chain up to date: records other writers appended, a rotation to
// a newer file, a partial line a crashed writer left (cut off).
func (l *Log) lockChain() error {
	for {
		if err := lockRange(l.f, 0, 0); err != nil {
			return err
		}
		if err := l.refresh(); err != nil {
			l.unlockChain()
			return err
		}
		if l.size == 0 || l.last.Kind != KindCheckpoint || l.last.Reason != "rotate" {
			return nil
		}
		// Another writer rotated: follow it.
		p := parseName(l.last.Next)
		if p.kind != nodeChainFile || p.w.node != l.node || p.n != l.fileN+1 {
			l.unlockChain()
			return fmt.Errorf("audit chain: rotation checkpoint names %q as the next file", l.last.Next)
		}
		next, err := os.OpenFile(filepath.Join(l.dir, l.last.Next), os.O_RDWR|os.O_APPEND, 0)
		l.unlockChain()
		if err != nil {
			return fmt.Errorf("audit chain: %w", err)
		}
		l.f.Close()
		l.f, l.ws, l.fileN, l.fileDay, l.size = next, next, p.n, p.day.Format(dayLayout), 0
	}
}

func (l *Log) unlockChain() { unlockRange(l.f, 0, 0) }

// A synchronous writer that records in bursts (a session's projection
// serving a command, the records of one tool call) keeps the chain lock
// from one record to the next while the burst lasts (records l.gap apart
// at most, for l.most at a stretch), which saves the lock, fstat and
// unlock of each record; a timer lets it go after the burst. A writer
// recording now and then takes and releases the lock for each record.
// (Measured: the timer's wakeups cost less than the three system calls a
// record saves.) Like the queued writer, it stretches the burst where the
// lock is dear (holds): on CephFS a tool write's records are a few
// milliseconds apart, each lock, fstat and unlock a round trip to the
// metadata server.

// acquire takes the chain lock unless this writer still holds it.
func (l *Log) acquire() error {
	if l.held {
		return nil
	}
	return l.lockChain()
}

// keep decides, after a record, whether to keep the chain lock.
func (l *Log) keep() {
	now := time.Now()
	burst := now.Sub(l.lastRec) < l.gap
	l.lastRec = now
	switch {
	case l.held && now.Sub(l.heldAt) < l.most:
	case burst && !l.held && l.broken == nil:
		l.held, l.heldAt = true, now
		if l.release == nil {
			l.release = time.AfterFunc(l.gap, l.expire)
		} else {
			l.release.Reset(l.gap)
		}
	default:
		l.letGo()
	}
}

// expire lets the lock go once no record came for l.gap, or it was kept
// l.most.
func (l *Log) expire() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.held {
		return
	}
	now := time.Now()
	if idle := now.Sub(l.lastRec); idle < l.gap && now.Sub(l.heldAt) < l.most {
		l.release.Reset(l.gap - idle)
		return
	}
	l.letGo()
}

// letGo lets the chain lock go, and takes what that cost as the measure
// of the lock's cost for the next burst (as the queued writer does).
func (l *Log) letGo() {
	l.held = false
	if l.f != nil {
		start := time.Now()
		l.unlockChain()
		l.gap, l.most, _ = holds(3 * time.Since(start))
	}
}

// refresh rereads the chain's last line if the file changed since this
// writer last wrote it.
func (l *Log) refresh() error {
	fi, err := l.f.Stat()
	if err != nil {
		return fmt.Errorf("audit chain: %w", err)
	}
	size := fi.Size()
	if size == l.size {
		return nil
	}
	line, end, err := lastLine(l.f, size)
	if err != nil {
		return err
	}
	if end < size { // a writer died mid-record: cut its partial line off
		if err := l.f.Truncate(end); err != nil {
			return fmt.Errorf("audit chain: cut partial record: %w", err)
		}
	}
	l.size = end
	if line == nil && l.fileN > 1 {
		return nil // an empty file after a rotation: the head is the checkpoint's
	}
	return l.setHead(line)
}

// Record appends e to the node's chain, stamped with time, node, pid,
// writer, sequence number and the previous record's hash. A queued Log
// stamps and queues it and returns; the record is written moments later,
// in order (see "Queued writers" in the package doc). ctx is not used to
// abandon the write: a record of something that happened is kept even if
// the caller has given up. The error wraps ErrUnavailable.
func (l *Log) Record(ctx context.Context, e Event) error {
	if l.q != nil {
		return l.enqueue(e)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.usable(); err != nil {
		return err
	}
	if err := l.acquire(); err != nil {
		return l.fail(err)
	}
	defer l.keep()
	e, d, err := frozen(e)
	if err != nil {
		return err
	}
	recs := [1]queued{{t: l.opts.Clock().UTC(), e: e, detail: d}}
	if _, err := l.write(recs[:]); err != nil {
		return l.fail(err)
	}
	return nil
}

// write appends recs to the chain, the chain lock held: each encoded and
// chained to the one before, all in one write(2) unless the chain rotates
// among them. It returns how many are in the chain; after a failure the
// rest are not, and the chain ends at the last of those.
func (l *Log) write(recs []queued) (int, error) {
	buf := l.group[:0]
	defer func() {
		if cap(buf) <= 1<<20 {
			l.group = buf[:0]
		}
	}()
	from := 0 // the first record in buf
	seq, prev := l.seq, l.prev
	for i := range recs {
		r := &recs[i]
		line, err := l.encodeEvent(r, seq+1, prev)
		if err != nil {
			if ferr := l.flush(buf, i-from, seq, prev); ferr != nil {
				return from, ferr
			}
			return i, err
		}
		if end := l.size + int64(len(buf)); end > 0 && (end+int64(line.Len()) > l.opts.MaxFileBytes || !l.today(r.t)) {
			line.Free()
			if err := l.flush(buf, i-from, seq, prev); err != nil {
				return from, err
			}
			buf, from = buf[:0], i
			if err := l.rotate(r.t); err != nil {
				return i, err
			}
			seq, prev = l.seq, l.prev
			if line, err = l.encodeEvent(r, seq+1, prev); err != nil {
				return i, err
			}
		}
		sum := sha256.Sum256(line.Bytes())
		seq, prev = seq+1, hex.EncodeToString(sum[:])
		buf = append(buf, line.Bytes()...)
		line.Free()
	}
	if err := l.flush(buf, len(recs)-from, seq, prev); err != nil {
		return from, err
	}
	l.lastErr = nil
	if now := recs[len(recs)-1].t; l.key != nil && now.Sub(l.lastSeal) >= l.opts.SealEvery {
		if err := l.seal(now, "interval"); err != nil {
			l.lastErr = fmt.Errorf("%w: seal: %w", ErrUnavailable, err) // the records themselves are kept
		}
	}
	return len(recs), nil
}

// flush writes n encoded event lines, the chain lock held, and advances
// the chain to seq and prev, the last of them. A partly written group is
// cut off again so the file stays a chain; if even that fails the Log
// refuses every later record.
func (l *Log) flush(buf []byte, n int, seq uint64, prev string) error {
	if n == 0 {
		return nil
	}
	l.room.keep(l.f, l.size+int64(len(buf)))
	w, err := l.ws.Write(buf)
	if err != nil {
		l.cutOff(w)
		return l.writeErr(err)
	}
	l.seq, l.prev, l.last = seq, prev, lineFields{Kind: KindEvent, Seq: seq}
	l.size += int64(w)
	l.records += uint64(n)
	l.events += uint64(n)
	l.lastSeq, l.lastHash = seq, prev
	if l.opts.Sync {
		if err := l.ws.Sync(); err != nil {
			return fmt.Errorf("sync %s: %w", l.f.Name(), err)
		}
	}
	return nil
}

// Close writes what is queued, syncs the chain, deregisters the writer in
// the ledger with its count and last record, signs the heads if it has a
// key (a seal is always synced) and closes its files.
// A Log whose chain could not be written, or whose queue could not be
// written out (Close retries for closeRetry), ends without a close entry;
// Verify reports it as a writer that ended without closing.
func (l *Log) Close() error {
	lost := l.drain()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	if l.release != nil {
		l.release.Stop()
	}
	err := l.broken
	if err == nil && lost != nil {
		err = lost
	}
	if err == nil {
		err = l.closeEntry()
	} else {
		l.letGo()
	}
	if cerr := l.closeFiles(); err == nil {
		err = cerr
	}
	if err != nil {
		err = l.fail(err)
	}
	if q := l.q; q != nil {
		q.mu.Lock()
		q.status.Closed, q.status.Err = true, err
		q.mu.Unlock()
	}
	return err
}

func (l *Log) closeEntry() error {
	if err := l.acquire(); err != nil {
		return err
	}
	defer l.letGo()
	now := l.opts.Clock().UTC()
	if err := l.f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", l.f.Name(), err)
	}
	if _, err := l.appendLedger(&LedgerEntry{Time: now, Kind: LedgerClose, Node: l.opts.Node, PID: l.pid, Writer: l.id,
		Count: l.events, LastSeq: l.lastSeq, LastHash: l.lastHash, ChainSeq: l.seq, ChainHead: l.prev}, l.opts.Sync); err != nil {
		return err
	}
	return l.seal(now, "close")
}

// closeFiles closes the chain and the ledger, which releases the writer's
// liveness lock.
func (l *Log) closeFiles() error {
	var err error
	if l.f != nil {
		err = l.f.Close()
	}
	if l.led != nil {
		if cerr := l.led.Close(); err == nil {
			err = cerr
		}
	}
	return err
}

// Status describes a Log's health, for operators and health checks.
type Status struct {
	File    string // chain file being written
	Writer  uint64 // the writer's number in its node's ledger
	Records uint64 // records this writer wrote, checkpoints included
	Err     error  // the last failure; nil once a later write succeeded
	Closed  bool
	// A queued Log's queue: records accepted and not yet written, and
	// writes of them that failed (each retried).
	Queued int
	Failed uint64
}

// Status reports the current file, how much was written and queued, and
// the last error. Of a queued Log it reports the state after the writer's
// last write, without waiting for the one under way.
func (l *Log) Status() Status {
	if q := l.q; q != nil {
		q.mu.Lock()
		defer q.mu.Unlock()
		st := q.status
		st.Queued, st.Failed = len(q.recs), q.failed
		if q.err != nil {
			st.Err = q.err
		}
		return st
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	err := l.lastErr
	if l.broken != nil {
		err = l.broken
	}
	return Status{File: l.f.Name(), Writer: l.id, Records: l.records, Err: err, Closed: l.closed}
}

func (l *Log) usable() error {
	switch {
	case l.closed:
		return fmt.Errorf("%w: log closed", ErrUnavailable)
	case l.broken != nil:
		return l.broken
	}
	return nil
}

// fail remembers err for Status and wraps it in ErrUnavailable.
func (l *Log) fail(err error) error {
	err = unavailable(err)
	l.lastErr = err
	return err
}

func unavailable(err error) error {
	if !errors.Is(err, ErrUnavailable) {
		err = fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return err
}

// cutOff removes the n bytes a failed write left at the end of the file.
func (l *Log) cutOff(n int) {
	if n == 0 {
		return
	}
	if err := l.f.Truncate(l.size); err != nil {
		l.broken = fmt.Errorf("%w: %s holds a partial record that could not be removed: %w", ErrUnavailable, l.f.Name(), err)
	}
}

func (l *Log) writeErr(err error) error {
	if _, ok := errors.AsType[*fs.PathError](err); !ok {
		err = fmt.Errorf("write %s: %w", l.f.Name(), err)
	}
	return err
}

// append writes one encoded line (a checkpoint), the chain lock held, and
// advances the chain over exactly those bytes. A partly written line is
// cut off again so the file stays a chain; if even that fails the Log
// refuses every later record.
func (l *Log) append(line []byte, lf lineFields) error {
	l.room.keep(l.f, l.size+int64(len(line)))
	n, err := l.ws.Write(line)
	if err != nil {
		l.cutOff(n)
		return l.writeErr(err)
	}
	sum := sha256.Sum256(line)
	l.prev = hex.EncodeToString(sum[:])
	l.size += int64(n)
	l.seq = lf.Seq
	l.last = lf
	l.records++
	if l.opts.Sync {
		if err := l.ws.Sync(); err != nil {
			return fmt.Errorf("sync %s: %w", l.f.Name(), err)
		}
	}
	return nil
}

// rotate moves the chain to its next file, the chain lock held. The next
// file is created and locked before the checkpoint naming it is written,
// so a chain whose last file ends in a "rotate" checkpoint has always
// lost a file, and no other writer can append to the new file first.
func (l *Log) rotate(now time.Time) error {
	day := now.Format(dayLayout)
	name := chainFileName(l.node, day, l.fileN+1)
	next, err := l.create(name)
	if errors.Is(err, fs.ErrExist) {
		// A rotation that died before its checkpoint left it, empty.
		next, err = os.OpenFile(filepath.Join(l.dir, name), os.O_RDWR|os.O_APPEND, 0)
		if err == nil {
			if fi, serr := next.Stat(); serr != nil || fi.Size() != 0 {
				next.Close()
				err = fmt.Errorf("audit chain: next file %s exists and is not empty", name)
			}
		}
	}
	if err != nil {
		return err
	}
	if err := lockRange(next, 0, 0); err != nil {
		next.Close()
		return err
	}
	first, err := firstLine(l.f)
	if err != nil {
		next.Close()
		return err
	}
	var count uint64
	if first != nil {
		lf, err := parseLineFields(first)
		if err != nil {
			next.Close()
			return err
		}
		count = l.seq - lf.Seq + 1
	}
	if err := l.checkpoint(now, "rotate", count, name); err != nil {
		next.Close()
		return err
	}
	old := l.f
	l.f, l.ws, l.fileN, l.fileDay, l.size = next, next, l.fileN+1, day, 0
	err = old.Sync()
	if cerr := old.Close(); err == nil { // closing releases its lock
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync %s: %w", old.Name(), err)
	}
	if err := l.seal(now, "rotate"); err != nil {
		l.lastErr = fmt.Errorf("%w: seal: %w", ErrUnavailable, err)
	}
	return nil
}

// checkpoint ends a file: count is the number of records in it before
// the checkpoint, next the name of the file that continues the chain.
func (l *Log) checkpoint(now time.Time, reason string, count uint64, next string) error {
	f := append(l.fields[:0],
		zap.String("kind", KindCheckpoint),
		zap.Uint64("seq", l.seq+1),
		zap.String("prev", l.prev),
		zap.Uint64("count", count),
		zap.String("head", l.prev),
		zap.String("reason", reason),
		zap.String("next", next),
	)
	l.fields = f
	buf, err := l.enc.EncodeEntry(zapcore.Entry{Time: now}, f)
	if err != nil {
		return fmt.Errorf("encode checkpoint: %w", err)
	}
	defer buf.Free()
	return l.append(buf.Bytes(), lineFields{Kind: KindCheckpoint, Seq: l.seq + 1, Reason: reason, Next: next})
}

func (l *Log) encodeEvent(r *queued, seq uint64, prev string) (*buffer.Buffer, error) {
	e := &r.e
	f := append(l.fields[:0],
		zap.String("kind", KindEvent),
		zap.Uint64("seq", seq),
		zap.String("prev", prev),
	)
	f = appendString(f, "trace_id", e.TraceID)
	f = appendString(f, "call_id", e.CallID)
	if e.Actor != (Actor{}) {
		l.actor = actorFields(e.Actor)
		f = append(f, zap.Object("actor", &l.actor))
	}
	f = appendString(f, "scope", e.Scope)
	f = appendString(f, "source", string(e.Source))
	f = appendString(f, "op", e.Op)
	f = appendPath(f, "path", e.Path)
	f = appendPath(f, "new_path", e.NewPath)
	if e.Bytes != 0 {
		f = append(f, zap.Int64("bytes", e.Bytes))
	}
	f = appendString(f, "sha256", e.SHA256)
	f = appendString(f, "result", e.Result)
	f = appendString(f, "code", e.Code)
	if e.Duration != 0 {
		f = append(f, zap.Int64("duration_ns", int64(e.Duration)))
	}
	if len(r.detail) > 0 {
		f = append(f, zap.Object("detail", r.detail))
	}
	l.fields = f
	buf, err := l.enc.EncodeEntry(zapcore.Entry{Time: r.t}, f)
	if err != nil {
		return nil, fmt.Errorf("encode record: %w", err)
	}
	return buf, nil
}

// today reports whether t falls on the day of the chain's current file
// (without Format's allocation: it is asked for every record).
func (l *Log) today(t time.Time) bool {
	var b [len(dayLayout)]byte
	return string(t.AppendFormat(b[:0], dayLayout)) == l.fileDay
}

func appendString(f []zapcore.Field, key, val string) []zapcore.Field {
	if val == "" {
		return f
	}
	return append(f, zap.String(key, val))
}

// appendPath adds a path, and its exact bytes in base64 when it is not valid
// UTF-8, which JSON would otherwise replace with U+FFFD.
func appendPath(f []zapcore.Field, key, val string) []zapcore.Field {
	if val == "" {
		return f
	}
	f = append(f, zap.String(key, val))
	if !utf8.ValidString(val) {
		f = append(f, zap.String(key+"_b64", base64.StdEncoding.EncodeToString([]byte(val))))
	}
	return f
}

// detailList is an event's detail, sorted by key, encoded without
// reflection for the values doors put there (a release through the mount
// has one, and there is one for every file written).
type detailList []detailField

type detailField struct {
	key string
	val any
}

func (d detailList) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	for _, f := range d {
		switch v := f.val.(type) {
		case string:
			enc.AddString(f.key, v)
		case bool:
			enc.AddBool(f.key, v)
		case int:
			enc.AddInt(f.key, v)
		case int64:
			enc.AddInt64(f.key, v)
		case uint32:
			enc.AddUint32(f.key, v)
		case uint64:
			enc.AddUint64(f.key, v)
		default:
			if err := enc.AddReflected(f.key, v); err != nil {
				return err
			}
		}
	}
	return nil
}

type actorFields Actor

func (a *actorFields) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	for _, kv := range [...]struct{ k, v string }{
		{"space", a.Space}, {"agent", a.Agent}, {"session", a.Session},
		{"run", a.Run}, {"instance", a.Instance}, {"container", a.Container}, {"operator", a.Operator},
	} {
		if kv.v != "" {
			enc.AddString(kv.k, kv.v)
		}
	}
	return nil
}

func encodeTime(t time.Time, enc zapcore.PrimitiveArrayEncoder) {
	var b [len(time.RFC3339Nano) + 8]byte
	enc.AppendByteString(t.UTC().AppendFormat(b[:0], time.RFC3339Nano))
}

// create makes a new chain file (mode 0600, O_EXCL) and syncs the
// directory so the new name survives a crash.
func (l *Log) create(name string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(l.dir, name), os.O_RDWR|os.O_APPEND|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syncDir(l.dir); err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, err
	}
	return f, nil
}

// makeDir creates dir, or checks that it is a real directory (not a
// symlink) and tightens it to 0700.
func makeDir(dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory (%s)", dir, fi.Mode().Type())
	}
	if fi.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return err
		}
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}
