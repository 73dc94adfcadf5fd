package audit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/ofdlock"
)

// File names. A node's chain is <node>.<day>.<n>.jsonl, n counting the
// files of the chain from 1 and day (UTC, 20060102) the day of every event
// in the file, so a query by time opens only the files of its days. The
// node's ledger of writers is <node>.ledger.jsonl. Files written before
// the ledger existed, one chain per process, are named
// <node>-<pid>-<start>.<n>.jsonl (the legacy format): they are still read
// and verified, without the ledger's guarantees.
const (
	fileExt     = ".jsonl"
	ledgerExt   = ".ledger.jsonl"
	dayLayout   = "20060102"
	startLayout = "20060102T150405.000000000Z"
)

// fileKind says what a name in the audit directory is.
type fileKind int

const (
	notAuditFile fileKind = iota
	legacyChainFile
	nodeChainFile
	ledgerFile
)

func chainFileName(node string, day string, n int) string {
	return fmt.Sprintf("%s.%s.%06d%s", node, day, n, fileExt)
}

func ledgerFileName(node string) string { return node + ledgerExt }

// legacyFileName is a per-process chain file's name, kept for tests.
func legacyFileName(writer string, seq int) string {
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

// writerID identifies one chain: a node's chain, or in the legacy format
// one process's.
type writerID struct {
	id    string // file name stem without the file number
	node  string // as in the file name
	pid   int    // legacy chains only
	start time.Time
	kind  fileKind
}

// parsedName is what a file name says.
type parsedName struct {
	kind fileKind
	w    writerID
	n    int       // file number
	day  time.Time // node chain files: the day of their events
}

// parseName reads an audit directory entry's name.
func parseName(name string) parsedName {
	if node, ok := strings.CutSuffix(name, ledgerExt); ok && node != "" {
		return parsedName{kind: ledgerFile, w: writerID{id: node, node: node, kind: ledgerFile}}
	}
	stem, ok := strings.CutSuffix(name, fileExt)
	if !ok {
		return parsedName{}
	}
	dot := strings.LastIndexByte(stem, '.')
	if dot < 0 {
		return parsedName{}
	}
	n, err := strconv.Atoi(stem[dot+1:])
	if err != nil || n < 1 || stem[dot+1] == '+' || stem[dot+1] == '-' {
		return parsedName{}
	}
	rest := stem[:dot]
	// <node>.<day>
	if i := strings.LastIndexByte(rest, '.'); i > 0 && len(rest)-i-1 == len(dayLayout) {
		if day, err := time.Parse(dayLayout, rest[i+1:]); err == nil {
			node := rest[:i]
			return parsedName{kind: nodeChainFile, n: n, day: day,
				w: writerID{id: node + ".chain", node: node, start: day, kind: nodeChainFile}}
		}
	}
	if w, ok := parseLegacy(rest); ok {
		return parsedName{kind: legacyChainFile, w: w, n: n}
	}
	return parsedName{}
}

// parseLegacy splits <node>-<pid>-<start>.
func parseLegacy(id string) (writerID, bool) {
	w := writerID{id: id, kind: legacyChainFile}
	rest := id
	i := strings.LastIndexByte(rest, '-')
	if i < 0 {
		return writerID{}, false
	}
	var err error
	if w.start, err = time.Parse(startLayout, rest[i+1:]); err != nil {
		return writerID{}, false
	}
	rest = rest[:i]
	i = strings.LastIndexByte(rest, '-')
	if i <= 0 {
		return writerID{}, false
	}
	if w.pid, err = strconv.Atoi(rest[i+1:]); err != nil {
		return writerID{}, false
	}
	w.node = rest[:i]
	return w, true
}

// lastLine returns the last complete line of the first size bytes of f,
// newline included (nil if there is none), and the offset just after it:
// less than size when a partial line follows.
func lastLine(f *os.File, size int64) ([]byte, int64, error) {
	if size <= 0 {
		return nil, 0, nil
	}
	win := int64(16 << 10)
	for {
		win = min(win, size)
		buf := make([]byte, win)
		if _, err := f.ReadAt(buf, size-win); err != nil && !errors.Is(err, io.EOF) {
			return nil, 0, fmt.Errorf("read %s: %w", f.Name(), err)
		}
		i := bytes.LastIndexByte(buf, '\n')
		if i < 0 && win < size {
			win *= 4
			continue
		}
		if i < 0 {
			return nil, 0, nil
		}
		j := bytes.LastIndexByte(buf[:i], '\n')
		if j < 0 && win < size {
			win *= 4
			continue
		}
		return buf[j+1 : i+1], size - win + int64(i) + 1, nil
	}
}

// firstLine returns the first line of f, newline included.
func firstLine(f *os.File) ([]byte, error) {
	buf := make([]byte, 16<<10)
	for {
		n, err := f.ReadAt(buf, 0)
		if i := bytes.IndexByte(buf[:n], '\n'); i >= 0 {
			return buf[:i+1], nil
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil, nil
			}
			return nil, fmt.Errorf("read %s: %w", f.Name(), err)
		}
		buf = make([]byte, 4*len(buf))
	}
}

