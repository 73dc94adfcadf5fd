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
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"
	"go.uber.org/zap/buffer"
	"go.uber.org/zap/zapcore"
)

// DefaultMaxFileBytes is the size at which a Log starts a new file when
// Options.MaxFileBytes is zero.
const DefaultMaxFileBytes = 64 << 20

// Options tune a Log. The zero value is ready to use.
type Options struct {
	// Node names this worker node in records and file names; default the
	// host name. Two nodes sharing a root must use different names.
	Node string
	// MaxFileBytes starts a new file of the chain once the current one
	// would grow past it; default DefaultMaxFileBytes.
	MaxFileBytes int64
	// Sync makes every Record fsync before it returns, for callers that
	// need each record durable before the operation goes ahead. Without it
	// records reach the kernel at once (they survive a crash of loomfs, not
	// of the machine); rotation and Close always sync.
	Sync bool
	// Clock returns the time stamped on records; default time.Now.
	Clock func() time.Time
}

// Log is a Sink that appends hash-chained records to files only it writes.
// Its methods are safe for concurrent use: records are serialised, so
// concurrent goroutines produce one valid chain.
type Log struct {
	dir    string
	writer string // file name stem: <node>-<pid>-<start>
	opts   Options
	enc    zapcore.Encoder // JSON, with node and pid already added

	mu      sync.Mutex
	f       *os.File
	ws      zapcore.WriteSyncer // f, seen through zap
	fileSeq int                 // number of the current file, from 1
	size    int64               // bytes of complete records in the current file
	seq     uint64              // seq of the last record written
	events  uint64              // event records written
	prev    string              // hex sha256 of the last line written
	fields  []zapcore.Field     // reused per record, under mu
	actor   actorFields         // reused per record, under mu
	lastErr error               // last failure; nil after a success
	broken  error               // set when the chain can no longer be continued
	closed  bool
}

var _ Sink = (*Log)(nil)

// Open starts a new chain in root's audit directory, creating the directory
// (mode 0700) if it is missing but never root itself. Its first file (mode
// 0600) is created at once, so an unwritable log is reported here.
func Open(root string, opts Options) (*Log, error) {
	if opts.Node == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("%w: node name: %w", ErrUnavailable, err)
		}
		opts.Node = h
	}
	if opts.MaxFileBytes <= 0 {
		opts.MaxFileBytes = DefaultMaxFileBytes
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	dir := Dir(root)
	if err := makeDir(dir); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	pid := os.Getpid()
	enc := zapcore.NewJSONEncoder(zapcore.EncoderConfig{
		TimeKey:    "time",
		EncodeTime: encodeTime,
		LineEnding: "\n",
	})
	enc.AddString("node", opts.Node)
	enc.AddInt("pid", pid)
	l := &Log{dir: dir, opts: opts, enc: enc}

	// The start time makes the name unique per process; O_EXCL makes sure,
	// should a clock repeat itself.
	start := opts.Clock().UTC()
	for try := 0; ; try++ {
		l.writer = fileNode(opts.Node) + "-" + strconv.Itoa(pid) + "-" + start.Format(startLayout)
		f, err := l.create(1)
		if errors.Is(err, fs.ErrExist) && try < 1000 {
			start = start.Add(time.Nanosecond)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		l.f, l.ws, l.fileSeq = f, f, 1
		return l, nil
	}
}

// Record appends e to the chain, stamped with time, node, pid, sequence
// number and the previous record's hash. ctx is not used to abandon the
// write: a record of something that happened is kept even if the caller has
// given up. The error wraps ErrUnavailable.
func (l *Log) Record(ctx context.Context, e Event) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.usable(); err != nil {
		return err
	}
	now := l.opts.Clock().UTC()
	buf, err := l.encodeEvent(now, &e)
	if err != nil {
		return l.fail(err)
	}
	if l.size > 0 && l.size+int64(buf.Len()) > l.opts.MaxFileBytes {
		buf.Free()
		if err := l.rotate(now); err != nil {
			return l.fail(err)
		}
		if buf, err = l.encodeEvent(now, &e); err != nil {
			return l.fail(err)
		}
	}
	err = l.append(buf.Bytes())
	buf.Free()
	if err != nil {
		return l.fail(err)
	}
	l.events++
	l.lastErr = nil
	return nil
}

// Close ends the chain with a checkpoint, syncs and closes the file. A Log
// whose file could not be written ends without one; Verify reports such a
// chain as open, not broken.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	err := l.broken
	if err == nil {
		err = l.checkpoint(l.opts.Clock().UTC(), "close")
		if err == nil {
			err = l.f.Sync()
		}
	}
	if cerr := l.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return l.fail(err)
	}
	return nil
}

// Status describes a Log's health, for operators and health checks.
type Status struct {
	File    string // file being written
	Records uint64 // records written to the chain, checkpoints included
	Err     error  // the last failure; nil once a later write succeeded
	Closed  bool
}

