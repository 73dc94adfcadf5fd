package quota

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
)

// Names in the account's directory. Whatever another node must read is
// written whole under a temporary name and renamed into place: a client
// of a distributed filesystem (ceph-fuse) may go on serving the old bytes
// of a file changed in place by another client, but a rename gives the
// name a new inode, which it reads afresh.
const (
	LedgerFile   = "ledger"      // what all holders have folded in
	ledgerLock   = "ledger.lock" // its lock orders every grant
	recordPrefix = "h-"          // a holder's record: h-<id> (its last sync)
	liveSuffix   = ".lock"       // and h-<id>.lock: locked while it lives, its live figures mapped
)

// ledger is the folded part of the account: what the scope held at the
// last count, plus everything holders have folded in since.
type ledger struct {
	Bytes int64 `json:"bytes"`
	Files int64 `json:"files"`
}

func (l ledger) usage() policy.Usage { return policy.Usage{Bytes: l.Bytes, Files: l.Files} }

// readLedger reads the ledger in dfd; ok is false when there is none yet
// or it can't be read back, and the scope must be counted again.
func readLedger(dfd int) (l ledger, ok bool, err error) {
	b, err := readFileAt(dfd, LedgerFile, 256)
	if err == unix.ENOENT {
		return l, false, nil
	}
	if err != nil {
		return l, false, fmt.Errorf("read quota ledger: %w", err)
	}
	if err := json.Unmarshal(bytes.TrimSpace(b), &l); err != nil {
		return ledger{}, false, nil
	}
	return l, true, nil
}

func writeLedger(dfd int, tmp string, l ledger) error {
	b, _ := json.Marshal(l)
	if err := replaceAt(dfd, tmp, LedgerFile, append(b, '\n')); err != nil {
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

// replaceAt writes b as name in dfd under the temporary name tmp, then
// renames it into place. It is not fsynced: a node that crashes loses its
// page cache, and the reconcile counts the scope again.
func replaceAt(dfd int, tmp, name string, b []byte) error {
	fd, err := unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_NOFOLLOW|unix.O_CLOEXEC, policy.FilePerm)
	if err != nil {
		return err
	}
	_, err = unix.Write(fd, b)
	unix.Close(fd)
	if err == nil {
		err = unix.Renameat(dfd, tmp, dfd, name)
	}
	if err != nil {
		unix.Unlinkat(dfd, tmp, 0)
	}
	return err
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
	id    string // h-<id>
	live  bool
	local bool // on this node: rec is its live figures
	rec   record
}

// holders reads every holder's record in the directory dfd but self's.
// A holder whose lock nobody holds is gone.
func holders(dfd int, self string, node nodeID) ([]holder, error) {
	d, err := unix.Openat(dfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open quota dir: %w", err)
	}
	f := os.NewFile(uintptr(d), "quota")
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("list quota dir: %w", err)
	}
	var hs []holder
	for _, name := range names {
		id, ok := strings.CutSuffix(name, liveSuffix)
		if !ok || !strings.HasPrefix(id, recordPrefix) || id == self {
			continue
		}
		h, ok, err := readHolder(dfd, id, node)
		if err != nil {
			return nil, err
		}
		if ok {
			hs = append(hs, h)
		}
	}
	return hs, nil
}

// readHolder reads holder id and whether it is alive; ok is false when it
// is gone already.
func readHolder(dfd int, id string, node nodeID) (holder, bool, error) {
	fd, err := unix.Openat(dfd, id+liveSuffix, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err == unix.ENOENT {
		return holder{}, false, nil
	}
	if err != nil {
		return holder{}, false, fmt.Errorf("open quota record: %w", err)
	}
	defer unix.Close(fd)
	h := holder{id: id}
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
	if rec, at, ok := parseRecord(buf[:n]); ok && at == node {
		h.rec, h.local = rec, true
		return h, true, nil
	}
	b, err := readFileAt(dfd, id, recordSize)
	if err != nil && err != unix.ENOENT {
		return holder{}, false, fmt.Errorf("read quota record: %w", err)
	}
	// A record being made has no content yet: it holds nothing.
	h.rec, _, _ = parseRecord(b)
	return h, true, nil
}

// lockFD takes (waiting) or drops an OFD write lock on all of fd.
func lockFD(fd int, typ int16) error {
	lk := unix.Flock_t{Type: typ}
	for {
		err := unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLKW, &lk)
		if err != unix.EINTR {
			return err
		}
	}
}

// openLedgerLock opens (creating) the ledger's lock file.
func openLedgerLock(dfd int) (int, error) {
	fd, err := unix.Openat(dfd, ledgerLock, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, policy.FilePerm)
	if err != nil {
		return -1, fmt.Errorf("open quota ledger lock: %w", err)
	}
	return fd, nil
}
