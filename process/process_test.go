package process

import (
	"strings"
	"testing"

	"github.com/agentloom/loomfs/tools"
)

// A process that exits within yield_ms comes back whole in one call.
func TestShortCommandWhole(t *testing.T) {
	e := newEnv(t, "", testNode, "acme/coder/short", "")
	out := e.start(map[string]any{"command": "echo out; echo err >&2; exit 3"})
	if out.Status != tools.StatusExited || out.ExitCode == nil || *out.ExitCode != 3 {
		t.Fatalf("status %s exit %s, want exited 3", out.Status, exitText(out.ExitCode))
	}
	if out.Stdout != "out\n" || out.Stderr != "err\n" || out.Cursor != 8 {
		t.Fatalf("stdout %q stderr %q cursor %d", out.Stdout, out.Stderr, out.Cursor)
	}
}

// A Python REPL keeps its state between write calls.
func TestREPLStateKept(t *testing.T) {
	e := newEnv(t, "", testNode, "acme/coder/repl", "")
	out := e.start(map[string]any{"command": "python3 -i -q", "yield_ms": 200})
	if out.Status != tools.StatusRunning {
		t.Fatalf("REPL status %s: %+v", out.Status, out)
	}
	id := out.ProcessID
	var w tools.ProcessOutput
	e.must(tools.ProcessWrite, map[string]any{"process_id": id, "input": "x = 20\n", "yield_ms": 2000}, &w)
	e.must(tools.ProcessWrite, map[string]any{"process_id": id, "input": "print(x * 2 + 2)\n", "yield_ms": 5000}, &w)
	if !strings.Contains(w.Stdout, "42") {
		got := e.readUntil(id, w.Since, "42")
		w = got
	}
	e.must(tools.ProcessWrite, map[string]any{"process_id": id, "input": "exit()\n", "yield_ms": 5000}, &w)
	if w.Status != tools.StatusExited || *w.ExitCode != 0 {
		t.Fatalf("after exit(): %+v", w)
	}
}

// sh -c 'read x; echo got:$x' answers what it read on stdin.
func TestStdinRead(t *testing.T) {
	e := newEnv(t, "", testNode, "acme/coder/stdin", "")
	out := e.start(map[string]any{"command": "read x; echo got:$x", "yield_ms": 100})
	if out.Status != tools.StatusRunning {
		t.Fatalf("status %s before any input", out.Status)
	}
	var w tools.ProcessOutput
	e.must(tools.ProcessWrite, map[string]any{"process_id": out.ProcessID, "input": "hello\n", "yield_ms": 5000}, &w)
	if w.Status == tools.StatusRunning { // the answer came; the exit may follow it by a moment
		var r tools.ProcessOutput
		e.must(tools.ProcessRead, map[string]any{"process_id": out.ProcessID, "since": w.Cursor, "yield_ms": 5000}, &r)
		r.Stdout = w.Stdout + r.Stdout
		w = r
	}
	if w.Stdout != "got:hello\n" || w.Status != tools.StatusExited || *w.ExitCode != 0 {
		t.Fatalf("answer %+v", w)
	}
}

// A terminal program reads its window size, is resized, and reads it again.
func TestPTYResize(t *testing.T) {
	e := newEnv(t, "", testNode, "acme/coder/pty", "")
	out := e.start(map[string]any{"command": sizeTwice, "tty": true, "cols": 100, "rows": 30, "yield_ms": 500})
	got := e.readUntil(out.ProcessID, 0, "size 30 100")
	var info tools.ProcessInfo
	e.must(tools.ProcessResize, map[string]any{"process_id": out.ProcessID, "cols": 132, "rows": 43}, &info)
	if info.Cols != 132 || info.Rows != 43 {
		t.Fatalf("resize answer %+v", info)
	}
	var w tools.ProcessOutput
	e.must(tools.ProcessWrite, map[string]any{"process_id": out.ProcessID, "input": "\n", "yield_ms": 5000}, &w)
	after := e.readUntil(out.ProcessID, got.Cursor, "size 43 132")
	if tools.StripControl(after.Output) == "" {
		t.Fatal("empty output after resize")
	}
}

// Output past the buffer read with a stale cursor reports the dropped bytes.
func TestStaleCursorDropped(t *testing.T) {
	e := newEnv(t, "", testNode, "acme/coder/stale", "limits:\n  process_output_bytes: 1000\n")
	out := e.start(map[string]any{"command": "head -c 5000 /dev/zero | tr '\\0' a", "yield_ms": 5000})
	if out.Status != tools.StatusExited {
		t.Fatalf("status %s", out.Status)
	}
	var r tools.ProcessOutput
	e.must(tools.ProcessRead, map[string]any{"process_id": out.ProcessID, "since": 0}, &r)
	if r.DroppedBytes != 4000 || len(r.Output) != 1000 || r.Cursor != 5000 {
		t.Fatalf("dropped %d, %d bytes, cursor %d; want 4000, 1000, 5000", r.DroppedBytes, len(r.Output), r.Cursor)
	}
	e.must(tools.ProcessRead, map[string]any{"process_id": out.ProcessID, "since": 4500, "max_bytes": 100}, &r)
	if r.DroppedBytes != 0 || len(r.Output) != 100 || r.Cursor != 4600 || !r.Truncated {
		t.Fatalf("fresh cursor: dropped %d, %d bytes, cursor %d, truncated %v", r.DroppedBytes, len(r.Output), r.Cursor, r.Truncated)
	}
}

// sizeTwice prints the terminal's size, waits for a line, and prints it again.
const sizeTwice = `python3 -c 'import os; print("size", os.get_terminal_size(0).lines, os.get_terminal_size(0).columns, flush=True); input(); print("size", os.get_terminal_size(0).lines, os.get_terminal_size(0).columns)'`

// A signal reaches the process's children too: it goes to its group.
func TestSignalReachesGroup(t *testing.T) {
	e := newEnv(t, "", testNode, "acme/coder/group", "")
	out := e.start(map[string]any{"command": "sleep 600 & sleep 601 & wait", "yield_ms": 300})
	var info tools.ProcessInfo
	e.must(tools.ProcessSignal, map[string]any{"process_id": out.ProcessID, "signal": "TERM"}, &info)
	if info.Status != tools.StatusExited {
		t.Fatalf("after TERM: %+v", info)
	}
	ps := e.start(map[string]any{"command": "ps -o args | grep -c '^sleep 60[01]' || true", "yield_ms": 5000})
	if strings.TrimSpace(ps.Stdout) != "0" {
		t.Fatalf("sleeps left after TERM to the group: %q", ps.Stdout)
	}
}
