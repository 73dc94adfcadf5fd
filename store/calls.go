package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/callrec"
	"github.com/agentloom/loomfs/newname"
	"github.com/agentloom/loomfs/policy"
)

// BeginCall records that call id starts running tool with input in the
// scope's call records (package callrec): if the id was seen before it
// returns that record instead and records nothing.
func (w *Workspace) BeginCall(ctx context.Context, id, tool string, input []byte) (*callrec.Record, error) {
	return w.calls.Begin(ctx, w.callsDir, id, tool, input)
}

// FinishCall records the outcome of call id.
func (w *Workspace) FinishCall(id, tool string, input []byte, result json.RawMessage, perr *policy.Error) error {
	return w.calls.Finish(w.callsDir, id, tool, input, result, perr)
}

// recordFile names the record of key (a call id, a token) by its hash, so
// no key reaches the filesystem as a name.
func recordFile(key string) string {
	s := sha256.Sum256([]byte(key))
	return hex.EncodeToString(s[:16]) + ".json"
}

func (w *Workspace) callsDir() (int, error) { return w.stateSubdir(callrec.Dir) }

// stateSubdir opens (creating) a directory of the scope's state directory.
func (w *Workspace) stateSubdir(name string) (int, error) {
	sfd := int(w.state.Fd())
	open := func() (int, error) {
		return unix.Openat(sfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	}
	fd, err := open()
	if err == unix.ENOENT {
		// First use: made here, not before every call.
		if err := unix.Mkdirat(sfd, name, policy.DirPerm); err != nil && err != unix.EEXIST {
			return -1, fmt.Errorf("%s dir: %w", name, err)
		}
		fd, err = open()
	}
	if err != nil {
		return -1, fmt.Errorf("%s dir: %w", name, err)
	}
	return fd, nil
}

// writeJSONAt writes v as name in directory dfd via a temporary file, fsync
// and rename; with noReplace an existing name answers EEXIST (newname.Place).
func writeJSONAt(dfd int, name string, v any, noReplace bool) error {
	tmp, err := writeTempJSON(dfd, v)
	if err != nil {
		return err
	}
	if noReplace {
		err = newname.Place(dfd, tmp, name)
	} else {
		err = unix.Renameat(dfd, tmp, dfd, name)
	}
	if err != nil {
		unix.Unlinkat(dfd, tmp, 0)
		return err
	}
	return syncDir(dfd)
}

// writeTempJSON writes v, fsynced, to a new reserved temporary name in dfd
// and returns the name.
func writeTempJSON(dfd int, v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	tmp := tempName()
	fd, err := unix.Openat(dfd, tmp, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, policy.FilePerm)
	if err != nil {
		return "", err
	}
	f := os.NewFile(uintptr(fd), tmp)
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	f.Close()
	if err != nil {
		unix.Unlinkat(dfd, tmp, 0)
		return "", err
	}
	return tmp, nil
}
