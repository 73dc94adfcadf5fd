package sandbox

import (
	"fmt"
	"unicode/utf8"
)

// capture keeps the head and the tail of a stream, up to limit bytes in all,
// and counts what it drops in between, so a command that floods its output
// costs bounded memory and still shows how it started and how it ended.
type capture struct {
	limit int
	head  []byte
	tail  []byte // the last limit/2 bytes, after head filled; compacted lazily
	total int64
}

func newCapture(limit int) *capture { return &capture{limit: limit} }

func (c *capture) Write(p []byte) (int, error) {
	n := len(p)
	c.total += int64(n)
	if room := c.headCap() - len(c.head); room > 0 {
		k := min(room, len(p))
		c.head = append(c.head, p[:k]...)
		p = p[k:]
	}
	if len(p) == 0 {
		return n, nil
	}
	tc := c.tailCap()
	if len(p) >= tc {
		c.tail = append(c.tail[:0], p[len(p)-tc:]...)
		return n, nil
	}
	c.tail = append(c.tail, p...)
	if len(c.tail) > 2*tc {
		c.tail = append(c.tail[:0], c.tail[len(c.tail)-tc:]...)
	}
	return n, nil
}

func (c *capture) headCap() int { return c.limit - c.limit/2 }
func (c *capture) tailCap() int { return c.limit / 2 }

// result returns the kept text and whether anything was cut. A cut is marked
// in place by a line naming how many bytes are missing; the edges of the cut
// move to rune boundaries so the kept text stays valid UTF-8 where it was.
func (c *capture) result() (string, bool) {
	tail := c.tail
	if len(tail) > c.tailCap() {
		tail = tail[len(tail)-c.tailCap():]
	}
	kept := int64(len(c.head) + len(tail))
	if kept == c.total {
		return string(c.head) + string(tail), false
	}
	head := c.head
	for i := 1; i <= utf8.UTFMax && i <= len(head); i++ {
		if utf8.RuneStart(head[len(head)-i]) {
			if !utf8.FullRune(head[len(head)-i:]) {
				head = head[:len(head)-i]
			}
			break
		}
	}
	for i := 0; i < utf8.UTFMax && len(tail) > 0 && !utf8.RuneStart(tail[0]); i++ {
		tail = tail[1:]
	}
	cut := c.total - int64(len(head)+len(tail))
	return fmt.Sprintf("%s\n…[loomfs: %d bytes cut]…\n%s", head, cut, tail), true
}
