package mcpserver

import (
	"bytes"
	"image"
	"image/color"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentloom/loomfs/tools"
)

// TestImageContent: an image read answers as MCP image content with its
// MIME type, and the structured result without the pixels.
func TestImageContent(t *testing.T) {
	tb := newToolbox(t, nil)
	img := image.NewRGBA(image.Rect(0, 0, 64, 32))
	img.Set(3, 3, color.RGBA{255, 0, 0, 255})
	var b bytes.Buffer
	png.Encode(&b, img)
	dir := filepath.Join(tb.WS.Volume().Path(), tb.WS.Scope().Dir())
	if err := os.WriteFile(filepath.Join(dir, "pic.png"), b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	cs := connect(t, newServer(t, tb, Options{}), overPipe, nil)
	res := callTool(t, cs, tools.ReadImage, map[string]any{"path": "pic.png", "max_dimension": 32})
	st := ok(t, res)
	if _, has := st["data"]; has {
		t.Error("the structured result carries the pixels too")
	}
	if st["width"] != 32.0 || st["height"] != 16.0 || st["format"] != "png" {
		t.Errorf("structured %v", st)
	}
	if len(res.Content) != 2 {
		t.Fatalf("content %v", res.Content)
	}
	ic, isImage := res.Content[0].(*mcp.ImageContent)
	if !isImage || ic.MIMEType != "image/png" {
		t.Fatalf("first content %#v, want image/png image content", res.Content[0])
	}
	cfg, format, err := image.DecodeConfig(bytes.NewReader(ic.Data))
	if err != nil || format != "png" || cfg.Width != 32 || cfg.Height != 16 {
		t.Errorf("image content is %s %dx%d (%v)", format, cfg.Width, cfg.Height, err)
	}
	if txt := text(res); !strings.Contains(txt, "pic.png: png image, 64×32 px") || !strings.Contains(txt, "shown as png 32×16") {
		t.Errorf("text %q", txt)
	}
}

// TestPatchAndChangesRendered: a patch and the change feed read in words.
func TestPatchAndChangesRendered(t *testing.T) {
	tb := newToolbox(t, nil)
	cs := connect(t, newServer(t, tb, Options{}), overPipe, nil)
	start := ok(t, callTool(t, cs, tools.Changes, map[string]any{}))["cursor"].(string)
	res := callTool(t, cs, tools.ApplyPatch, map[string]any{"patch": "*** Begin Patch\n*** Add File: a.txt\n+one\n*** End Patch"})
	ok(t, res)
	if txt := text(res); !strings.Contains(txt, "added a.txt (+1 -0), sha256 ") {
		t.Errorf("patch text %q", txt)
	}
	res = callTool(t, cs, tools.Changes, map[string]any{"since": start})
	if txt := text(res); !strings.Contains(txt, "create a.txt by tool") || !strings.Contains(txt, "cursor: ") {
		t.Errorf("changes text %q", txt)
	}
}
