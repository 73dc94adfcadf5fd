package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/tools"
)

// Options configure a Server. The zero value is usable.
type Options struct {
	// Version is reported to clients as the server's version ("dev" if empty).
	Version string
	// ProgressEvery is how often a call whose request carries a progress
	// token reports that it is still running (default 2 s; negative: never).
	ProgressEvery time.Duration
	// Logger receives the SDK's protocol log; nil discards it.
	Logger *slog.Logger
}

// Server serves the workspace tools of one Toolbox over MCP. It is safe for
// any number of concurrent sessions, all on the Toolbox's one scope.
type Server struct {
	tb       *tools.Toolbox
	srv      *mcp.Server
	opts     Options
	maxBytes int64 // largest inbound message accepted
}

// instructions tell a model how the tools fit together.
const instructions = "These tools work on one loomfs workspace; paths are relative to its root. " +
	"Read a file before you change it and pass its sha256 as expected_sha256 to workspace_write, " +
	"workspace_edit or workspace_delete, so a change made meanwhile is refused (code conflict) instead of lost. " +
	"A refusal names its code and what to do next."

// New returns a Server for tb. Every tool of tools.Definitions for the
// workspace's policy is registered; a schema that does not compile is an
// error, since clients would be handed a contract the server can't check.
func New(tb *tools.Toolbox, opts Options) (*Server, error) {
	if opts.Version == "" {
		opts.Version = "dev"
	}
	if opts.ProgressEvery == 0 {
		opts.ProgressEvery = 2 * time.Second
	}
	pol := tb.WS.Policy()
	s := &Server{tb: tb, opts: opts, maxBytes: maxMessage(pol.Limits.TextBytes)}
	s.srv = mcp.NewServer(&mcp.Implementation{Name: "loomfs", Version: opts.Version}, &mcp.ServerOptions{
		Instructions: instructions,
		Logger:       opts.Logger,
	})
	closed := false
	for _, d := range tools.Definitions(pol) {
		schema, err := compileSchema(d.InputSchema)
		if err != nil {
			return nil, fmt.Errorf("tool %s: input schema: %w", d.Name, err)
		}
		s.srv.AddTool(&mcp.Tool{
			Name:        d.Name,
			Description: d.Description,
			InputSchema: d.InputSchema,
			Annotations: &mcp.ToolAnnotations{
				ReadOnlyHint:    !tools.Mutating(d.Name),
				DestructiveHint: ptr(d.Name == tools.Write || d.Name == tools.Edit || d.Name == tools.Delete || d.Name == tools.Command || d.Name == tools.ApplyPatch || d.Name == tools.ProcessStart || d.Name == tools.ProcessWrite || d.Name == tools.ProcessSignal),
				OpenWorldHint:   &closed,
			},
		}, s.handler(d.Name, schema))
	}
	return s, nil
}

func ptr[T any](v T) *T { return &v }

// maxMessage bounds one inbound message: a text file at the limit, even if
// JSON escaping made every byte six, plus room for the envelope.
func maxMessage(textBytes int64) int64 {
	return max(4<<20, 6*textBytes+64<<10)
}

// compileSchema parses and resolves a tool's input schema.
func compileSchema(raw json.RawMessage) (*jsonschema.Resolved, error) {
	var s jsonschema.Schema
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, fmt.Errorf("parse: %w", err)
	}
	if s.Type != "object" {
		return nil, fmt.Errorf("type is %q, want object", s.Type)
	}
	r, err := s.Resolve(nil)
	if err != nil {
		return nil, fmt.Errorf("resolve: %w", err)
	}
	return r, nil
}

// Run serves one session over t until the peer goes away or ctx is done.
func (s *Server) Run(ctx context.Context, t mcp.Transport) error {
	return s.srv.Run(ctx, stampTransport{t})
}

// ServeStdio serves one session over stdin and stdout.
func (s *Server) ServeStdio(ctx context.Context) error {
	return s.Run(ctx, &mcp.StdioTransport{MaxLineLength: int(s.maxBytes)})
}

