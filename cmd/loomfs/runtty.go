package main

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/tools"
)

// runTTY runs command on a terminal in the scope's session sandbox and
// connects it to this one: keys go to its stdin, its output to stdout, a
// window change to its terminal. It returns the process's exit code.
// Every step is a process tool call, audited as any other.
func runTTY(ctx context.Context, tb *tools.Toolbox, command string) (int, error) {
	call := func(name string, in map[string]any, out any) error {
		b, _ := json.Marshal(in)
		res, err := tb.Call(ctx, name, "", b)
		if err != nil {
			return err
		}
		return json.Unmarshal(res, out)
	}
	cols, rows := termSize()
	var out tools.ProcessOutput
	if err := call(tools.ProcessStart, map[string]any{"command": command, "tty": true, "cols": cols, "rows": rows, "yield_ms": 0}, &out); err != nil {
		return 0, err
	}
	if restore, err := rawTerminal(); err == nil {
		defer restore()
	}
	id := out.ProcessID
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	defer signal.Stop(winch)
	go func() {
		for range winch {
			c, r := termSize()
			var info tools.ProcessInfo
			call(tools.ProcessResize, map[string]any{"process_id": id, "cols": c, "rows": r}, &info)
		}
	}()
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := os.Stdin.Read(buf)
			var w tools.ProcessOutput
			if n > 0 && call(tools.ProcessWrite, map[string]any{"process_id": id, "input": string(buf[:n]), "yield_ms": 0}, &w) != nil {
				return
			}
			if err == io.EOF {
				call(tools.ProcessWrite, map[string]any{"process_id": id, "input": "\x04", "yield_ms": 0}, &w)
				return
			}
			if err != nil {
				return
			}
		}
	}()
	since := int64(0)
	for {
		if err := call(tools.ProcessRead, map[string]any{"process_id": id, "since": since, "yield_ms": 200}, &out); err != nil {
			return 0, err
		}
		os.Stdout.WriteString(out.Output)
		since = out.Cursor
		if out.Status == tools.StatusExited && !out.Truncated {
			if out.ExitCode == nil {
				return 0, policy.Errorf(policy.SandboxUnavailable, "the process ended with its session sandbox; its exit code is unknown")
			}
			return *out.ExitCode, nil
		}
	}
}

// termSize is stdin's terminal size, or 80x24 when it is no terminal.
func termSize() (cols, rows int) {
	ws, err := unix.IoctlGetWinsize(int(os.Stdin.Fd()), unix.TIOCGWINSZ)
	if err != nil || ws.Col == 0 || ws.Row == 0 {
		return tools.DefaultCols, tools.DefaultRows
	}
	return int(ws.Col), int(ws.Row)
}

// rawTerminal puts stdin's terminal in raw mode, so keys such as Ctrl-C
// reach the sandbox's terminal rather than this process, and returns how
// to restore it. It fails when stdin is no terminal.
func rawTerminal() (restore func(), err error) {
	fd := int(os.Stdin.Fd())
	old, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		return nil, err
	}
	raw := *old
	raw.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
	raw.Oflag &^= unix.OPOST
	raw.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
	raw.Cflag &^= unix.CSIZE | unix.PARENB
	raw.Cflag |= unix.CS8
	raw.Cc[unix.VMIN], raw.Cc[unix.VTIME] = 1, 0
	if err := unix.IoctlSetTermios(fd, unix.TCSETS, &raw); err != nil {
		return nil, err
	}
	return func() { unix.IoctlSetTermios(fd, unix.TCSETS, old) }, nil
}