// Status reports the current file, how much was written and the last error.
func (l *Log) Status() Status {
	l.mu.Lock()
	defer l.mu.Unlock()
	err := l.lastErr
	if l.broken != nil {
		err = l.broken
	}
	return Status{File: l.path(l.fileSeq), Records: l.seq, Err: err, Closed: l.closed}
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
	if !errors.Is(err, ErrUnavailable) {
		err = fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	l.lastErr = err
	return err
}

// append writes one encoded line and advances the chain over exactly those
// bytes. A partly written line is cut off again so the file stays a chain;
// if even that fails the Log refuses every later record.
func (l *Log) append(line []byte) error {
	n, err := l.ws.Write(line)
	if err != nil {
		if _, ok := errors.AsType[*fs.PathError](err); !ok {
			err = fmt.Errorf("write %s: %w", l.f.Name(), err)
		}
		if n > 0 {
			if terr := l.f.Truncate(l.size); terr != nil {
				l.broken = fmt.Errorf("%w: %s holds a partial record that could not be removed: %w", ErrUnavailable, l.f.Name(), terr)
			}
		}
		return err
	}
	sum := sha256.Sum256(line)
	l.prev = hex.EncodeToString(sum[:])
	l.size += int64(n)
	l.seq++
	if l.opts.Sync {
		if err := l.ws.Sync(); err != nil {
			return fmt.Errorf("sync %s: %w", l.f.Name(), err)
		}
	}
	return nil
}

// rotate moves the chain to its next file. The next file is created before
// the checkpoint is written, so a chain whose last file ends in a "rotate"
// checkpoint has always lost a file.
func (l *Log) rotate(now time.Time) error {
	next, err := l.create(l.fileSeq + 1)
	if err != nil {
		return err
	}
	if err := l.checkpoint(now, "rotate"); err != nil {
		next.Close()
		os.Remove(next.Name())
		return err
	}
	old := l.f
	l.f, l.ws = next, next
	l.fileSeq++
	l.size = 0
	if err := old.Sync(); err != nil {
		old.Close()
		return fmt.Errorf("sync %s: %w", old.Name(), err)
	}
	if err := old.Close(); err != nil {
		return fmt.Errorf("close %s: %w", old.Name(), err)
	}
	return nil
}

func (l *Log) checkpoint(now time.Time, reason string) error {
	f := append(l.fields[:0],
		zap.String("kind", KindCheckpoint),
		zap.Uint64("seq", l.seq+1),
		zap.String("prev", l.prev),
		zap.Uint64("count", l.events),
		zap.String("head", l.prev),
		zap.String("reason", reason),
	)
	l.fields = f
	buf, err := l.enc.EncodeEntry(zapcore.Entry{Time: now}, f)
	if err != nil {
		return fmt.Errorf("encode checkpoint: %w", err)
	}
	defer buf.Free()
	return l.append(buf.Bytes())
}

func (l *Log) encodeEvent(now time.Time, e *Event) (*buffer.Buffer, error) {
	f := append(l.fields[:0],
		zap.String("kind", KindEvent),
		zap.Uint64("seq", l.seq+1),
		zap.String("prev", l.prev),
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
	if len(e.Detail) > 0 {
		f = append(f, zap.Object("detail", detailFields(e.Detail)))
	}
	l.fields = f
	buf, err := l.enc.EncodeEntry(zapcore.Entry{Time: now}, f)
	if err != nil {
		return nil, fmt.Errorf("encode record: %w", err)
	}
	return buf, nil
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

// detailFields encodes an event's detail without reflection for the
// values doors put there (a release through the mount has one, and there
// is one for every file written), keys sorted as encoding/json sorts them.
type detailFields map[string]any

func (d detailFields) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	var buf [8]string
	keys := buf[:0]
	for k := range d {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		switch v := d[k].(type) {
		case string:
			enc.AddString(k, v)
		case bool:
			enc.AddBool(k, v)
		case int:
			enc.AddInt(k, v)
		case int64:
			enc.AddInt64(k, v)
		case uint32:
			enc.AddUint32(k, v)
		case uint64:
			enc.AddUint64(k, v)
		default:
			if err := enc.AddReflected(k, v); err != nil {
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
	enc.AppendString(t.UTC().Format(time.RFC3339Nano))
}

// create makes file number seq of the chain and syncs the directory so the
// new name survives a crash.
func (l *Log) create(seq int) (*os.File, error) {
	f, err := os.OpenFile(l.path(seq), os.O_WRONLY|os.O_APPEND|os.O_CREATE|os.O_EXCL, 0o600)
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

func (l *Log) path(seq int) string {
	return filepath.Join(l.dir, fileName(l.writer, seq))
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

// File names: <node>-<pid>-<start>.<n>.jsonl. The start time has no '-' and
// n has no '.', so a name parses from the right whatever the node is called.
const (
	fileExt     = ".jsonl"
	startLayout = "20060102T150405.000000000Z"
)

func fileName(writer string, seq int) string {
	return fmt.Sprintf("%s.%06d%s", writer, seq, fileExt)
}

// fileNode makes a node name safe for a file name.
func fileNode(node string) string {
	var b strings.Builder
	for _, r := range node {
		switch {
		case b.Len() >= 64:
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	if b.Len() == 0 {
		return "node"
	}
	return b.String()
}

// writerID identifies one chain: one Log of one process on one node.
type writerID struct {
	id    string // file name stem
	node  string // as in the file name
	pid   int
	start time.Time
}

// parseFileName splits a chain file's name into its writer and file number.
func parseFileName(name string) (writerID, int, bool) {
	stem, ok := strings.CutSuffix(name, fileExt)
	if !ok {
		return writerID{}, 0, false
	}
	dot := strings.LastIndexByte(stem, '.')
	if dot < 0 {
		return writerID{}, 0, false
	}
	seq, err := strconv.Atoi(stem[dot+1:])
	if err != nil || seq < 1 {
		return writerID{}, 0, false
	}
	w := writerID{id: stem[:dot]}
	rest := w.id
	i := strings.LastIndexByte(rest, '-')
	if i < 0 {
		return writerID{}, 0, false
	}
	if w.start, err = time.Parse(startLayout, rest[i+1:]); err != nil {
		return writerID{}, 0, false
	}
	rest = rest[:i]
	i = strings.LastIndexByte(rest, '-')
	if i <= 0 {
		return writerID{}, 0, false
	}
	if w.pid, err = strconv.Atoi(rest[i+1:]); err != nil {
		return writerID{}, 0, false
	}
	w.node = rest[:i]
	return w, seq, true
}
