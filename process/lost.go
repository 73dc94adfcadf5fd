package process

import (
	"fmt"
	"time"

	"github.com/agentloom/loomfs/fence"
	"github.com/agentloom/loomfs/store"
	"github.com/agentloom/loomfs/tools"
)

// fencedNodes reads, for one pass over a scope's records, each node's
// fence record once: a process recorded running on a node the volume
// records as fenced is lost, for its node writes nothing any more and
// stops its own sandboxes once it sees the fence (loom.Node.WatchFence).
type fencedNodes struct {
	root string
	seen map[string]*fence.Record
}

func newFencedNodes(ws *store.Workspace) *fencedNodes {
	return &fencedNodes{root: ws.Volume().Path(), seen: map[string]*fence.Record{}}
}

func (f *fencedNodes) of(node string) *fence.Record {
	r, ok := f.seen[node]
	if !ok {
		if rec, err := fence.Read(f.root, node); err == nil {
			r = &rec
		}
		f.seen[node] = r
	}
	return r
}

// settle returns rec as it stands: lost, ended at its node's fence, if
// it is recorded running on a node the volume records as fenced.
func (f *fencedNodes) settle(rec Record) (Record, bool) {
	if rec.Ended != nil {
		return rec, false
	}
	fr := f.of(rec.Node)
	if fr == nil {
		return rec, false
	}
	ended := fr.Time
	rec.Status, rec.Ended = tools.StatusLost, &ended
	rec.Reason = fmt.Sprintf("lost: node %s, which ran it, was fenced at %s, so it ended there; its output is gone and the work continues on another node", rec.Node, fr.Time.UTC().Format(time.RFC3339))
	return rec, true
}

// Records lists a scope's process records as they stand, for when no
// service of this node answers: a process of a fenced node is lost.
func Records(ws *store.Workspace) ([]tools.ProcessInfo, error) {
	ids, err := ws.ProcessRecordIDs()
	if err != nil {
		return nil, err
	}
	fenced := newFencedNodes(ws)
	var out []tools.ProcessInfo
	for _, id := range ids {
		var rec Record
		if ok, err := ws.ReadProcessRecord(id, &rec); err == nil && ok {
			rec, _ = fenced.settle(rec)
			out = append(out, rec.Info())
		}
	}
	return out, nil
}
