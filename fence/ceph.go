package fence

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The client metadata keys a node's ceph-fuse (or kernel mount) carries,
// set at mount with --client_metadata=loomfs_node=N,loomfs_boot=B. They
// are how a fence finds exactly one node's client instances: never by IP
// (several nodes may share one behind NAT, and one node's address may
// move), never by hostname (the session's own, which containers share).
const (
	NodeKey = "loomfs_node"
	BootKey = "loomfs_boot"
)

// Ceph runs the ceph command against one cluster. The command needs a
// cephx identity that may list and evict the MDS's clients (mds "allow *")
// and add OSD blocklist entries (mon "allow command \"osd blocklist\"").
type Ceph struct {
	Conf string // ceph.conf path; "" is ceph's own default
	ID   string // cephx user without "client."; "" is ceph's own default
	// FS names the file system whose rank 0 is asked; "" asks rank 0 of
	// the only one. Every client has a session with rank 0, and one
	// blocklist entry shuts an instance out of every rank.
	FS string
	// Timeout bounds each ceph command; 0 is a minute.
	Timeout time.Duration
}

// Instance is one client instance (one mount) of the file system as the
// MDS lists it.
type Instance struct {
	ID int64 `json:"id"` // the client's global id: client.<ID>
	// Addr is the instance's entity address (ip:port/nonce), the unit the
	// OSDs blocklist: one process's one mount, not a host.
	Addr     string `json:"addr"`
	Node     string `json:"node,omitempty"` // its loomfs_node metadata
	Boot     string `json:"boot,omitempty"` // its loomfs_boot metadata
	Hostname string `json:"hostname,omitempty"`
	// Reconnecting is the MDS's word that the session is being
	// re-established (after an MDS failover).
	Reconnecting bool `json:"reconnecting,omitempty"`
	// BlocklistedUntil is when the instance's blocklist entry lapses, once
	// fenced.
	BlocklistedUntil time.Time `json:"blocklisted_until,omitzero"`
}

