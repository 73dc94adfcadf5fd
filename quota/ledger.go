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

// Names in the account's directory.
const (
	LedgerFile   = "ledger" // what all holders have folded in; its lock orders every grant
	recordPrefix = "h-"     // a holder's record: h-<id>
)

// ledgerSize is the ledger's fixed length: it is rewritten in place, so a
// torn write can't leave the tail of a longer version behind it.
const ledgerSize = 128

// ledger is the folded part of the account: what the scope held at the
// last count, plus everything holders have folded in since.
type ledger struct {
	Bytes int64 `json:"bytes"`
	Files int64 `json:"files"`
}

func (l ledger) usage() policy.Usage { return policy.Usage{Bytes: l.Bytes, Files: l.Files} }

// readLedger reads the ledger open as fd; ok is false when there is none
// yet (an empty file) or it can't be read back (a torn write), and the
// scope must be counted again.
func readLedger(fd int) (l ledger, ok bool, err error) {
	buf := make([]byte, ledgerSize)
	n, err := unix.Pread(fd, buf, 0)
	if err != nil {
		return l, false, fmt.Errorf("read quota ledger: %w", err)
	}
	if err := json.Unmarshal(bytes.TrimSpace(buf[:n]), &l); err != nil || n == 0 {
		return ledger{}, false, nil
	}
	return l, true, nil
}

func writeLedger(fd int, l ledger) error {
	b, _ := json.Marshal(l)
	line := string(b) + strings.Repeat(" ", max(ledgerSize-1-len(b), 0)) + "\n"
	if _, err := unix.Pwrite(fd, []byte(line), 0); err != nil {
		return fmt.Errorf("write quota ledger: %w", err)
	}
	return nil
}

// A record holds, at fixed offsets, what its holder still has as a grant
// and what it has spent (net, so a shrink is negative) and not folded into
// the ledger yet.
const (
	recordMagic = "loomq01\n"
	recordSize  = 8 + 4*8
)

type record struct {
	grant, spent policy.Usage
}

func (r record) put(b []byte) {
	copy(b, recordMagic)
	binary.LittleEndian.PutUint64(b[8:], uint64(r.grant.Bytes))
	binary.LittleEndian.PutUint64(b[16:], uint64(r.grant.Files))
	binary.LittleEndian.PutUint64(b[24:], uint64(r.spent.Bytes))
	binary.LittleEndian.PutUint64(b[32:], uint64(r.spent.Files))
}

func parseRecord(b []byte) (record, bool) {
	if len(b) < recordSize || string(b[:8]) != recordMagic {
		return record{}, false
	}
	return record{
		grant: policy.Usage{Bytes: int64(binary.LittleEndian.Uint64(b[8:])), Files: int64(binary.LittleEndian.Uint64(b[16:]))},
		spent: policy.Usage{Bytes: int64(binary.LittleEndian.Uint64(b[24:])), Files: int64(binary.LittleEndian.Uint64(b[32:]))},
	}, true
}

// holder is another holder's record as read under the ledger lock.
type holder struct {
	name string
	live bool
	rec  record
}

// holders reads every record in the directory dfd but the one named self.
// A record whose lock nobody holds is a dead holder's.
func holders(dfd int, self string) ([]holder, error) {
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
		if !strings.HasPrefix(name, recordPrefix) || name == self {
			continue
		}
		h, ok, err := readHolder(dfd, name)
		if err != nil {
			return nil, err
		}
		if ok {
			hs = append(hs, h)
		}
	}
	return hs, nil
}

// readHolder reads the record name and whether its holder is alive; ok is
// false when it is gone already.
func readHolder(dfd int, name string) (holder, bool, error) {
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err == unix.ENOENT {
		return holder{}, false, nil
	}
	if err != nil {
		return holder{}, false, fmt.Errorf("open quota record: %w", err)
	}
	defer unix.Close(fd)
	h := holder{name: name}
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
	// A record being created has no content yet: it holds nothing.
	h.rec, _ = parseRecord(buf[:n])
	return h, true, nil
}

// lockFD takes (wait) or drops an OFD write lock on all of fd.
func lockFD(fd int, typ int16) error {
	lk := unix.Flock_t{Type: typ}
	for {
		err := unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLKW, &lk)
		if err != unix.EINTR {
			return err
		}
	}
}

// openLedgerRO opens the ledger for reading, or returns -1 if there is
// none.
func openLedgerRO(dirfd int) (int, error) {
	fd, err := unix.Openat(dirfd, LedgerFile, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err == unix.ENOENT {
		return -1, nil
	}
	if err != nil {
		return -1, fmt.Errorf("open quota ledger: %w", err)
	}
	return fd, nil
}

func closeFD(fd int) { unix.Close(fd) }
