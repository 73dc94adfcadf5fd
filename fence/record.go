package fence

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// Dir is the directory on the volume's root that holds one record per
// fenced node, outside every scope (like the audit's and the locks').
const Dir = ".agentloom-fences"

// Record is a fence as kept on the volume: what a re-admission and a
// takeover check, and what the audit's fence event details.
type Record struct {
	Node   string    `json:"node"`
	Reason string    `json:"reason,omitempty"`
	By     string    `json:"by"` // the node that ran the fence
	Time   time.Time `json:"time"`
	Method string    `json:"method"` // MethodCeph or MethodExternal
	// Instances are the client instances blocklisted and evicted.
	Instances []Instance `json:"instances,omitempty"`
	OSDEpoch  int64      `json:"osd_epoch,omitempty"`
	Barrier   int64      `json:"osd_epoch_barrier,omitempty"`
	Warnings  []string   `json:"warnings,omitempty"`
	// Took is how long the fence took, from its start to the barrier.
	Took time.Duration `json:"took_ns"`
	// AuditMarked counts the node's audit files whose lengths the fence
	// kept as high-water marks (Marks).
	AuditMarked int `json:"audit_files_marked"`
	// JournalsMarked and CallLogsMarked count the files of the node's
	// change journals and the call logs it kept marks of; MarkerScopes
	// the scopes where the node had a marker or a quarantine.
	JournalsMarked int `json:"journal_files_marked"`
	CallLogsMarked int `json:"call_logs_marked"`
	MarkerScopes   int `json:"marker_scopes"`
}

// nodeName reports whether node may name its record: a hostname or an
// $AGENT_LOOM_NODE of the same characters, at most 253. A loop, not a
// regexp: compiling {0,252} took every loomfs process 3.7 ms at its start.
func nodeName(node string) bool {
	if len(node) == 0 || len(node) > 253 {
		return false
	}
	for i := 0; i < len(node); i++ {
		c := node[i]
		alnum := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
		if !alnum && (i == 0 || c != '.' && c != '_' && c != '-') {
			return false
		}
	}
	return true
}

// CheckNode refuses a node name that could not name a record (or match
// client metadata set on a mount's command line).
func CheckNode(node string) error {
	if !nodeName(node) {
		return fmt.Errorf("node name %q: want letters, digits, '.', '_' or '-', starting with a letter or digit, at most 253", node)
	}
	return nil
}

func recordPath(root, node string) string { return filepath.Join(root, Dir, node+".json") }

// Write keeps r as its node's record under root, replacing an earlier one
// (the audit keeps every fence). It is written whole or not at all and
// made durable before Write returns: a fence answers only once recorded.
func Write(root string, r Record) error {
	if err := CheckNode(r.Node); err != nil {
		return err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	dir := filepath.Join(root, Dir)
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("record the fence: %w", err)
	}
	f, err := os.CreateTemp(dir, ".tmp-"+r.Node+"-")
	if err != nil {
		return fmt.Errorf("record the fence: %w", err)
	}
	defer os.Remove(f.Name())
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), recordPath(root, r.Node))
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		return fmt.Errorf("record the fence: %w", err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Read returns node's fence record under root; an error wrapping
// os.ErrNotExist if the node was never fenced.
func Read(root, node string) (Record, error) {
	return readJSON[Record](node, "record", func() string { return recordPath(root, node) })
}

// readJSON reads node's fence file of kind what (a record, its marks),
// whose path is named only once node has been checked.
func readJSON[T any](node, what string, path func() string) (T, error) {
	var v T
	if err := CheckNode(node); err != nil {
		return v, err
	}
	b, err := os.ReadFile(path())
	if err == nil {
		err = json.Unmarshal(b, &v)
	}
	if err != nil {
		return v, fmt.Errorf("read the fence %s of node %s: %w", what, node, err)
	}
	return v, nil
}

// Remove lifts node's record under root once an administrator re-admits
// the node (the audit keeps the fence and the re-admission), durably.
func Remove(root, node string) error {
	if err := CheckNode(node); err != nil {
		return err
	}
	err := os.Remove(recordPath(root, node))
	if err == nil {
		err = syncDir(filepath.Join(root, Dir))
	}
	if err != nil {
		return fmt.Errorf("lift the fence record of node %s: %w", node, err)
	}
	return nil
}
