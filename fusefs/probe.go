package fusefs

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
)

// The health probe writes, reads back and deletes a file through the
// mount, and so waits on the daemon: its own process. Were the daemon
// killed while a probe's request is with it, a thread of the daemon's own
// would wait for that answer for ever, uninterruptibly; the process would
// never end, its /dev/fuse would never close, and the mount would be
// neither alive nor dead (every later statfs of it hangs too). So the
// probe is made by a child process: the daemon's own threads never wait
// on its mount, and a child left waiting is freed with ENOTCONN once the
// daemon is gone.
//
// The child is this program again (/proc/self/exe), which probes instead
// of starting when probeEnv names the file (see init): any program that
// serves a projection links this package, and with it the probe.

// probeEnv names the file a child process probes; its content is the hex
// of what it writes.
const probeEnv = "LOOMFS_FUSEFS_PROBE"

func init() {
	path := os.Getenv(probeEnv)
	if path == "" {
		return
	}
	want, err := hex.DecodeString(os.Getenv(probeEnv + "_DATA"))
	if err == nil {
		err = probe(path, want)
	}
	if err != nil {
		var en syscall.Errno
		if errors.As(err, &en) && en > 0 && en < 255 {
			os.Exit(int(en)) // the errno, which the parent turns back into one
		}
		fmt.Fprintln(os.Stderr, err)
		os.Exit(255)
	}
	os.Exit(0)
}

// probeInChild runs probe(path, want) in a child process and returns its
// error: the errno it met, or what it printed.
func probeInChild(ctx context.Context, path string, want []byte) error {
	cmd := exec.CommandContext(ctx, "/proc/self/exe")
	cmd.Env = []string{probeEnv + "=" + path, probeEnv + "_DATA=" + hex.EncodeToString(want)}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ee) && ee.ExitCode() > 0 && ee.ExitCode() < 255:
		return &os.PathError{Op: "probe", Path: path, Err: syscall.Errno(ee.ExitCode())}
	case errors.As(err, &ee) && ee.ExitCode() == 255:
		return fmt.Errorf("probe: %s", strings.TrimSpace(stderr.String()))
	}
	return fmt.Errorf("probe process: %w", err)
}
