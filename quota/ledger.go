package quota

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/newname"
	"github.com/agentloom/loomfs/ofdlock"
	"github.com/agentloom/loomfs/policy"
)

// Names in the account's directory. Whatever another node must read is
// written whole under a temporary name and placed under a new name, its
// next version ("ledger.7", then "ledger.8"), before the old one is
// removed: a client of a distributed filesystem (ceph-fuse) may go on
// serving the old bytes of a file changed in place by another client, but
// reads a new name afresh; and a new name, unlike a rename over an old
// one, makes ext4 write nothing out (auto_da_alloc): 30 µs, not 1 ms. It
// is placed by package newname, not renamed: on CephFS another client's
// first lookup of a name made by rename(2) waits five seconds.
const (
	LedgerFile   = "ledger"      // what all holders have folded in: ledger.<version>
	ledgerLock   = "ledger.lock" // its lock orders every grant
	recordPrefix = "h-"          // a holder's record: h-<id>.<version> (its last sync)
	liveSuffix   = ".lock"       // and h-<id>.lock: locked while it lives, its live figures mapped
)

// ledger is the folded part of the account: what the scope held at the
// last count, plus everything holders have folded in since.
type ledger struct {
	Bytes int64 `json:"bytes"`
	Files int64 `json:"files"`
	// Unsure says a holder on another node died with a grant, counted as
	// spent whole while another node's holder was changing the scope, so
	// the ledger may count more than the scope holds: the next holder to
	// fold or reconcile with no other node's holder active counts the
	// scope again.
	Unsure bool `json:"unsure,omitempty"`
}

func (l ledger) usage() policy.Usage { return policy.Usage{Bytes: l.Bytes, Files: l.Files} }

// listDir lists the account's directory.
func listDir(dfd int) ([]string, error) {
	d, err := unix.Openat(dfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open quota dir: %w", err)
	}
	f := os.NewFile(uintptr(d), "quota")
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("list quota dir: %w", err)
	}
	return names, nil
}

// version is a file written in versions: base.<n>, the highest n the
// current one.
type version struct {
	base  string
	n     int64 // 0: none yet
	older []int64
}

// versionOf finds base's versions among names.
func versionOf(names []string, base string) version {
	v := version{base: base}
	for _, name := range names {
		s, ok := strings.CutPrefix(name, base+".")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 {
			continue
		}
		if n > v.n {
			if v.n > 0 {
				v.older = append(v.older, v.n)
			}
			v.n = n
		} else {
			v.older = append(v.older, n)
		}
	}
	return v
}

func (v version) name() string { return v.base + "." + strconv.FormatInt(v.n, 10) }

// read reads up to max bytes of the current version; nil if there is none.
func (v version) read(dfd int, max int) ([]byte, error) {
	if v.n == 0 {
		return nil, nil
	}
	return readFileAt(dfd, v.name(), max)
}

// publish writes b as the next version of v (through the temporary name
// tmp) and removes the ones before. It is not fsynced: a node that crashes
// loses its page cache, and the account is counted again.
func (v *version) publish(dfd int, tmp string, b []byte) error {
	// Made afresh, never truncated: a temporary name left over (by a
	// crash, or a placing whose removal of it failed) may be another
	// name of a version someone reads.
	create := func() (int, error) {
		return unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, policy.FilePerm)
	}
	fd, err := create()
	if err == unix.EEXIST {
		unix.Unlinkat(dfd, tmp, 0)
		fd, err = create()
	}
	if err != nil {
		return err
	}
	_, err = unix.Write(fd, b)
	unix.Close(fd)
	next := *v
	next.n++
	if err == nil {
		err = newname.Place(dfd, tmp, next.name())
	}
	if err != nil {
		unix.Unlinkat(dfd, tmp, 0)
		return err
	}
	v.older = append(v.older, v.n)
	for _, n := range v.older {
		if n > 0 {
			unix.Unlinkat(dfd, v.base+"."+strconv.FormatInt(n, 10), 0)
		}
	}
	v.n, v.older = next.n, nil
	return nil
}

// readLedger reads the ledger's current version; ok is false when there
// is none yet or it can't be read back, and the scope must be counted
// again.
func readLedger(dfd int, v version) (l ledger, ok bool, err error) {
	b, err := v.read(dfd, 256)
	if err != nil {
		return l, false, fmt.Errorf("read quota ledger: %w", err)
	}
	if b == nil || json.Unmarshal(bytes.TrimSpace(b), &l) != nil {
		return ledger{}, false, nil
	}
	return l, true, nil
}

func writeLedger(dfd int, tmp string, v *version, l ledger) error {
	b, _ := json.Marshal(l)
	if err := v.publish(dfd, tmp, append(b, '\n')); err != nil {
		return fmt.Errorf("write quota ledger: %w", err)
	}
	return nil
}

// readFileAt reads up to max bytes of name in dfd.
func readFileAt(dfd int, name string, max int) ([]byte, error) {
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	buf := make([]byte, max)
	n, err := unix.Pread(fd, buf, 0)
	if err != nil {
		return nil, err
	}
	return buf[:n], nil
}