// lineFields are the fields of a record or ledger entry that chain it.
type lineFields struct {
	Kind   string `json:"kind"`
	Seq    uint64 `json:"seq"`
	Reason string `json:"reason"`
	Next   string `json:"next"`
}

func parseLineFields(line []byte) (lineFields, error) {
	var lf lineFields
	if err := json.Unmarshal(line, &lf); err != nil {
		return lf, fmt.Errorf("last record is not valid: %w", err)
	}
	return lf, nil
}

// Locks. Appends to a chain file or a ledger are serialised with an open
// file description (OFD) lock: POSIX-style, so NFSv4 and CephFS carry it
// to every client, and per open file, so two Logs of one process exclude
// each other too. A chain file is locked whole. A ledger is locked at byte
// 0 to append; each writer also holds a lock on the byte at
// writerLockBase+its number for as long as it runs, so verify can tell a
// running writer from one that is gone.
const writerLockBase = 1 << 40

// appendBackoff paces a wait for an append lock, which is only ever held
// for a moment: the first retry after 20 µs.
var appendBackoff = ofdlock.Backoff{First: 20 * time.Microsecond, Most: 5 * time.Millisecond}

// lockRange takes a write lock on the range, polling (package ofdlock).
func lockRange(f *os.File, start, length int64) error {
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart, Start: start, Len: length}
	if err := ofdlock.Wait(context.Background(), f.Fd(), lk, appendBackoff); err != nil {
		return fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	return nil
}

// waitUnlocked waits until no writer holds a lock on f (a read lock,
// taken and let go, so it can be asked on a read-only file).
func waitUnlocked(f *os.File) error {
	lk := unix.Flock_t{Type: unix.F_RDLCK, Whence: io.SeekStart}
	if err := ofdlock.Wait(context.Background(), f.Fd(), lk, appendBackoff); err != nil {
		return fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	unlockRange(f, 0, 0)
	return nil
}

func tryLockRange(f *os.File, start, length int64) error {
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart, Start: start, Len: length}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk); err != nil {
		return fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	return nil
}

func unlockRange(f *os.File, start, length int64) {
	lk := unix.Flock_t{Type: unix.F_UNLCK, Whence: io.SeekStart, Start: start, Len: length}
	unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk)
}

// lockHeld reports whether another open file holds a lock on the range.
func lockHeld(f *os.File, start, length int64) (bool, error) {
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart, Start: start, Len: length}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_GETLK, &lk); err != nil {
		return false, fmt.Errorf("probe lock on %s: %w", f.Name(), err)
	}
	return lk.Type != unix.F_UNLCK, nil
}

// Room kept allocated past the end of the node's chain (chainRoom) and
// ledger (ledgerRoom) with fallocate(FALLOC_FL_KEEP_SIZE): when the volume
// fills up, records go on being written into it for a while, so reads and
// refusals are still recorded (and a writer's close entry still fits)
// while changes are refused for want of space. About 3,000 records.
const (
	chainRoom  = 1 << 20
	ledgerRoom = 64 << 10
)

// room is the part of a file allocated past its end, as this writer last
// made it.
type room struct {
	f       *os.File // the file it was allocated in
	to      int64    // allocated up to here
	retryAt int64    // after a failure, not tried again before the file reaches this
	refused bool     // the filesystem has no fallocate: don't ask again
}

// keep makes sure f has room allocated up to end and half of chainRoom
// past it, allocating chainRoom more from end when it has not. A
// filesystem that can't (CephFS, NFS before 4.2) or a volume already full
// is not an error: the write then takes its chances as it would without.
func (r *room) keep(f *os.File, end int64) {
	if r.refused || r.f == f && (end+chainRoom/2 <= r.to || end < r.retryAt) {
		return
	}
	r.f, r.to = f, 0
	switch err := allocate(f, end, chainRoom); {
	case err == nil:
		r.to = end + chainRoom
	case errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS):
		r.refused = true
	default:
		r.retryAt = end + chainRoom/16
	}
}

// allocate allocates n bytes of f from off without changing its size,
// where its filesystem has at least roomShare times n free: on a small
// volume, room kept ahead would take what the records need.
func allocate(f *os.File, off, n int64) error {
	c, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := c.Control(func(fd uintptr) {
		var st unix.Statfs_t
		if ferr = unix.Fstatfs(int(fd), &st); ferr != nil {
			return
		}
		if int64(st.Bavail)*st.Bsize < roomShare*n {
			ferr = unix.ENOSPC
			return
		}
		ferr = unix.Fallocate(int(fd), unix.FALLOC_FL_KEEP_SIZE, off, n)
	}); err != nil {
		return err
	}
	return ferr
}

// roomShare: room is kept ahead only on a volume with this many times as
// much free.
const roomShare = 4
