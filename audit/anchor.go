package audit

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/syslog"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// Head is one node's position in the log, as an anchor keeps it: the last
// ledger entry and the last chain record, and the node's last seal.
type Head struct {
	Node       string       `json:"node"`
	LedgerSeq  uint64       `json:"ledger_seq"`
	LedgerHead string       `json:"ledger_head"`
	ChainSeq   uint64       `json:"chain_seq"`
	ChainHead  string       `json:"chain_head"`
	Seal       *LedgerEntry `json:"seal,omitempty"` // signed when the node has a key
}

// Anchor is the heads of every node at one moment. Kept where nobody who
// can write the volume can reach (a write-once store, a remote syslog, a
// ticket), it lets VerifyWith prove the log still extends each head, so a
// deleted or replaced audit directory is caught.
type Anchor struct {
	Time  time.Time `json:"anchored_at"`
	Heads []Head    `json:"heads"`
}

// Heads reads the current head of every node in dir.
func Heads(dir string, now time.Time) (Anchor, error) {
	a := Anchor{Time: now.UTC()}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return a, fmt.Errorf("read audit directory: %w", err)
	}
	chains := map[string]*chainReader{}
	for _, c := range groupChains(ents, nil) {
		if c.w.kind == nodeChainFile {
			chains[c.w.node] = c
		}
	}
	for _, e := range ents {
		p := parseName(e.Name())
		if p.kind != ledgerFile || !e.Type().IsRegular() {
			continue
		}
		h := Head{Node: p.w.node}
		if err := ledgerHead(filepath.Join(dir, e.Name()), &h); err != nil {
			return a, err
		}
		if c := chains[p.w.node]; c != nil {
			if err := chainHead(dir, c, &h); err != nil {
				return a, err
			}
		}
		a.Heads = append(a.Heads, h)
	}
	slices.SortFunc(a.Heads, func(x, y Head) int {
		if x.Node < y.Node {
			return -1
		}
		if x.Node > y.Node {
			return 1
		}
		return 0
	})
	return a, nil
}

func ledgerHead(name string, h *Head) error {
	f, err := os.Open(name)
	if err != nil {
		return fmt.Errorf("read audit ledger: %w", err)
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, 64<<10)
	for {
		line, err := br.ReadBytes('\n')
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read audit ledger: %w", err)
		}
		var e LedgerEntry
		if err := json.Unmarshal(line, &e); err != nil {
			return fmt.Errorf("audit ledger %s: bad entry after seq %d: %w (run loomfs audit verify)", filepath.Base(name), h.LedgerSeq, err)
		}
		sum := sha256.Sum256(line)
		h.LedgerSeq, h.LedgerHead = e.Seq, hex.EncodeToString(sum[:])
		if e.Kind == LedgerSeal {
			h.Seal = &e
		}
	}
}

// chainHead finds the chain's last record: in its newest file that has
// one (a file just started by a rotation is empty).
func chainHead(dir string, c *chainReader, h *Head) error {
	for i := len(c.files) - 1; i >= 0; i-- {
		f, err := os.Open(filepath.Join(dir, c.files[i].name))
		if err != nil {
			return fmt.Errorf("read audit chain: %w", err)
		}
		fi, err := f.Stat()
		if err != nil {
			f.Close()
			return fmt.Errorf("read audit chain: %w", err)
		}
		line, _, err := lastLine(f, fi.Size())
		f.Close()
		if err != nil {
			return err
		}
		if line == nil {
			continue
		}
		lf, err := parseLineFields(line)
		if err != nil {
			return fmt.Errorf("audit chain %s: %w (run loomfs audit verify)", c.files[i].name, err)
		}
		sum := sha256.Sum256(line)
		h.ChainSeq, h.ChainHead = lf.Seq, hex.EncodeToString(sum[:])
		return nil
	}
	return nil
}

// ReadAnchors reads anchors, one JSON object a line. Text before a line's
// first '{' is ignored, so lines copied from syslog read as they are.
func ReadAnchors(r io.Reader) ([]Anchor, error) {
	var out []Anchor
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 16<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Bytes()
		i := bytes.IndexByte(line, '{')
		if i < 0 {
			if len(bytes.TrimSpace(line)) == 0 {
				continue
			}
			return nil, fmt.Errorf("anchor line %d: not an anchor", n)
		}
		var a Anchor
		if err := json.Unmarshal(line[i:], &a); err != nil {
			return nil, fmt.Errorf("anchor line %d: %w", n, err)
		}
		out = append(out, a)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read anchors: %w", err)
	}
	if len(out) == 0 {
		return nil, errors.New("no anchor in the file")
	}
	return out, nil
}

// SendSyslog sends an anchor line to the syslog daemon listening on the
// unix socket sock (datagram, or stream if that is what it takes).
func SendSyslog(sock string, line []byte) error {
	w, err := syslog.Dial("unixgram", sock, syslog.LOG_AUTH|syslog.LOG_INFO, "loomfs-audit")
	if err != nil {
		w, err = syslog.Dial("unix", sock, syslog.LOG_AUTH|syslog.LOG_INFO, "loomfs-audit")
	}
	if err != nil {
		return fmt.Errorf("syslog: %w", err)
	}
	defer w.Close()
	if err := w.Info("anchor " + string(bytes.TrimSuffix(line, []byte("\n")))); err != nil {
		return fmt.Errorf("syslog: %w", err)
	}
	return nil
}