// A record holds, at fixed offsets, what its holder still has as a grant,
// what it has spent (net, so a shrink is negative) and not folded into the
// ledger yet, and where it lives (nodeID).
const (
	recordMagic = "loomq02\n"
	recordSize  = 8 + 4*8 + nodeIDSize
	nodeIDSize  = 24
)

type record struct {
	grant, spent policy.Usage
}

func (r record) put(b []byte, node nodeID) {
	copy(b, recordMagic)
	binary.LittleEndian.PutUint64(b[8:], uint64(r.grant.Bytes))
	binary.LittleEndian.PutUint64(b[16:], uint64(r.grant.Files))
	binary.LittleEndian.PutUint64(b[24:], uint64(r.spent.Bytes))
	binary.LittleEndian.PutUint64(b[32:], uint64(r.spent.Files))
	copy(b[40:], node[:])
}

func parseRecord(b []byte) (record, nodeID, bool) {
	var node nodeID
	if len(b) < recordSize || string(b[:8]) != recordMagic {
		return record{}, node, false
	}
	copy(node[:], b[40:])
	return record{
		grant: policy.Usage{Bytes: int64(binary.LittleEndian.Uint64(b[8:])), Files: int64(binary.LittleEndian.Uint64(b[16:]))},
		spent: policy.Usage{Bytes: int64(binary.LittleEndian.Uint64(b[24:])), Files: int64(binary.LittleEndian.Uint64(b[32:]))},
	}, node, true
}

// nodeID tells whether a holder shares this process's page cache of the
// account's directory: the kernel's boot id and the directory's device.
// A holder with the same one is read from its live figures, which its
// mapping keeps current even after it died; any other from its last sync.
type nodeID [nodeIDSize]byte

func localNode(dfd int) nodeID {
	var id nodeID
	if b, err := os.ReadFile("/proc/sys/kernel/random/boot_id"); err == nil {
		copy(id[:16], strings.ReplaceAll(strings.TrimSpace(string(b)), "-", ""))
	}
	var st unix.Stat_t
	if unix.Fstat(dfd, &st) == nil {
		binary.LittleEndian.PutUint64(id[16:], st.Dev)
	}
	return id
}

// holder is another holder's record as read under the ledger lock.
type holder struct {
	id    string  // h-<id>
	snap  version // its last sync
	live  bool
	local bool // on this node: rec is its live figures
	rec   record
}

// holders reads the record of every holder listed in names but self.
// A holder whose lock nobody holds is gone.
func holders(dfd int, names []string, self string, node nodeID) ([]holder, error) {
	var hs []holder
	for _, name := range names {
		id, ok := strings.CutSuffix(name, liveSuffix)
		if !ok || !strings.HasPrefix(id, recordPrefix) || id == self {
			continue
		}
		h, ok, err := readHolder(dfd, id, versionOf(names, id), node)
		if err != nil {
			return nil, err
		}
		if ok {
			hs = append(hs, h)
		}
	}
	return hs, nil
}