// handler runs one tool: schema check, then the Toolbox, then the result
// in MCP form. Refusals are tool results, never protocol errors, so the
// model sees them and can act on them.
func (s *Server) handler(name string, schema *jsonschema.Resolved) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		args := req.Params.Arguments
		if t := bytes.TrimSpace(args); len(t) == 0 || string(t) == "null" {
			args = json.RawMessage("{}")
		}
		callID := callIDOf(req)
		ctx = withMetaTrace(ctx, req.Params.Meta)
		if err := checkArgs(schema, name, args); err != nil {
			s.recordRefusal(ctx, name, callID, args, err)
			return errorResult(err), nil
		}
		if tok := req.Params.GetProgressToken(); tok != nil && s.opts.ProgressEvery > 0 {
			stop := reportProgress(ctx, req.Session, tok, name, s.opts.ProgressEvery)
			defer stop()
		}
		res, err := s.tb.Call(ctx, name, callID, args)
		if err != nil {
			return errorResult(err), nil
		}
		content, structured := contentOf(name, res)
		return &mcp.CallToolResult{Content: content, StructuredContent: structured}, nil
	}
}

// checkArgs refuses arguments that don't match the tool's input schema, so
// the door enforces what it advertises even where a handler is lenient.
func checkArgs(schema *jsonschema.Resolved, name string, args json.RawMessage) error {
	var v any
	if err := json.Unmarshal(args, &v); err != nil {
		return policy.Errorf(policy.InvalidInput, "%s arguments are not valid JSON: %v", name, err)
	}
	if _, ok := v.(map[string]any); !ok {
		return policy.Errorf(policy.InvalidInput, "%s arguments must be a JSON object, not %s", name, jsonKind(v))
	}
	if err := schema.Validate(v); err != nil {
		msg := strings.ReplaceAll(err.Error(), "validating root: ", "")
		msg = strings.ReplaceAll(msg, "validating /properties/", "")
		return policy.Errorf(policy.InvalidInput, "%s arguments do not match its input schema: %s", name, msg)
	}
	return nil
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case []any:
		return "an array"
	case string:
		return "a string"
	case float64:
		return "a number"
	case bool:
		return "a boolean"
	}
	return fmt.Sprintf("%T", v)
}

// recordRefusal audits a call refused at this door, as the Toolbox records
// its own refusals: every refusal is in the log (SPEC §8).
func (s *Server) recordRefusal(ctx context.Context, name, callID string, args json.RawMessage, err error) {
	if s.tb.Audit == nil {
		return
	}
	var in struct {
		Path string `json:"path"`
	}
	json.Unmarshal(args, &in)
	s.tb.Audit.Record(ctx, audit.Event{
		TraceID: s.tb.TraceID,
		CallID:  callID,
		Actor:   s.tb.Actor,
		Scope:   s.tb.WS.Scope().Hash(),
		Source:  audit.SourceTool,
		Op:      name,
		Path:    in.Path,
		Result:  "refused",
		Code:    string(policy.CodeOf(err)),
	})
}

// errorResult is a refusal as an MCP tool error: the loomfs error as
// structured content, as `loomfs tool` prints it, and "code: message" as
// text.
func errorResult(err error) *mcp.CallToolResult {
	pe := policy.AsError(err)
	text := string(pe.Code) + ": " + pe.Message
	if pe.SHA256 != "" && !strings.Contains(pe.Message, pe.SHA256) {
		text += " (current sha256 " + pe.SHA256 + ")"
	}
	return &mcp.CallToolResult{
		IsError:           true,
		Content:           []mcp.Content{&mcp.TextContent{Text: text}},
		StructuredContent: map[string]any{"error": pe},
	}
}

// reportProgress sends a progress notification every interval until stop
// is called; stop returns once no more can be sent, so none follows the
// result.
func reportProgress(ctx context.Context, ss *mcp.ServerSession, token any, name string, every time.Duration) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		start := time.Now()
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case now := <-tick.C:
				elapsed := now.Sub(start)
				ss.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
					ProgressToken: token,
					Progress:      elapsed.Seconds(),
					Message:       fmt.Sprintf("%s running for %s", name, elapsed.Round(time.Second)),
				})
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}
