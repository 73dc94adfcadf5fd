package store

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
)

// TokensDir holds confirmation tokens in the scope's state directory,
// outside every projection: a command can neither read nor forge one.
const TokensDir = "confirm"

// Confirmation is what a one-time confirmation token stands for: one call
// of one tool with the same arguments, on one file as it was.
type Confirmation struct {
	Tool    string    `json:"tool"`
	Path    string    `json:"path"`
	ArgsSHA string    `json:"args_sha256"` // the call's arguments, token left out
	FileSHA string    `json:"file_sha256"` // the file then; "" for a directory
	Issued  time.Time `json:"issued"`
	Expires time.Time `json:"expires"`
}

// IssueToken records c under a new random token and returns the token.
// Only its hash names the record, so the state directory does not hold
// usable tokens. Expired records are swept on the way.
func (w *Workspace) IssueToken(c Confirmation) (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("confirmation token: %w", err)
	}
	token := "ct_" + hex.EncodeToString(b[:])
	dfd, err := w.tokensDir()
	if err != nil {
		return "", err
	}
	defer unix.Close(dfd)
	sweepTokens(dfd, time.Now())
	if err := writeJSONAt(dfd, tokenFile(token), c, true); err != nil {
		return "", fmt.Errorf("record confirmation token: %w", err)
	}
	return token, nil
}

// RedeemToken consumes token and returns what it stood for, or nil if no
// such token is recorded (never issued, already used or swept). A redeemed
// token is gone whatever the caller then decides: it works at most once.
func (w *Workspace) RedeemToken(token string) (*Confirmation, error) {
	if len(token) != 35 || token[:3] != "ct_" {
		return nil, nil
	}
	if _, err := hex.DecodeString(token[3:]); err != nil {
		return nil, nil
	}
	dfd, err := w.tokensDir()
	if err != nil {
		return nil, err
	}
	defer unix.Close(dfd)
	name := tokenFile(token)
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err == unix.ENOENT {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read confirmation token: %w", err)
	}
	f := os.NewFile(uintptr(fd), name)
	b, err := io.ReadAll(io.LimitReader(f, 1<<20))
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("read confirmation token: %w", err)
	}
	// Whoever unlinks the record owns the token; a concurrent redeemer
	// finds it gone.
	if err := unix.Unlinkat(dfd, name, 0); err != nil {
		if err == unix.ENOENT {
			return nil, nil
		}
		return nil, fmt.Errorf("consume confirmation token: %w", err)
	}
	var c Confirmation
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, nil
	}
	return &c, nil
}

func tokenFile(token string) string { return recordFile(token) }

func (w *Workspace) tokensDir() (int, error) { return w.stateSubdir(TokensDir) }

// sweepTokens removes token records older than their lifetime.
func sweepTokens(dfd int, now time.Time) {
	dup, err := unix.Openat(dfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	d := os.NewFile(uintptr(dup), TokensDir)
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	for _, n := range names {
		var st unix.Stat_t
		if unix.Fstatat(dfd, n, &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
			continue
		}
		if now.Sub(time.Unix(st.Mtim.Unix())) > policy.ConfirmTTL {
			unix.Unlinkat(dfd, n, 0)
		}
	}
}

// ContentHash returns the sha256 of the regular file at rel whatever its
// size, or "" for a directory, with what fstat says of it. Objects that
// may not be written are refused.
func (w *Workspace) ContentHash(rel string) (string, Info, error) {
	f, info, err := w.Open(policy.OpWrite, rel, unix.O_RDONLY)
	if err != nil {
		return "", Info{}, err
	}
	defer f.Close()
	if info.Kind != policy.KindRegular {
		return "", info, nil
	}
	h, err := hashReader(f)
	return h, info, err
}
