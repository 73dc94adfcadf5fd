package tools

import (
	"fmt"
	"strings"

	"github.com/agentloom/loomfs/policy"
)

// takesPaths reports whether a tool's input names workspace paths or runs
// a command over them, so its description states the path rules: every
// tool but the process tools that address a process by id.
func takesPaths(name string) bool {
	switch name {
	case ProcessWrite, ProcessRead, ProcessResize, ProcessSignal, ProcessList:
		return false
	}
	return true
}

// processDefinitions are the process tools' model-visible definitions,
// with the session limits of pol in their words.
func processDefinitions(pol *policy.Policy) []Definition {
	l := pol.Limits
	rules := "The command sees the same path rules and limits as the tools."
	if r := policy.RulesSummary(pol); r != "" {
		rules += " Path rules in force: " + r
	}
	sandbox := fmt.Sprintf("Processes run in this workspace's session sandbox: one long-lived container with the workspace at /workspace (the working directory), the same isolation as workspace_command (no network, read-only system, writable /tmp, non-root user, umask 077), started on first use and stopped after %s with no running process and no call, and %s after it started in any case.", l.SessionIdle, l.SessionLifetime)
	outputNote := fmt.Sprintf("Each process keeps its last %s of output; output is read by cursor: pass the cursor of the previous answer as since. The answer's since is where its output starts: when bytes after the since you gave were dropped, dropped_bytes counts them and since is moved to the first byte kept. With tty the output is what the terminal saw; otherwise stdout and stderr are also given apart. The text shown strips terminal control sequences; the structured result keeps the raw bytes.", policy.Bytes(l.ProcessOutput))
	tree := "A process is its whole tree: what its command starts (also in the background, in a session of its own, or orphaned) belongs to it, and when the command exits what it left running is killed (left_running_killed counts it); oom_killed says the memory limit killed it. When the session's process limit is spent, a start answers session_exhausted naming the process that holds it: end that one with workspace_process_signal KILL. When the session's /tmp is full, answers carry session_tmp_full naming what fills it: delete what you no longer need there."
	yield := func(def int64) prop {
		return prop{"type": "integer", "minimum": 0, "maximum": MaxYield.Milliseconds(), "description": fmt.Sprintf("Milliseconds to wait for output before answering; default %d.", def)}
	}
	maxBytes := prop{"type": "integer", "minimum": 1, "maximum": MaxReadBytes, "description": fmt.Sprintf("Most output bytes to return; default %d. truncated says more followed.", DefaultReadBytes)}
	id := prop{"type": "string", "pattern": "^[a-z0-9-]{1,64}$", "description": "The process_id from workspace_process_start or workspace_process_list."}
	cols := prop{"type": "integer", "minimum": MinTermSize, "maximum": MaxTermSize, "description": fmt.Sprintf("Terminal columns; default %d.", DefaultCols)}
	rows := prop{"type": "integer", "minimum": MinTermSize, "maximum": MaxTermSize, "description": fmt.Sprintf("Terminal rows; default %d.", DefaultRows)}
	return []Definition{
		{ProcessStart, fmt.Sprintf("Start a long-running command (sh -c) that later calls can write to, read and signal: a dev server, a REPL, a watch-mode test runner, an interactive installer. Waits up to yield_ms for it to exit, so a short command's whole result comes back at once; otherwise returns status running, the output so far and a cursor. %s %s %s %s Use workspace_command for a one-shot command.", sandbox, outputNote, tree, rules),
			schema([]string{"command"}, map[string]prop{
				"command":          {"type": "string", "minLength": 1, "description": "Shell command line."},
				"tty":              {"type": "boolean", "description": "Run on a terminal (programs that need one: REPLs with line editing, curses programs, installers)."},
				"cols":             cols,
				"rows":             rows,
				"yield_ms":         yield(DefaultStartYield.Milliseconds()),
				"max_output_bytes": maxBytes,
			})},
		{ProcessWrite, fmt.Sprintf("Write text to a running process's stdin (control keys as characters: \"\\u0003\" is Ctrl-C on a terminal, \"\\u0004\" Ctrl-D; end a line with \"\\n\"), then wait up to yield_ms for its answer: the call returns once output came and paused, or the process exited. Returns the output that followed and the new cursor. At most %d bytes per call.", MaxProcessInput),
			schema([]string{"process_id", "input"}, map[string]prop{
				"process_id":       id,
				"input":            {"type": "string", "description": "Text to write; nothing is added to it."},
				"yield_ms":         yield(DefaultWriteYield.Milliseconds()),
				"max_output_bytes": maxBytes,
			})},
		{ProcessRead, "Read a process's output after a cursor (since, default 0: from the start of what is kept). With yield_ms, waits for output to come and pause. Returns status, exit_code once it exited, the output, since (where the output starts), the new cursor, dropped_bytes when since was older than the kept output, and truncated when more follows. " + outputNote,
			schema([]string{"process_id"}, map[string]prop{
				"process_id": id,
				"since":      {"type": "integer", "minimum": 0, "description": "Cursor from a previous answer; default 0."},
				"yield_ms":   yield(0),
				"max_bytes":  maxBytes,
			})},
		{ProcessResize, "Set the terminal size of a process started with tty; the program gets SIGWINCH.",
			schema([]string{"process_id", "cols", "rows"}, map[string]prop{"process_id": id, "cols": cols, "rows": rows})},
		{ProcessSignal, fmt.Sprintf("Send a signal to a process and every process it started, wherever they went (background, own session, orphaned): %s. INT is Ctrl-C, TERM asks it to end, KILL ends its whole tree at once, even when the session's process limit is spent. HUP is a hang-up. Returns its state; read it to see it exit.", strings.Join(Signals, ", ")),
			schema([]string{"process_id", "signal"}, map[string]prop{
				"process_id": id,
				"signal":     {"type": "string", "enum": Signals, "description": "Signal to send."},
			})},
		{ProcessList, "List this workspace's processes, running and recently ended: id, command, status, exit code, start and end time, and the cursor where their output ends.",
			schema(nil, map[string]prop{})},
	}
}
