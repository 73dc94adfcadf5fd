package mcpserver

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentloom/loomfs/changes"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/tools"
)

// The agent's other tools in MCP form: an image read answers as image
// content with its MIME type (the structured result without the pixels,
// so they are not sent twice), and patches and the change feed are
// rendered in words.

func init() {
	renderers[tools.ApplyPatch] = renderPatch
	renderers[tools.Changes] = renderChanges
	renderers[tools.ReadImage] = renderImage
}

// contentOf is the content and structured result of a tool's result.
func contentOf(name string, res json.RawMessage) ([]mcp.Content, any) {
	text := &mcp.TextContent{Text: render(name, res)}
	if name != tools.ReadImage {
		return []mcp.Content{text}, res
	}
	var r tools.ImageResult
	var m map[string]any
	if json.Unmarshal(res, &r) != nil || json.Unmarshal(res, &m) != nil {
		return []mcp.Content{text}, res
	}
	delete(m, "data")
	return []mcp.Content{&mcp.ImageContent{Data: r.Data, MIMEType: r.MIMEType}, text}, m
}

func renderImage(res json.RawMessage) (string, error) {
	var r tools.ImageResult
	if err := json.Unmarshal(res, &r); err != nil {
		return "", err
	}
	s := fmt.Sprintf("%s: %s image, %d×%d px, %s, sha256 %s", r.Path, r.OriginalFormat, r.OriginalWidth, r.OriginalHeight, policy.Bytes(r.FileBytes), r.SHA256)
	if r.Downscaled || r.Format != r.OriginalFormat {
		s += fmt.Sprintf("; shown as %s %d×%d px (%s)", r.Format, r.Width, r.Height, policy.Bytes(r.Bytes))
	}
	return s + "\n", nil
}

func renderPatch(res json.RawMessage) (string, error) {
	var r tools.PatchResult
	if err := json.Unmarshal(res, &r); err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "patch applied to %s:\n", plural(len(r.Files), "file", "files"))
	for _, f := range r.Files {
		switch f.Action {
		case "delete":
			fmt.Fprintf(&b, "  deleted %s\n", f.Path)
		case "move":
			fmt.Fprintf(&b, "  moved %s to %s (+%d -%d), sha256 %s\n", f.MovedFrom, f.Path, f.Added, f.Removed, f.SHA256)
		default:
			verb := "updated"
			if f.Action == "add" {
				verb = "added"
			}
			fmt.Fprintf(&b, "  %s %s (+%d -%d), sha256 %s\n", verb, f.Path, f.Added, f.Removed, f.SHA256)
		}
	}
	return b.String(), nil
}

func renderChanges(res json.RawMessage) (string, error) {
	var p changes.Page
	if err := json.Unmarshal(res, &p); err != nil {
		return "", err
	}
	var b strings.Builder
	if p.Reset {
		b.WriteString("reset: changes after your cursor are no longer kept; re-list what you need, then go on from the cursor below\n")
	}
	for _, e := range p.Changes {
		path := e.Path
		if e.To != "" {
			path += " -> " + e.To
		}
		if e.Subtree {
			path += " (and everything under it)"
		}
		fmt.Fprintf(&b, "%s %s %s by %s", e.Time, e.Op, path, e.Source)
		if e.CallID != "" {
			fmt.Fprintf(&b, " (call %s)", e.CallID)
		}
		b.WriteString("\n")
	}
	if len(p.Changes) == 0 && !p.Reset {
		b.WriteString("no changes\n")
	}
	if p.Truncated {
		b.WriteString("(more changes are waiting: call again with the cursor)\n")
	}
	fmt.Fprintf(&b, "cursor: %s\n", p.Cursor)
	return b.String(), nil
}