// run runs ceph with args and returns its standard output; standard
// error (where the messenger also logs its resets) goes into the error.
func (c *Ceph) run(ctx context.Context, args ...string) ([]byte, error) {
	timeout := c.Timeout
	if timeout == 0 {
		timeout = time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var full []string
	if c.Conf != "" {
		full = append(full, "--conf", c.Conf)
	}
	if c.ID != "" {
		full = append(full, "--id", c.ID)
	}
	full = append(full, args...)
	cmd := exec.CommandContext(ctx, "ceph", full...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Start()
	if err == nil {
		// A fence runs on a node busy with its own work (it is about to
		// take over more), and each ceph command is a Python process
		// that needs the CPU for a second or so to start: at the nice
		// value of the agents' work, a loaded node made a fence take
		// 20 s. Raised where the fence may (root), so the takeover does
		// not wait on the load it is meant to relieve; its threads,
		// started later, inherit it.
		unix.Setpriority(unix.PRIO_PROCESS, cmd.Process.Pid, cephNice)
		err = cmd.Wait()
	}
	if err != nil {
		return stdout.Bytes(), fmt.Errorf("ceph %s: %w: %s", strings.Join(args, " "), err, lastLine(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// cephNice is the nice value of a fence's ceph commands.
const cephNice = -10

// lastLine is the last non-empty line of s, the one ceph puts its error in.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

func (c *Ceph) mds() string {
	if c.FS == "" {
		return "mds.0"
	}
	return "mds." + c.FS + ":0"
}

// Clients lists every client instance with a session at the MDS.
func (c *Ceph) Clients(ctx context.Context) ([]Instance, error) {
	out, err := c.run(ctx, "tell", c.mds(), "client", "ls", "--format", "json")
	if err != nil {
		return nil, err
	}
	return parseClients(out)
}

// parseClients reads the MDS's "client ls" answer.
func parseClients(out []byte) ([]Instance, error) {
	var sessions []struct {
		ID             int64          `json:"id"`
		Inst           string         `json:"inst"` // "client.4305 172.21.9.34:0/422650892"
		Reconnecting   bool           `json:"reconnecting"`
		ClientMetadata map[string]any `json:"client_metadata"`
	}
	if err := json.Unmarshal(out, &sessions); err != nil {
		return nil, fmt.Errorf("read the MDS's client list: %w", err)
	}
	list := make([]Instance, 0, len(sessions))
	for _, s := range sessions {
		name, addr, ok := strings.Cut(s.Inst, " ")
		if !ok || name != "client."+strconv.FormatInt(s.ID, 10) || !strings.Contains(addr, "/") {
			return nil, fmt.Errorf("read the MDS's client list: client %d has instance %q, want \"client.%d ip:port/nonce\"", s.ID, s.Inst, s.ID)
		}
		str := func(k string) string { v, _ := s.ClientMetadata[k].(string); return v }
		list = append(list, Instance{ID: s.ID, Addr: addr, Node: str(NodeKey), Boot: str(BootKey), Hostname: str("hostname"), Reconnecting: s.Reconnecting})
	}
	return list, nil
}

// Blocklist shuts addr out of the OSDs for expire. An address already
// listed keeps the expiry it has (the monitor does not replace an
// entry), which is why a fence blocklists before it evicts: the MDS's
// own eviction adds an entry with the monitor's default expiry, an hour.
func (c *Ceph) Blocklist(ctx context.Context, addr string, expire time.Duration) error {
	_, err := c.run(ctx, "osd", "blocklist", "add", addr, strconv.FormatInt(int64(expire/time.Second), 10))
	return err
}

// Unblocklist removes addr's entry (tests' cleanup; re-admitting a node
// never needs it: a fresh mount is a new instance).
func (c *Ceph) Unblocklist(ctx context.Context, addr string) error {
	_, err := c.run(ctx, "osd", "blocklist", "rm", addr)
	return err
}

// Blocklisted returns the OSD map's blocklist: address to expiry.
func (c *Ceph) Blocklisted(ctx context.Context) (map[string]time.Time, error) {
	out, err := c.run(ctx, "osd", "blocklist", "ls", "--format", "json")
	if err != nil {
		return nil, err
	}
	return parseBlocklist(out)
}

func parseBlocklist(out []byte) (map[string]time.Time, error) {
	var entries []struct {
		Addr  string `json:"addr"`
		Until string `json:"until"` // "2031-12-06T12:33:56.698861+0000"
	}
	// The answer is the entries, then (since 16.2.11) the range entries.
	if err := json.NewDecoder(bytes.NewReader(out)).Decode(&entries); err != nil {
		return nil, fmt.Errorf("read the OSD blocklist: %w", err)
	}
	m := make(map[string]time.Time, len(entries))
	for _, e := range entries {
		t, err := parseUntil(e.Until)
		if err != nil {
			return nil, fmt.Errorf("read the OSD blocklist: entry %s: %w", e.Addr, err)
		}
		m[e.Addr] = t
	}
	return m, nil
}

// parseUntil reads a blocklist entry's expiry as ceph prints it.
func parseUntil(s string) (time.Time, error) {
	return time.Parse("2006-01-02T15:04:05.999999-0700", s)
}

// Evict closes client id's session at the MDS; the MDS blocklists it
// (a no-op for an address already listed), waits for the OSD map that
// carries the entry and raises its OSD epoch barrier. A session already
// gone (the MDS saw the blocklist first) is not an error.
func (c *Ceph) Evict(ctx context.Context, id int64) error {
	_, err := c.run(ctx, "tell", c.mds(), "client", "evict", "id="+strconv.FormatInt(id, 10))
	if err != nil && strings.Contains(err.Error(), "not in sessionmap") {
		return nil
	}
	return err
}

// osdEpoch returns the current OSD map epoch.
func (c *Ceph) osdEpoch(ctx context.Context) (int64, error) {
	e, _, err := c.osdMap(ctx, 0)
	return e, err
}

// osdMap returns the epoch and the blocklist (address to expiry) of the
// OSD map of epoch (0: the current one).
func (c *Ceph) osdMap(ctx context.Context, epoch int64) (int64, map[string]time.Time, error) {
	args := []string{"osd", "dump"}
	if epoch > 0 {
		args = append(args, strconv.FormatInt(epoch, 10))
	}
	out, err := c.run(ctx, append(args, "--format", "json")...)
	if err != nil {
		return 0, nil, err
	}
	return parseOSDMap(out)
}

// parseOSDMap reads the epoch and the blocklist of "osd dump".
func parseOSDMap(out []byte) (int64, map[string]time.Time, error) {
	var dump struct {
		Epoch     int64             `json:"epoch"`
		Blocklist map[string]string `json:"blocklist"` // address: "2031-12-06T12:33:56.698861+0000"
	}
	if err := json.Unmarshal(out, &dump); err != nil {
		return 0, nil, fmt.Errorf("read the OSD map: %w", err)
	}
	list := make(map[string]time.Time, len(dump.Blocklist))
	for addr, until := range dump.Blocklist {
		t, err := parseUntil(until)
		if err != nil {
			return 0, nil, fmt.Errorf("read the OSD map %d: blocklist entry %s: %w", dump.Epoch, addr, err)
		}
		list[addr] = t
	}
	return dump.Epoch, list, nil
}

// epochWith returns the first OSD map epoch after before that carries an
// entry for every instance in ins (the epoch the MDS's barrier must
// reach), and the current map's entries, where a fence reads its own
// back. Another change of the map before or after them (an entry
// lapsing) has an epoch of its own, which the barrier need not reach.
// The current map is usually the one: only a change between the entries
// makes it read the maps between.
func (c *Ceph) epochWith(ctx context.Context, before int64, ins []Instance) (int64, map[string]time.Time, error) {
	carries := func(list map[string]time.Time) bool {
		for _, in := range ins {
			if _, ok := list[in.Addr]; !ok {
				return false
			}
		}
		return true
	}
	now, current, err := c.osdMap(ctx, 0)
	if err != nil {
		return 0, nil, err
	}
	if !carries(current) {
		return 0, nil, fmt.Errorf("the OSD map %d does not carry the blocklist entries just added for %v", now, addrs(ins))
	}
	// An entry that was there already (the MDS evicted the instance a
	// moment before) is in the map before too.
	for e := max(before, 1); e < now; e++ {
		_, list, err := c.osdMap(ctx, e)
		if err != nil {
			return 0, nil, err
		}
		if carries(list) {
			return e, current, nil
		}
	}
	return now, current, nil
}

func addrs(ins []Instance) []string {
	var a []string
	for _, in := range ins {
		a = append(a, in.Addr)
	}
	return a
}

// barrier returns the MDS's OSD epoch barrier: the epoch a client must
// have seen before it may touch objects an evicted client might have
// been writing.
func (c *Ceph) barrier(ctx context.Context) (int64, error) {
	out, err := c.run(ctx, "tell", c.mds(), "status")
	if err != nil {
		return 0, err
	}
	var st struct {
		Barrier int64 `json:"osdmap_epoch_barrier"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return 0, fmt.Errorf("read the MDS's status: %w", err)
	}
	return st.Barrier, nil
}
