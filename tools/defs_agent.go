package tools

import (
	"fmt"

	"github.com/agentloom/loomfs/changes"
	"github.com/agentloom/loomfs/imagebudget"
	"github.com/agentloom/loomfs/policy"
)

// otherDefinitions are the definitions of the agent's other tools: the
// multi-file patch, the image read and the change feed. paths and quota
// are the sentences every tool's description ends with.
func otherDefinitions(pol *policy.Policy, paths, quota string) []Definition {
	l := pol.Limits
	text := policy.Bytes(l.TextBytes)
	return []Definition{
		{ApplyPatch, fmt.Sprintf("Apply a multi-file patch atomically: every file changes or none does. The patch is in apply_patch format (\"*** Begin Patch\", then per file \"*** Add File: PATH\" with \"+\" lines, \"*** Delete File: PATH\", or \"*** Update File: PATH\" with an optional \"*** Move to: PATH\" and \"@@\" hunks of \" \" context, \"-\" removed and \"+\" added lines, \"@@ LINE\" naming a line the hunk comes after, \"*** End of File\" for a hunk at the end; then \"*** End Patch\"), or a unified diff (\"--- a/PATH\", \"+++ b/PATH\", \"@@ -l,n +l,n @@\"). Hunks are found by their lines (exactly, then ignoring trailing and surrounding whitespace, then reading typographic dashes, quotes and spaces as their ASCII forms), not by line numbers. As in Codex, \"*** Add File:\" over an existing file and \"*** Move to:\" onto one replace it (unless expected_sha256 names that path and does not match), and \"*** Delete File:\" of a symbolic link removes the link. Every hunk of every file is checked before anything is written; one that does not apply fails with patch_failed naming the file, the hunk and the closest lines found, and nothing changes. Every refusal names the patch line and the file header it belongs to. Missing parent directories of added files are made. Returns per file the action, path, sha256, bytes, lines_added and lines_removed. Files over %s are refused. %s %s", text, paths, quota),
			schema([]string{"patch"}, withConfirm(pol, policy.OpWrite, withConfirm(pol, policy.OpDelete, map[string]prop{
				"patch":           {"type": "string", "minLength": 1, "description": "The whole patch text."},
				"expected_sha256": patchExpectedProp,
			})))},
		{ReadImage, fmt.Sprintf("Read an image file (PNG, JPEG, GIF or WebP, recognised by content) to look at it. It is downscaled to fit max_dimension (default %d px on its longer side) and at most %s; returns the image and width, height, format, mime_type, bytes, original_width, original_height and the file's sha256. Anything else fails with not_an_image. Files over %s, images over %d megapixels, and images whose decoding would take more than %s of memory (judged from the header; an interlaced or 16-bit PNG, a progressive JPEG or a WebP takes more a pixel), are refused (too_large) without decoding; read a smaller copy instead. %s", defaultImageDimension, policy.Bytes(l.ImageBytes), policy.Bytes(l.ImageSource), maxImagePixels/1_000_000, policy.Bytes(imagebudget.Limit), paths),
			schema([]string{"path"}, map[string]prop{
				"path":          pathProp("Image file to read."),
				"max_dimension": {"type": "integer", "minimum": minImageDimension, "maximum": maxImageDimension, "description": fmt.Sprintf("Longest side of the returned image in pixels; default %d.", defaultImageDimension)},
			})},
		{Changes, fmt.Sprintf("List what changed in the workspace after a cursor: by the tools and by every command or program writing in the workspace, on every node. Each change has op (create, write, delete, rename with path and to, mkdir, setattr, symlink, tree: anything under path may differ), path, source (tool, projection, or platform: placed by the platform that runs you), call_id where known, node and time. Returns changes, the next cursor and truncated (more are waiting: call again with the cursor). Leave since out to start now; with wait_ms it waits that long for the first change. reset true means changes after your cursor are no longer kept: re-list what you need, then go on from the returned cursor. Paths under hidden rules are never listed. %s", paths),
			schema(nil, map[string]prop{
				"since":   {"type": "string", "description": "Cursor from an earlier call; omit to start now."},
				"path":    pathProp("Only changes at or under this path; default the whole workspace."),
				"limit":   {"type": "integer", "minimum": 1, "maximum": changes.MaxLimit, "description": fmt.Sprintf("Most changes to return (default %d).", changes.DefaultLimit)},
				"wait_ms": {"type": "integer", "minimum": 0, "maximum": maxChangesWait, "description": "Wait up to this many milliseconds for a change when there is none yet."},
			})},
	}
}