// readHolder reads holder id, whose last sync is snap, and whether it is
// alive; ok is false when it is gone already.
func readHolder(dfd int, id string, snap version, node nodeID) (holder, bool, error) {
	fd, err := unix.Openat(dfd, id+liveSuffix, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err == unix.ENOENT {
		return holder{}, false, nil
	}
	if err != nil {
		return holder{}, false, fmt.Errorf("open quota record: %w", err)
	}
	defer unix.Close(fd)
	h := holder{id: id, snap: snap}
	lk := unix.Flock_t{Type: unix.F_WRLCK}
	if err := unix.FcntlFlock(uintptr(fd), unix.F_OFD_GETLK, &lk); err != nil {
		return holder{}, false, fmt.Errorf("test quota record lock: %w", err)
	}
	h.live = lk.Type != unix.F_UNLCK
	buf := make([]byte, recordSize)
	n, err := unix.Pread(fd, buf, 0)
	if err != nil {
		return holder{}, false, fmt.Errorf("read quota record: %w", err)
	}
	// Only a holder of this node is counted from its live record (another
	// node's stores are not seen here; its last sync is): read that one
	// until it settles.
	if onNode(buf[:n], node) {
		settled, ok, err := readSettled(fd, buf[:n])
		if err != nil {
			return holder{}, false, fmt.Errorf("read quota record: %w", err)
		}
		if rec, at, parsed := parseRecord(settled); ok && parsed && at == node {
			h.rec, h.local = rec, true
			return h, true, nil
		}
	}
	b, err := snap.read(dfd, recordSize)
	if err == unix.ENOENT {
		// Replaced since the listing: by a holder syncing while this
		// reader holds no lock. Gone, or counted at the next look.
		return holder{}, false, nil
	}
	if err != nil {
		return holder{}, false, fmt.Errorf("read quota record: %w", err)
	}
	// A record being made has no content yet: it holds nothing.
	h.rec, _, _ = parseRecord(b)
	return h, true, nil
}

// readSettled reads a live record again after first, a read of it already
// made, until two reads in a row agree and neither saw its holder storing
// (storeRecord), and reports whether that happened within settleWait. Its
// holder stores into it through a mapping, taking no lock, while a read
// copies it byte by byte: a read beside a store can see one figure new and
// the next old, or a figure half old, half new (0 and -1 read as 2^48-1).
func readSettled(fd int, first []byte) (settled []byte, ok bool, err error) {
	buf, again := first, make([]byte, recordSize)
	deadline := time.Now().Add(settleWait)
	for try := 0; ; try++ {
		m, err := unix.Pread(fd, again, 0)
		if err != nil {
			return nil, false, err
		}
		if bytes.Equal(buf, again[:m]) && string(buf[:min(len(buf), 8)]) == recordMagic {
			return buf, true, nil
		}
		buf, again = again[:m], buf[:recordSize]
		if try >= 100 {
			// A holder stopped half way through its store (preempted, or
			// stopped by a signal): wait a little, then give up on it.
			if time.Now().After(deadline) {
				return buf, false, nil
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
}

// settleWait bounds readSettled: a holder's record that does not settle
// in that time is counted from its last sync instead.
const settleWait = 20 * time.Millisecond

// recordBusy stands in a live record's magic while its holder stores new
// figures into it (storeRecord).
const recordBusy = "loomq02*"

// onNode reports whether b, a read of a live record, is that of a holder
// on node, whole or being stored.
func onNode(b []byte, node nodeID) bool {
	if len(b) < recordSize || string(b[:8]) != recordMagic && string(b[:8]) != recordBusy {
		return false
	}
	return nodeID(b[40:recordSize]) == node
}

// storeRecord stores r into mem, its holder's mapping of its live record,
// so that a reader on the node can tell a whole record from one half
// stored: the magic is replaced by recordBusy first and put back last, and
// every word is stored atomically, in that order.
func storeRecord(mem []byte, r record, node nodeID) {
	var b [recordSize]byte
	r.put(b[:], node)
	storeWord(mem, []byte(recordBusy))
	for off := 8; off < recordSize; off += 8 {
		storeWord(mem[off:], b[off:])
	}
	storeWord(mem, b[:])
}

// storeWord stores the 8 bytes of src at dst, 8-byte aligned, in one
// atomic store.
func storeWord(dst, src []byte) {
	atomic.StoreUint64((*uint64)(unsafe.Pointer(&dst[0])), binary.NativeEndian.Uint64(src))
}

// remove removes every file of a dead holder, the temporary ones it may
// have left (t-<id>…) among them.
func (h holder) remove(dfd int) {
	h.snap.older = append(h.snap.older, h.snap.n)
	for _, n := range h.snap.older {
		if n > 0 {
			unix.Unlinkat(dfd, h.id+"."+strconv.FormatInt(n, 10), 0)
		}
	}
	tmp := "t-" + strings.TrimPrefix(h.id, recordPrefix)
	for _, name := range []string{tmp, tmp + ".rec", tmp + ".ledger"} {
		unix.Unlinkat(dfd, name, 0)
	}
	unix.Unlinkat(dfd, h.id+liveSuffix, 0)
}

// ledgerBackoff paces a wait for the ledger lock, which is held only
// while a grant is taken or spending folded in: a read of the ledger, a
// listing of the records and, if it changed, a new ledger written.
var ledgerBackoff = ofdlock.Backoff{First: 100 * time.Microsecond, Most: 20 * time.Millisecond}

// lockLedger takes the OFD write lock on all of fd (the ledger's lock
// file), polling until ctx ends (package ofdlock), never waiting in
// F_OFD_SETLKW: on CephFS a lock held by a node that died stays held until
// the metadata server gives up on that node's session, about a minute, and
// a write or a tool call that needs a grant meanwhile answers at its
// budget instead of sitting in the kernel, holding the account's mutex
// and with it every other change this process makes to the scope.
func lockLedger(ctx context.Context, fd int) error {
	err := ofdlock.Wait(ctx, uintptr(fd), unix.Flock_t{Type: unix.F_WRLCK}, ledgerBackoff)
	if err != nil && ctx.Err() != nil {
		return policy.WaitEnded(ctx, "the workspace's quota account is busy (another process or node holds its ledger's lock, or the storage did not answer); retry later")
	}
	return err
}

// unlockFD drops the OFD lock this open file holds on all of fd.
func unlockFD(fd int) {
	lk := unix.Flock_t{Type: unix.F_UNLCK}
	unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLK, &lk)
}

// openLedgerLock opens (creating) the ledger's lock file.
func openLedgerLock(dfd int) (int, error) {
	fd, err := unix.Openat(dfd, ledgerLock, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, policy.FilePerm)
	if err != nil {
		return -1, fmt.Errorf("open quota ledger lock: %w", err)
	}
	return fd, nil
}
