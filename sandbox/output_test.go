package sandbox

import (
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestCapture(t *testing.T) {
	for _, tc := range []struct {
		name      string
		limit     int
		writes    []string
		want      string
		truncated bool
	}{
		{"empty", 10, nil, "", false},
		{"under the limit", 10, []string{"abc", "def"}, "abcdef", false},
		{"exactly the limit", 10, []string{"0123456789"}, "0123456789", false},
		{"one byte over keeps head and tail", 10, []string{"0123456789X"}, "01234\n…[loomfs: 1 bytes cut]…\n6789X", true},
		{"many small writes", 6, strings.Split(strings.Repeat("ab", 50), ""), "aba\n…[loomfs: 94 bytes cut]…\nbab", true},
		{"one huge write", 4, []string{"HEAD" + strings.Repeat(".", 1000) + "TAIL"}, "HE\n…[loomfs: 1004 bytes cut]…\nIL", true},
		{"cut inside a rune on both sides", 8, []string{"abc€" + strings.Repeat("x", 20) + "€yz"}, "abc\n…[loomfs: 26 bytes cut]…\nyz", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCapture(tc.limit)
			for _, w := range tc.writes {
				if n, err := c.Write([]byte(w)); n != len(w) || err != nil {
					t.Fatalf("Write = %d, %v", n, err)
				}
			}
			got, trunc := c.result()
			if got != tc.want || trunc != tc.truncated {
				t.Fatalf("result = %q, %v; want %q, %v", got, trunc, tc.want, tc.truncated)
			}
		})
	}
}

// TestCaptureBounded: memory stays bounded and the kept text is the true
// head and tail of the stream, whatever the write sizes.
func TestCaptureBounded(t *testing.T) {
	var all strings.Builder
	c := newCapture(100)
	for i := range 5000 {
		s := fmt.Sprintf("line %d\n", i)
		all.WriteString(s)
		c.Write([]byte(s))
		if len(c.head) > 50 || len(c.tail) > 100 {
			t.Fatalf("capture grew to head %d tail %d", len(c.head), len(c.tail))
		}
	}
	got, trunc := c.result()
	head, tail, ok := strings.Cut(got, fmt.Sprintf("\n…[loomfs: %d bytes cut]…\n", all.Len()-100))
	if !trunc || !ok || !strings.HasPrefix(all.String(), head) || !strings.HasSuffix(all.String(), tail) || !utf8.ValidString(got) {
		t.Fatalf("result %q", got)
	}
}
