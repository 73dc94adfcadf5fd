package tools

import "testing"

func TestStripControl(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"plain text unchanged", "a\tb\n", "a\tb\n"},
		{"CRLF as LF", "one\r\ntwo\r\n", "one\ntwo\n"},
		{"SGR colours", "\x1b[1;31mred\x1b[0m", "red"},
		{"cursor moves and erase", "\x1b[2K\x1b[1Gline", "line"},
		{"OSC title, BEL or ST", "\x1b]0;title\x07a\x1b]2;t\x1b\\b", "ab"},
		{"bare C0 controls", "x\x08y\x07z", "xyz"},
		{"a bracketed-paste mode switch", "\x1b[?2004hcmd\x1b[?2004l", "cmd"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := StripControl(tc.in); got != tc.want {
				t.Errorf("StripControl(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}
