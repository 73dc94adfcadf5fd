package process

import (
	"bytes"
	"sync"
)

// Streams of a process's output.
const (
	streamOut byte = 1 // stdout, or the terminal
	streamErr byte = 2
)

// segment is bytes of one stream, in arrival order.
type segment struct {
	stream byte
	data   []byte
}

// Output is a process's bounded output buffer. Every byte written gets a
// cursor, its offset since the process started; the buffer keeps the last
// limit bytes and says how many a stale cursor missed, never silently.
type Output struct {
	mu      sync.Mutex
	limit   int
	start   int64 // cursor of the first byte kept
	end     int64 // cursor after the last byte written
	segs    []segment
	changed chan struct{} // closed and replaced on every write and on close
	closed  bool
}

func newOutput(limit int) *Output {
	return &Output{limit: limit, changed: make(chan struct{})}
}

// writer returns an io.Writer appending to stream.
func (o *Output) writer(stream byte) *streamWriter { return &streamWriter{o, stream} }

type streamWriter struct {
	o      *Output
	stream byte
}

func (w *streamWriter) Write(p []byte) (int, error) {
	w.o.append(w.stream, p)
	return len(p), nil
}

func (o *Output) append(stream byte, p []byte) {
	if len(p) == 0 {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if n := len(o.segs); n > 0 && o.segs[n-1].stream == stream {
		o.segs[n-1].data = append(o.segs[n-1].data, p...)
	} else {
		o.segs = append(o.segs, segment{stream, append([]byte(nil), p...)})
	}
	o.end += int64(len(p))
	for o.end-o.start > int64(o.limit) {
		over := o.end - o.start - int64(o.limit)
		first := &o.segs[0]
		if int64(len(first.data)) <= over {
			o.start += int64(len(first.data))
			o.segs = o.segs[1:]
			continue
		}
		first.data = append([]byte(nil), first.data[over:]...)
		o.start += over
	}
	o.notify()
}

// close wakes every waiter for good: no more output will come.
func (o *Output) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.closed {
		o.closed = true
		o.notify()
	}
}

func (o *Output) notify() {
	close(o.changed)
	o.changed = make(chan struct{})
}

// chunk is the output after a cursor.
type chunk struct {
	all, stdout, stderr []byte
	since, cursor       int64 // the cursors of all's first byte and of the byte after it
	dropped             int64
	more                bool // output follows cursor that max left out
}

// read returns up to max bytes after since. A since older than the kept
// bytes starts at the oldest and counts the rest as dropped; one past the
// end is read as the end. The chunk's since says where it starts.
func (o *Output) read(since int64, max int) chunk {
	o.mu.Lock()
	defer o.mu.Unlock()
	var c chunk
	if since > o.end {
		since = o.end
	}
	if since < o.start {
		c.dropped = o.start - since
		since = o.start
	}
	c.since = since
	var all, out, errb bytes.Buffer
	pos := o.start
	for _, s := range o.segs {
		segEnd := pos + int64(len(s.data))
		if segEnd > since && all.Len() < max {
			from := max64(since-pos, 0)
			data := s.data[from:]
			if room := max - all.Len(); len(data) > room {
				data = data[:room]
			}
			all.Write(data)
			if s.stream == streamErr {
				errb.Write(data)
			} else {
				out.Write(data)
			}
		}
		pos = segEnd
	}
	c.all, c.stdout, c.stderr = all.Bytes(), out.Bytes(), errb.Bytes()
	c.cursor = since + int64(all.Len())
	c.more = c.cursor < o.end
	return c
}

// state returns the end cursor and a channel closed at the next change.
func (o *Output) state() (end int64, changed <-chan struct{}, closed bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.end, o.changed, o.closed
}

func max64(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}
