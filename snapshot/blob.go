package snapshot

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
)

// OpenBlob opens the stored content named by sha256 for reading, so that a
// fork (package fork) can clone or copy it without reading it through the
// scope it came from.
func (r *Repo) OpenBlob(sha string) (*os.File, error) {
	if len(sha) != 64 {
		return nil, policy.Errorf(policy.InvalidInput, "%q is not a sha256", sha)
	}
	fd, err := unix.Openat(int(r.blobs.Fd()), blobPath(sha), unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open the stored content %.12s…: %w", sha, err)
	}
	return os.NewFile(uintptr(fd), sha), nil
}
