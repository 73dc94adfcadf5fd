package fence

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Mount is what a node's own ceph-fuse daemon says of the mount loomfs
// serves from: whether a fence of the node would find it (its client
// metadata names the node) and keep it out (stale reconnection off).
type Mount struct {
	PID        int    `json:"pid"`
	MountPoint string `json:"mount_point"`
	// From says where the settings were read: "admin socket" (the
	// daemon's live configuration) or "command line" (a ceph.conf setting
	// is not seen there).
	From string `json:"from"`
	// ID and Addr name the instance, as the MDS and the blocklist do
	// (from the admin socket only).
	ID   int64  `json:"id,omitempty"`
	Addr string `json:"addr,omitempty"`
	// Metadata is the client metadata the instance carries.
	Metadata map[string]string `json:"metadata"`
	// ReconnectStale is client_reconnect_stale: an evicted client that
	// opens a new session on its own.
	ReconnectStale bool `json:"reconnect_stale"`
	// Blocklisted is the daemon's word that it was shut out (fenced).
	Blocklisted bool `json:"blocklisted,omitempty"`

	staleSet bool // the command line sets client_reconnect_stale
}

// fromCmdline is Mount.From for settings read from the command line.
const fromCmdline = "command line"

// Missing says what keeps node's fence from finding or keeping out this
// mount's instance, one sentence each; none when it can be fenced.
// Read from a command line, an absent setting is not missing (ceph.conf
// may set it): Unknown says so.
func (m Mount) Missing(node string) []string {
	var miss []string
	switch got, ok := m.Metadata[NodeKey]; {
	case !ok && m.From != fromCmdline:
		miss = append(miss, fmt.Sprintf("its client metadata has no %s: a fence can't find it (mount with --client_metadata=%s=%s,%s=<boot id>)", NodeKey, NodeKey, node, BootKey))
	case ok && got != node:
		miss = append(miss, fmt.Sprintf("its client metadata names node %q, but this node is %q ($AGENT_LOOM_NODE, else the hostname): loomfs fence --node %s would not find it", got, node, node))
	}
	if m.ReconnectStale {
		miss = append(miss, "client_reconnect_stale is on: once evicted it would open a new session by itself and be let back in (set it false)")
	}
	if m.Blocklisted {
		miss = append(miss, "it is blocklisted: this node was fenced, and only a fresh mount after re-admission serves again")
	}
	return miss
}

// Unknown says what could not be read, for settings from a command line.
func (m Mount) Unknown() []string {
	if m.From != fromCmdline {
		return nil
	}
	var u []string
	if _, ok := m.Metadata[NodeKey]; !ok {
		u = append(u, fmt.Sprintf("its command line sets no %s client metadata; ceph.conf may (run the check as root to ask the daemon)", NodeKey))
	}
	if !m.staleSet {
		u = append(u, "its command line does not set client_reconnect_stale (off by default); ceph.conf may turn it on (run the check as root to ask the daemon)")
	}
	return u
}

// ErrNoDaemon is a mount no ceph-fuse process of this host serves.
var ErrNoDaemon = errors.New("no ceph-fuse process of this host serves the mount")

// FindMount finds the ceph-fuse daemon serving the mount at one of
// mountpoints (a mount and its bind mounts) and reads its settings: from
// its admin socket where this process may reach it, else from its
// command line.
func FindMount(ctx context.Context, mountpoints []string) (Mount, error) {
	want := map[string]bool{}
	for _, p := range mountpoints {
		want[filepath.Clean(p)] = true
	}
	pids, err := daemons()
	if err != nil {
		return Mount{}, err
	}
	var reasons []string
	for _, pid := range pids {
		args, cwd := cmdline(pid)
		if args == nil {
			continue
		}
		// The admin socket names the mount point in the metadata it sends
		// the MDS; a daemon whose socket can't be read is matched by its
		// command line.
		if m, err := askDaemon(ctx, pid); err == nil {
			if want[filepath.Clean(m.MountPoint)] {
				return m, nil
			}
			continue
		} else if !errors.Is(err, errNoSocket) {
			reasons = append(reasons, fmt.Sprintf("pid %d: %v", pid, err))
		}
		if m, ok := fromArgs(pid, args, cwd, want); ok {
			return m, nil
		}
	}
	if len(reasons) > 0 {
		return Mount{}, fmt.Errorf("%w (%s)", ErrNoDaemon, strings.Join(reasons, "; "))
	}
	return Mount{}, ErrNoDaemon
}

// daemons lists the pids of this host's ceph-fuse processes.
func daemons() ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if err == nil && strings.TrimSpace(string(comm)) == "ceph-fuse" {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

func cmdline(pid int) (args []string, cwd string) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || len(b) == 0 {
		return nil, ""
	}
	cwd, _ = os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
	return strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00"), cwd
}

