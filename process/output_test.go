package process

import "testing"

// The buffer keeps the last limit bytes, in order, both streams; a cursor
// older than them gets what is left, the count of what was dropped and
// where what it got starts. The since of an answer is never past its
// cursor.
func TestOutputCursor(t *testing.T) {
	o := newOutput(10)
	o.append(streamOut, []byte("abcdef"))
	o.append(streamErr, []byte("GHIJ"))
	o.append(streamOut, []byte("kl")) // 12 written, "cdefGHIJkl" kept
	for _, tc := range []struct {
		name                string
		since               int64
		max                 int
		all, stdout, stderr string
		from, cursor        int64
		dropped             int64
		more                bool
	}{
		{"from the start: two bytes dropped, output starts at 2", 0, 100, "cdefGHIJkl", "cdefkl", "GHIJ", 2, 12, 2, false},
		{"one byte dropped", 1, 3, "cde", "cde", "", 2, 5, 1, true},
		{"a fresh cursor", 6, 100, "GHIJkl", "kl", "GHIJ", 6, 12, 0, false},
		{"bounded by max", 2, 5, "cdefG", "cdef", "G", 2, 7, 0, true},
		{"at the end", 12, 100, "", "", "", 12, 12, 0, false},
		{"past the end reads as the end", 99, 100, "", "", "", 12, 12, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := o.read(tc.since, tc.max)
			if string(c.all) != tc.all || string(c.stdout) != tc.stdout || string(c.stderr) != tc.stderr ||
				c.since != tc.from || c.cursor != tc.cursor || c.dropped != tc.dropped || c.more != tc.more {
				t.Errorf("read(%d, %d) = %q %q %q since %d cursor %d dropped %d more %v", tc.since, tc.max,
					c.all, c.stdout, c.stderr, c.since, c.cursor, c.dropped, c.more)
			}
			if c.since > c.cursor || c.since+int64(len(c.all)) != c.cursor {
				t.Errorf("read(%d, %d): since %d, %d bytes, cursor %d", tc.since, tc.max, c.since, len(c.all), c.cursor)
			}
		})
	}
}

// A read of a process whose output is no longer kept returns none of it:
// its since and cursor are the record's cursor, whatever since was asked,
// and what the asked since missed is counted as dropped.
func TestEndedOutputCursor(t *testing.T) {
	r := Record{ID: "p-1", Status: "exited", Cursor: 100}
	for _, tc := range []struct {
		name                   string
		since                  int64
		wantSince, wantDropped int64
	}{
		{"from the start", 0, 100, 100},
		{"from the middle", 40, 100, 60},
		{"at the end", 100, 100, 0},
		{"past the end", 500, 100, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := r.endedOutput(tc.since)
			if o.Since != tc.wantSince || o.Cursor != 100 || o.DroppedBytes != tc.wantDropped || o.Since > o.Cursor {
				t.Errorf("endedOutput(%d): since %d cursor %d dropped %d", tc.since, o.Since, o.Cursor, o.DroppedBytes)
			}
		})
	}
}
