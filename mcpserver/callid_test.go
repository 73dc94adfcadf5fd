package mcpserver

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/tools"
)

func TestStampBody(t *testing.T) {
	const key = `"` + metaRequestID + `"`
	cases := []struct {
		name    string
		body    string
		changed bool
		want    []string // substrings of the stamped body
		notWant []string
	}{
		{"tools/call with an integer id", `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"workspace_read","arguments":{"path":"a"}}}`,
			true, []string{key + `:"7"`, `"arguments":{"path":"a"}`}, nil},
		{"string id is quoted", `{"jsonrpc":"2.0","id":"7","method":"tools/call","params":{"name":"x"}}`,
			true, []string{key + `:"\"7\""`}, nil},
		{"a client's own value is overwritten", `{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"x","_meta":{` + key + `:"1","progressToken":12345678901234567890}}}`,
			true, []string{key + `:"8"`, `"progressToken":12345678901234567890`}, []string{key + `:"1"`}},
		{"batch", `[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"x"}}]`,
			true, []string{key + `:"2"`, `"method":"ping"`}, nil},
		{"other method", `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}`, false, nil, nil},
		{"notification", `{"jsonrpc":"2.0","method":"tools/call","params":{"name":"x"}}`, false, nil, nil},
		{"params not an object", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":[1]}`, false, nil, nil},
		{"not JSON", `{"jsonrpc":`, false, nil, nil},
		{"batch without a call", `[{"jsonrpc":"2.0","id":1,"method":"ping"}]`, false, nil, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, changed := stampBody([]byte(c.body))
			if changed != c.changed {
				t.Fatalf("changed = %v, want %v (%s)", changed, c.changed, b)
			}
			for _, w := range c.want {
				if !strings.Contains(string(b), w) {
					t.Errorf("stamped body lacks %s:\n%s", w, b)
				}
			}
			for _, w := range c.notWant {
				if strings.Contains(string(b), w) {
					t.Errorf("stamped body still has %s:\n%s", w, b)
				}
			}
		})
	}
}

// rawSession speaks newline-delimited JSON-RPC to a server, as a client
// that picks its own request ids does.
type rawSession struct {
	t   *testing.T
	in  io.WriteCloser
	out *bufio.Reader
}

func newRawSession(t *testing.T, s *Server) *rawSession {
	t.Helper()
	cr, sw := io.Pipe()
	sr, cw := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, &mcp.IOTransport{Reader: sr, Writer: sw}) }()
	t.Cleanup(func() {
		cw.Close()
		cancel()
		<-done
	})
	rs := &rawSession{t: t, in: cw, out: bufio.NewReader(cr)}
	rs.send(`{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	rs.response("init")
	rs.send(`{"jsonrpc":"2.0","method":"notifications/initialized","params":{}}`)
	return rs
}

func (rs *rawSession) send(line string) {
	rs.t.Helper()
	if _, err := io.WriteString(rs.in, line+"\n"); err != nil {
		rs.t.Fatal(err)
	}
}

// response reads messages until the response to id.
func (rs *rawSession) response(id any) *jsonrpc.Response {
	rs.t.Helper()
	if n, isInt := id.(int); isInt {
		id = float64(n)
	}
	want, err := jsonrpc.MakeID(id)
	if err != nil {
		rs.t.Fatal(err)
	}
	for {
		line, err := rs.out.ReadBytes('\n')
		if err != nil {
			rs.t.Fatalf("read response %v: %v", id, err)
		}
		msg, err := jsonrpc.DecodeMessage(line)
		if err != nil {
			rs.t.Fatalf("bad message %s: %v", line, err)
		}
		if r, ok := msg.(*jsonrpc.Response); ok && r.ID == want {
			if r.Error != nil {
				rs.t.Fatalf("response %v: %v", id, r.Error)
			}
			return r
		}
	}
}

// call sends tools/call with a chosen id and _meta and returns the result.
func (rs *rawSession) call(id int, meta string, name string, args map[string]any) map[string]any {
	rs.t.Helper()
	a, _ := json.Marshal(args)
	rs.send(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":%q,"arguments":%s,"_meta":%s}}`, id, name, a, meta))
	var res struct {
		IsError           bool           `json:"isError"`
		StructuredContent map[string]any `json:"structuredContent"`
	}
	if err := json.Unmarshal(rs.response(id).Result, &res); err != nil {
		rs.t.Fatal(err)
	}
	if res.IsError {
		rs.t.Fatalf("call %d: %v", id, res.StructuredContent)
	}
	return res.StructuredContent
}

// TestRepeatedRequestIsReplayed: a request sent again with its id in the
// same session gets the recorded result and does not run again (SPEC §4);
// a client can't borrow another request's call id through _meta.
func TestRepeatedRequestIsReplayed(t *testing.T) {
	tb := newToolbox(t, nil)
	rs := newRawSession(t, newServer(t, tb, Options{}))
	first := map[string]any{"path": "r.txt", "content": "first\n"}

	w7 := rs.call(7, `{}`, tools.Write, first)
	rs.call(8, `{}`, tools.Write, map[string]any{"path": "r.txt", "content": "second\n"})
	again := rs.call(7, `{}`, tools.Write, first)
	if again["sha256"] != w7["sha256"] || again["created"] != true {
		t.Fatalf("repeated request 7 answered %v, want the recorded %v", again, w7)
	}
	if got := readFile(t, tb, "r.txt"); got != "second\n" {
		t.Fatalf("repeated request ran again: file holds %q", got)
	}

	spoof := fmt.Sprintf(`{%q:"7"}`, metaRequestID)
	w9 := rs.call(9, spoof, tools.Write, first)
	if w9["created"] != false {
		t.Fatalf("request 9 claiming id 7 got its recorded result: %v", w9)
	}
	if got := readFile(t, tb, "r.txt"); got != "first\n" {
		t.Fatalf("request 9 did not run: file holds %q", got)
	}

	// Another session's request 7 is another call.
	rs2 := newRawSession(t, newServer(t, tb, Options{}))
	other := rs2.call(7, `{}`, tools.Write, map[string]any{"path": "r.txt", "content": "third\n"})
	if other["created"] != false || readFile(t, tb, "r.txt") != "third\n" {
		t.Fatalf("request 7 of a new session was taken for a replay: %v", other)
	}
}

func readFile(t *testing.T, tb *tools.Toolbox, rel string) string {
	t.Helper()
	res, err := tb.Call(context.Background(), tools.Read, "", json.RawMessage(fmt.Sprintf(`{"path":%q}`, rel)))
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Content string `json:"content"`
	}
	json.Unmarshal(res, &r)
	return r.Content
}

// TestLongRequestIDs: a request id too long for a call id is hashed, not
// refused.
func TestLongRequestIDs(t *testing.T) {
	tb := newToolbox(t, nil)
	rs := newRawSession(t, newServer(t, tb, Options{}))
	long := strings.Repeat("x", 400)
	rs.send(fmt.Sprintf(`{"jsonrpc":"2.0","id":%q,"method":"tools/call","params":{"name":"workspace_list","arguments":{}}}`, long))
	var res struct {
		IsError bool `json:"isError"`
	}
	json.Unmarshal(rs.response(long).Result, &res)
	if res.IsError {
		t.Fatal("long request id refused")
	}
	e := recorderOf(tb).waitFor(t, 5*time.Second, "list done", func(e audit.Event) bool { return e.Op == tools.List && e.Result == "ok" })
	if len(e.CallID) > maxCallID || !strings.Contains(e.CallID, "-sha256:") {
		t.Fatalf("call id %q", e.CallID)
	}
}
