package retention

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/snapshot"
	"github.com/agentloom/loomfs/store"
)

// Pins keep a session or a snapshot from being reclaimed, however old. A
// pin is a small file in the scope's state directory
// (.agentloom-locks/<scope-hash>/pins/), outside every projection: a
// session's pin in its main scope's, a snapshot's in its own scope's.

// PinsDir holds a scope's pins in its state directory.
const PinsDir = "pins"

// Pin is one pin.
type Pin struct {
	Scope    string    `json:"scope"`
	Snapshot string    `json:"snapshot,omitempty"` // "" pins the session
	Note     string    `json:"note,omitempty"`
	Time     time.Time `json:"time"`
}

func pinFile(snapshotID string) string {
	if snapshotID == "" {
		return "session.json"
	}
	return "snapshot-" + snapshotID + ".json"
}

// pinScope is the scope whose state directory holds the pin: the main
// scope for a session.
func pinScope(sc store.Scope, snapshotID string) store.Scope {
	if snapshotID == "" {
		return store.Scope{Space: sc.Space, Agent: sc.Agent, Session: sc.Session}
	}
	return sc
}

// PinItem pins scope sc's session (snapshotID "") or one of its snapshots,
// which must exist.
func PinItem(vol *store.Volume, sc store.Scope, snapshotID, note string, now time.Time) (*Pin, error) {
	if snapshotID != "" {
		repo, err := snapshot.OpenRepo(vol, sc, false)
		if err != nil {
			return nil, err
		}
		_, err = repo.Get(snapshotID)
		repo.Close()
		if err != nil {
			return nil, err
		}
	}
	if len(note) > 1024 {
		return nil, policy.Errorf(policy.InvalidInput, "note is %d bytes; the limit is 1024", len(note))
	}
	owner := pinScope(sc, snapshotID)
	p := &Pin{Scope: owner.String(), Snapshot: snapshotID, Note: note, Time: now.UTC()}
	dir, err := pinsDir(vol, owner, true)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	b, _ := json.Marshal(p)
	name := pinFile(snapshotID)
	tmp := ".tmp-" + name
	fd, err := unix.Openat(int(dir.Fd()), tmp, unix.O_CREAT|unix.O_TRUNC|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, policy.FilePerm)
	if err != nil {
		return nil, fmt.Errorf("pin: %w", err)
	}
	_, err = unix.Write(fd, b)
	if err == nil {
		err = unix.Fsync(fd)
	}
	unix.Close(fd)
	if err == nil {
		err = unix.Renameat(int(dir.Fd()), tmp, int(dir.Fd()), name)
	}
	if err != nil {
		unix.Unlinkat(int(dir.Fd()), tmp, 0)
		return nil, fmt.Errorf("pin: %w", err)
	}
	unix.Fsync(int(dir.Fd()))
	return p, nil
}

// Unpin removes the pin of sc's session (snapshotID "") or of a snapshot.
func Unpin(vol *store.Volume, sc store.Scope, snapshotID string) error {
	owner := pinScope(sc, snapshotID)
	dir, err := pinsDir(vol, owner, false)
	if err == nil {
		defer dir.Close()
		err = unix.Unlinkat(int(dir.Fd()), pinFile(snapshotID), 0)
	}
	if err != nil {
		what := "session " + owner.String()
		if snapshotID != "" {
			what = "snapshot " + snapshotID + " of " + owner.String()
		}
		return policy.Errorf(policy.NotFound, "%s is not pinned", what)
	}
	return nil
}

// isPinned reports whether sc's session (snapshotID "") or one of its
// snapshots is pinned.
func isPinned(vol *store.Volume, sc store.Scope, snapshotID string) (bool, error) {
	dir, err := pinsDir(vol, pinScope(sc, snapshotID), false)
	if err != nil {
		return false, nil
	}
	defer dir.Close()
	var st unix.Stat_t
	err = unix.Fstatat(int(dir.Fd()), pinFile(snapshotID), &st, unix.AT_SYMLINK_NOFOLLOW)
	if err == unix.ENOENT {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read pin: %w", err)
	}
	return true, nil
}

// Pins lists every pin on the volume.
func Pins(vol *store.Volume) ([]Pin, error) {
	locks, err := vol.Area(store.LocksDir, false)
	if policy.CodeOf(err) == policy.NotFound {
		return []Pin{}, nil
	}
	if err != nil {
		return nil, err
	}
	defer locks.Close()
	hashes, err := locks.Readdirnames(-1)
	if err != nil && err != io.EOF {
		return nil, fmt.Errorf("read %s: %w", store.LocksDir, err)
	}
	out := []Pin{}
	for _, h := range hashes {
		fd, err := unix.Openat(int(locks.Fd()), h+"/"+PinsDir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		d := os.NewFile(uintptr(fd), PinsDir)
		names, _ := d.Readdirnames(-1)
		for _, n := range names {
			if strings.HasPrefix(n, ".tmp-") {
				continue
			}
			var p Pin
			if readJSONAt(fd, n, &p) == nil {
				out = append(out, p)
			}
		}
		d.Close()
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Scope != out[j].Scope {
			return out[i].Scope < out[j].Scope
		}
		return out[i].Snapshot < out[j].Snapshot
	})
	return out, nil
}

func pinsDir(vol *store.Volume, sc store.Scope, create bool) (*os.File, error) {
	if err := sc.Validate(); err != nil {
		return nil, err
	}
	return vol.Area(store.LocksDir+"/"+sc.Hash()+"/"+PinsDir, create)
}

func readJSONAt(dirfd int, name string, v any) error {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	return json.NewDecoder(io.LimitReader(f, 1<<20)).Decode(v)
}
