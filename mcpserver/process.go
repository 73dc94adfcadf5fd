package mcpserver

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/agentloom/loomfs/tools"
)

func init() {
	for _, n := range []string{tools.ProcessStart, tools.ProcessWrite, tools.ProcessRead} {
		renderers[n] = renderProcessOutput
	}
	renderers[tools.ProcessResize] = renderProcessInfo
	renderers[tools.ProcessSignal] = renderProcessInfo
	renderers[tools.ProcessList] = renderProcessList
}

// renderProcessOutput shows the output as a terminal would, its control
// sequences stripped, then the process's state and the cursor to go on
// from.
func renderProcessOutput(res json.RawMessage) (string, error) {
	var r tools.ProcessOutput
	if err := json.Unmarshal(res, &r); err != nil {
		return "", err
	}
	var b strings.Builder
	if r.DroppedBytes > 0 {
		fmt.Fprintf(&b, "(%d bytes of output before this were dropped: the buffer keeps only the latest)\n", r.DroppedBytes)
	}
	text := tools.StripControl(r.Output)
	b.WriteString(text)
	if text != "" && !strings.HasSuffix(text, "\n") {
		b.WriteString("\n")
	}
	switch r.Status {
	case tools.StatusExited:
		code := "unknown"
		if r.ExitCode != nil {
			code = fmt.Sprint(*r.ExitCode)
		}
		fmt.Fprintf(&b, "[process %s exited with code %s; cursor %d]\n", r.ProcessID, code, r.Cursor)
	default:
		fmt.Fprintf(&b, "[process %s running; cursor %d: pass it as since to read on]\n", r.ProcessID, r.Cursor)
	}
	if r.Truncated {
		b.WriteString("(more output follows; read again from the cursor)\n")
	}
	return b.String(), nil
}

func renderProcessInfo(res json.RawMessage) (string, error) {
	var p tools.ProcessInfo
	if err := json.Unmarshal(res, &p); err != nil {
		return "", err
	}
	return processLine(p) + "\n", nil
}

func renderProcessList(res json.RawMessage) (string, error) {
	var r tools.ProcessListResult
	if err := json.Unmarshal(res, &r); err != nil {
		return "", err
	}
	if len(r.Processes) == 0 {
		return "no processes\n", nil
	}
	var b strings.Builder
	for _, p := range r.Processes {
		b.WriteString(processLine(p) + "\n")
	}
	return b.String(), nil
}

func processLine(p tools.ProcessInfo) string {
	state := p.Status
	if p.ExitCode != nil {
		state = fmt.Sprintf("exited %d", *p.ExitCode)
	}
	if p.Signal != "" {
		state += ", sent " + p.Signal
	}
	return fmt.Sprintf("%s\t%s\tcursor %d\t%s", p.ProcessID, state, p.Cursor, p.Command)
}
