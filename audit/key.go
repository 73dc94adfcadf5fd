package audit

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// KeyEnv names the environment variable a writer reads the path of its
// node's signing key from when Options.KeyFile is empty.
const KeyEnv = "AGENT_LOOM_AUDIT_KEY"

// Key files hold one line: "<tag> <node> <base64 key>". The private key
// (<node>.key, the ed25519 seed) stays on its node, outside the shared
// volume, readable by its owner only; the public key (<node>.pub) is what
// auditors trust.
const (
	privateTag = "loomfs-audit-ed25519-private"
	publicTag  = "loomfs-audit-ed25519-public"
)

// NodeKey is a node's signing key.
type NodeKey struct {
	Node    string
	Private ed25519.PrivateKey
}

// KeyID names a public key in seals: the first 16 hex digits of its sha256.
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:8])
}

// GenerateKey makes a signing key for node in dir (created 0700): the
// private key <node>.key (0600) and the public key <node>.pub (0644). It
// refuses to replace an existing key. It returns the two paths.
func GenerateKey(dir, node string) (priv, pub string, err error) {
	if node == "" || fileNode(node) != node {
		return "", "", fmt.Errorf("node name %q: use letters, digits, '.', '-' and '_' (at most 64)", node)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", "", fmt.Errorf("key directory: %w", err)
	}
	pk, sk, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", "", fmt.Errorf("generate key: %w", err)
	}
	priv = filepath.Join(dir, node+".key")
	pub = filepath.Join(dir, node+".pub")
	if err := writeNew(priv, fmt.Sprintf("%s %s %s\n", privateTag, node, base64.StdEncoding.EncodeToString(sk.Seed())), 0o600); err != nil {
		return "", "", err
	}
	if err := writeNew(pub, fmt.Sprintf("%s %s %s\n", publicTag, node, base64.StdEncoding.EncodeToString(pk)), 0o644); err != nil {
		os.Remove(priv)
		return "", "", err
	}
	return priv, pub, nil
}

func writeNew(name, content string, mode os.FileMode) error {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("%s already exists: a node key is never replaced silently (remove it first if you mean to)", name)
	}
	if err != nil {
		return err
	}
	if _, err := f.WriteString(content); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", name, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("sync %s: %w", name, err)
	}
	return f.Close()
}

// LoadKey reads a node's private key. The file must be readable by its
// owner only and owned by this process's user: a key others can read
// proves nothing.
func LoadKey(name string) (*NodeKey, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("audit key: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("audit key: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("audit key %s has mode %v: it must be readable by its owner only (chmod 600)", name, fi.Mode().Perm())
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return nil, fmt.Errorf("audit key %s is owned by uid %d, not by this process's user (%d)", name, st.Uid, os.Geteuid())
	}
	b := make([]byte, 4096)
	n, _ := f.Read(b)
	node, raw, err := parseKeyLine(string(b[:n]), privateTag)
	if err != nil {
		return nil, fmt.Errorf("audit key %s: %w", name, err)
	}
	if len(raw) != ed25519.SeedSize {
		return nil, fmt.Errorf("audit key %s: %d bytes, want an ed25519 seed of %d", name, len(raw), ed25519.SeedSize)
	}
	return &NodeKey{Node: node, Private: ed25519.NewKeyFromSeed(raw)}, nil
}

// TrustedKeys are the public keys an auditor trusts, by node.
type TrustedKeys map[string][]ed25519.PublicKey

// LoadTrustedKeys reads every <node>.pub file in dir.
func LoadTrustedKeys(dir string) (TrustedKeys, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("trusted keys: %w", err)
	}
	keys := TrustedKeys{}
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".pub") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("trusted keys: %w", err)
		}
		node, raw, err := parseKeyLine(string(b), publicTag)
		if err != nil || len(raw) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("trusted key %s: not a loomfs audit public key (%v)", e.Name(), err)
		}
		keys[node] = append(keys[node], ed25519.PublicKey(raw))
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("trusted keys: no <node>.pub file in %s", dir)
	}
	return keys, nil
}

func parseKeyLine(s, tag string) (node string, raw []byte, err error) {
	f := strings.Fields(s)
	if len(f) != 3 || f[0] != tag {
		return "", nil, fmt.Errorf("want one line %q NODE KEY", tag)
	}
	raw, err = base64.StdEncoding.DecodeString(f[2])
	if err != nil {
		return "", nil, fmt.Errorf("bad base64: %w", err)
	}
	return f[1], raw, nil
}

// sealMessage is the text a seal signs: the node, the ledger position the
// seal takes and the chain head it vouches for.
func sealMessage(e *LedgerEntry) []byte {
	return fmt.Appendf(nil, "loomfs-audit-seal v1\nnode %s\nseq %d\nprev %s\ntime %s\nchain %d %s\n",
		e.Node, e.Seq, e.Prev, e.Time.UTC().Format("2006-01-02T15:04:05.000000000Z"), e.ChainSeq, e.ChainHead)
}

func (k *NodeKey) sign(e *LedgerEntry) {
	pub := k.Private.Public().(ed25519.PublicKey)
	e.Key = KeyID(pub)
	e.Sig = base64.StdEncoding.EncodeToString(ed25519.Sign(k.Private, sealMessage(e)))
}

// verifySeal reports whether e carries a valid signature by one of keys.
func verifySeal(e *LedgerEntry, keys []ed25519.PublicKey) bool {
	sig, err := base64.StdEncoding.DecodeString(e.Sig)
	if err != nil {
		return false
	}
	msg := sealMessage(e)
	for _, k := range keys {
		if KeyID(k) == e.Key && ed25519.Verify(k, msg, sig) {
			return true
		}
	}
	return false
}
