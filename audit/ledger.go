package audit

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"time"
)

// Ledger entry kinds. A node's ledger (<node>.ledger.jsonl) is the account
// of its writers: each one is registered ("open") before it writes its
// first record and deregistered ("close") with how many events it wrote
// and the hash of its last one. Seals are signed checkpoints of the ledger
// and of the node's chain. The ledger is hash-chained like the records.
const (
	LedgerOpen  = "open"
	LedgerClose = "close"
	LedgerSeal  = "seal"
)

// LedgerEntry is one line of a node's ledger.
type LedgerEntry struct {
	Time time.Time `json:"time"`
	Kind string    `json:"kind"` // LedgerOpen, LedgerClose or LedgerSeal
	Node string    `json:"node"`
	PID  int       `json:"pid"`
	Seq  uint64    `json:"seq"`  // 1 for the ledger's first entry
	Prev string    `json:"prev"` // hex sha256 of the previous line

	// Writer is the writer's number, the seq of its open entry (close and
	// seal); Start is when its process started (open).
	Writer uint64    `json:"writer,omitempty"`
	Start  time.Time `json:"start,omitzero"`

	// Close: the events the writer recorded, and the seq and hash of its
	// last record.
	Count    uint64 `json:"count,omitempty"`
	LastSeq  uint64 `json:"last_seq,omitempty"`
	LastHash string `json:"last_hash,omitempty"`

	// The node's chain at the moment of the entry: its last record's seq
	// and hash (0 and "" while it is empty).
	ChainSeq  uint64 `json:"chain_seq"`
	ChainHead string `json:"chain_head"`

	// Seal: why it was made (rotate, close, interval), the key's id and the
	// ed25519 signature of sealMessage.
	Reason string `json:"reason,omitempty"`
	Key    string `json:"key,omitempty"`
	Sig    string `json:"sig,omitempty"`
}

// appendLedger adds e to the node's ledger under its append lock, filling
// in seq and prev, and signs it when it is a seal. It returns the entry's
// seq.
func (l *Log) appendLedger(e *LedgerEntry, sync bool) (uint64, error) {
	if err := lockRange(l.led, 0, 1); err != nil {
		return 0, err
	}
	defer unlockRange(l.led, 0, 1)
	fi, err := l.led.Stat()
	if err != nil {
		return 0, fmt.Errorf("ledger: %w", err)
	}
	line, end, err := lastLine(l.led, fi.Size())
	if err != nil {
		return 0, fmt.Errorf("ledger: %w", err)
	}
	if end < fi.Size() { // a writer died mid-entry: cut the partial line off
		if err := l.led.Truncate(end); err != nil {
			return 0, fmt.Errorf("ledger: cut partial entry: %w", err)
		}
	}
	e.Seq, e.Prev = 1, ""
	if line != nil {
		lf, err := parseLineFields(line)
		if err != nil {
			return 0, fmt.Errorf("ledger %s: %w", l.led.Name(), err)
		}
		sum := sha256.Sum256(line)
		e.Seq, e.Prev = lf.Seq+1, hex.EncodeToString(sum[:])
	}
	if e.Kind == LedgerSeal {
		l.key.sign(e)
	}
	b, err := json.Marshal(e)
	if err != nil {
		return 0, fmt.Errorf("ledger: encode: %w", err)
	}
	b = append(b, '\n')
	if n, err := l.led.Write(b); err != nil {
		if n > 0 {
			l.led.Truncate(end)
		}
		return 0, fmt.Errorf("ledger: %w", err)
	}
	if sync {
		if err := l.led.Sync(); err != nil {
			return 0, fmt.Errorf("ledger: sync: %w", err)
		}
	}
	return e.Seq, nil
}

// seal signs the node's ledger and chain heads, if this writer has a key.
// The chain lock is held, so the chain head is exact.
func (l *Log) seal(now time.Time, reason string) error {
	if l.key == nil {
		return nil
	}
	_, err := l.appendLedger(&LedgerEntry{Time: now, Kind: LedgerSeal, Node: l.opts.Node, PID: l.pid, Writer: l.id,
		ChainSeq: l.seq, ChainHead: l.prev, Reason: reason}, true)
	if err == nil {
		l.lastSeal = now
	}
	return err
}

func openLedger(dir, node string) (*os.File, error) {
	f, err := os.OpenFile(dir+"/"+ledgerFileName(node), os.O_RDWR|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	// Room for this writer's entries on a volume that fills up (see
	// ledgerRoom); best effort, as for the chain.
	if fi, err := f.Stat(); err == nil {
		allocate(f, fi.Size(), ledgerRoom)
	}
	return f, nil
}
