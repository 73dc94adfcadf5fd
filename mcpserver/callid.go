package mcpserver

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Call ids (SPEC §4) come from the JSON-RPC request id: a client that sends
// the same request again in the same session gets the recorded outcome.
//
// The SDK does not hand a tool handler the request id, so the door writes
// it into the request's _meta as the message comes in (stamp), overwriting
// whatever a client put under that key, and the handler reads it back.

// metaRequestID is the _meta key the door stamps; clients can't set it.
const metaRequestID = "io.github.agentloom.loomfs/request-id"

// maxCallID is the longest call id the store accepts.
const maxCallID = 256

// stamp writes req's id into the _meta of a tools/call request. Anything it
// can't parse is left for the SDK to refuse.
func stamp(req *jsonrpc.Request) bool {
	if req.Method != "tools/call" || !req.ID.IsValid() {
		return false
	}
	var params map[string]json.RawMessage
	if err := json.Unmarshal(req.Params, &params); err != nil || params == nil {
		return false
	}
	var meta map[string]json.RawMessage
	if raw, ok := params["_meta"]; ok {
		if err := json.Unmarshal(raw, &meta); err != nil {
			return false
		}
	}
	if meta == nil {
		meta = map[string]json.RawMessage{}
	}
	var id string
	switch v := req.ID.Raw().(type) {
	case int64:
		id = strconv.FormatInt(v, 10)
	case string:
		id = strconv.Quote(v) // "7" and 7 are different ids
	default:
		return false
	}
	meta[metaRequestID], _ = json.Marshal(id)
	params["_meta"], _ = json.Marshal(meta)
	b, err := json.Marshal(params)
	if err != nil {
		return false
	}
	req.Params = b
	return true
}

// callIDOf returns the call id of a stamped request: "mcp-<session>-<id>",
// or "" (not replayable) if the request was not stamped.
func callIDOf(req *mcp.CallToolRequest) string {
	rid, _ := req.Params.Meta[metaRequestID].(string)
	if rid == "" || req.Session == nil {
		return ""
	}
	id := "mcp-" + req.Session.ID() + "-" + rid
	if len(id) > maxCallID {
		sum := sha256.Sum256([]byte(rid))
		id = "mcp-" + req.Session.ID() + "-sha256:" + hex.EncodeToString(sum[:16])
	}
	return id
}

// stampTransport stamps every request read from the connections it makes,
// and names a session that has no id of its own (stdio) with a random one,
// so call ids of two sessions never meet.
type stampTransport struct{ mcp.Transport }

func (t stampTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := t.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	id := c.SessionID()
	if id == "" {
		id = rand.Text()
	}
	return &stampConn{Connection: c, id: id}, nil
}

type stampConn struct {
	mcp.Connection
	id string
}

func (c *stampConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	m, err := c.Connection.Read(ctx)
	if req, ok := m.(*jsonrpc.Request); ok {
		stamp(req)
	}
	return m, err
}

func (c *stampConn) SessionID() string { return c.id }

// stampHTTP stamps the tools/call requests in a POST body (one message or a
// batch) before next sees it. Session ids come from the transport there.
func stampHTTP(next http.Handler, limit int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Body == nil {
			next.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
		r.Body.Close()
		if err != nil {
			status := http.StatusBadRequest
			if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
				status = http.StatusRequestEntityTooLarge
			}
			http.Error(w, fmt.Sprintf("read request body: %v", err), status)
			return
		}
		if b, ok := stampBody(body); ok {
			body = b
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		next.ServeHTTP(w, r)
	})
}

// stampBody stamps the requests of a body; ok is false if it changed
// nothing or could not be parsed (the SDK answers that).
func stampBody(body []byte) ([]byte, bool) {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) > 0 && trimmed[0] == '[' {
		var raws []json.RawMessage
		if err := json.Unmarshal(trimmed, &raws); err != nil {
			return nil, false
		}
		changed := false
		for i, raw := range raws {
			if b, ok := stampOne(raw); ok {
				raws[i], changed = b, true
			}
		}
		if !changed {
			return nil, false
		}
		b, err := json.Marshal(raws)
		return b, err == nil
	}
	return stampOne(trimmed)
}

func stampOne(raw []byte) ([]byte, bool) {
	msg, err := jsonrpc.DecodeMessage(raw)
	if err != nil {
		return nil, false
	}
	req, ok := msg.(*jsonrpc.Request)
	if !ok || !stamp(req) {
		return nil, false
	}
	b, err := jsonrpc.EncodeMessage(req)
	return b, err == nil
}