// errNoSocket: the daemon has no admin socket this process can find.
var errNoSocket = errors.New("no admin socket")

// askDaemon reads a ceph-fuse daemon's status and its reconnection
// setting over its admin socket.
func askDaemon(ctx context.Context, pid int) (Mount, error) {
	sock, err := adminSocket(pid)
	if err != nil {
		return Mount{}, err
	}
	out, err := adminCommand(ctx, sock, `{"prefix":"status"}`)
	if err != nil {
		return Mount{}, err
	}
	var st struct {
		ID          int64             `json:"id"`
		Metadata    map[string]string `json:"metadata"`
		Addr        string            `json:"addr_str"`
		Blocklisted bool              `json:"blocklisted"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return Mount{}, fmt.Errorf("read its status: %w", err)
	}
	out, err = adminCommand(ctx, sock, `{"prefix":"config get","var":"client_reconnect_stale"}`)
	if err != nil {
		return Mount{}, err
	}
	var cfg struct {
		Stale string `json:"client_reconnect_stale"`
	}
	if err := json.Unmarshal(out, &cfg); err != nil {
		return Mount{}, fmt.Errorf("read client_reconnect_stale: %w", err)
	}
	m := Mount{PID: pid, MountPoint: st.Metadata["mount_point"], From: "admin socket", ID: st.ID, Addr: st.Addr,
		Metadata: st.Metadata, ReconnectStale: cfg.Stale == "true", Blocklisted: st.Blocklisted}
	return m, nil
}

// adminSocket finds the admin socket pid listens on: the unix socket it
// holds whose path ends in ".asok", as its network namespace lists it.
func adminSocket(pid int) (string, error) {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return "", fmt.Errorf("%w: %v", errNoSocket, err)
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if ino, ok := strings.CutPrefix(link, "socket:["); err == nil && ok {
			inodes[strings.TrimSuffix(ino, "]")] = true
		}
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/net/unix", pid))
	if err != nil {
		return "", fmt.Errorf("%w: %v", errNoSocket, err)
	}
	defer f.Close()
	// "Num RefCount Protocol Flags Type St Inode Path"
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fl := strings.Fields(sc.Text())
		if len(fl) == 8 && inodes[fl[6]] && strings.HasSuffix(fl[7], ".asok") {
			return fl[7], nil
		}
	}
	return "", errNoSocket
}

// adminCommand sends one command to a Ceph admin socket and returns its
// answer: the command's JSON and a NUL go out, a big-endian 32-bit length
// and that many bytes come back.
func adminCommand(ctx context.Context, sock, command string) ([]byte, error) {
	var d net.Dialer
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return nil, fmt.Errorf("admin socket: %w", err)
	}
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	conn.SetDeadline(deadline)
	if _, err := conn.Write(append([]byte(command), 0)); err != nil {
		return nil, fmt.Errorf("admin socket: %w", err)
	}
	var n uint32
	if err := binary.Read(conn, binary.BigEndian, &n); err != nil {
		return nil, fmt.Errorf("admin socket: %w", err)
	}
	if n > 16<<20 {
		return nil, fmt.Errorf("admin socket: an answer of %d bytes", n)
	}
	out := make([]byte, n)
	if _, err := io.ReadFull(conn, out); err != nil {
		return nil, fmt.Errorf("admin socket: %w", err)
	}
	return bytes.TrimSpace(out), nil
}

// fromArgs reads a daemon's settings from its command line if one of its
// arguments is one of the mount points: ceph takes --name=value and
// --name value, with '-' and '_' alike in the name.
func fromArgs(pid int, args []string, cwd string, mountpoints map[string]bool) (Mount, bool) {
	m := Mount{PID: pid, From: fromCmdline, Metadata: map[string]string{}}
	for i, a := range args[1:] {
		p := a
		if !filepath.IsAbs(p) && cwd != "" {
			p = filepath.Join(cwd, p)
		}
		if !strings.HasPrefix(a, "-") && mountpoints[filepath.Clean(p)] {
			m.MountPoint = filepath.Clean(p)
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "--") {
			continue
		}
		next := ""
		if i+2 < len(args) {
			next = args[i+2]
		}
		switch strings.ReplaceAll(name, "-", "_") {
		case "client_metadata":
			if !hasVal {
				val = next
			}
			for _, kv := range strings.Split(val, ",") {
				if k, v, ok := strings.Cut(kv, "="); ok {
					m.Metadata[strings.TrimSpace(k)] = strings.TrimSpace(v)
				}
			}
		case "client_reconnect_stale":
			if !hasVal {
				val = "true" // a bare boolean option sets it
				if b, err := strconv.ParseBool(next); err == nil {
					val = strconv.FormatBool(b)
				}
			}
			b, _ := strconv.ParseBool(val)
			m.ReconnectStale = b
			m.staleSet = true
		}
	}
	return m, m.MountPoint != ""
}
