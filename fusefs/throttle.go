package fusefs

import (
	"context"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/agentloom/loomfs/throttle"
)

// The policy's io_bytes_per_s and io_ops_per_s hold the scope to a rate
// (package throttle), shared with the tool door of the same process: a
// read or write waits for its bytes before it is served, and every other
// request for its operation, so a program over the limit is slowed, never
// failed. The limits are the scope's: every other process serving it, on
// any node, takes its share (throttle.Share). An open file that had to
// wait gets a "throttle" record at its release: how often and how long,
// beside the rates and how many processes shared them. A signal to a
// writer interrupts its wait; the write then moves only the bytes it took
// (throttleWrite), so signals can't carry a writer past the limit.

// throttle waits for n bytes and one operation of the scope's limits, and
// counts the wait against the open file. It returns how many of the n
// bytes were taken: fewer when the request was interrupted while it
// waited (a signal to the caller cancels the request's context).
func (h *handle) throttle(ctx context.Context, n int) int {
	taken, d := h.node.fsys.limit.Take(ctx, n)
	if d > 0 {
		h.throttleWaits.Add(1)
		h.throttled.Add(int64(d))
	}
	return taken
}

// throttleWrite is throttle for a write, which then moves only the bytes
// taken: a signal that interrupts the wait makes the write short, as
// POSIX lets an interrupted write be (the kernel returns the short count,
// and a program writes the rest again, throttled), instead of letting the
// rest through unthrottled. One interrupted before it took anything still
// takes a page's worth, ignoring the signal (a write of a regular file
// answering EINTR would fail programs that never expect it there): a
// killed writer waits that long at most.
func (h *handle) throttleWrite(ctx context.Context, n int) int {
	taken := h.throttle(ctx, n)
	if taken == 0 && n > 0 {
		taken = h.throttle(context.Background(), min(n, writeAtLeast))
	}
	return taken
}

// writeAtLeast is what an interrupted write still takes and moves.
const writeAtLeast = 4096

// firstBytes returns the first n bytes of data, without copying.
func firstBytes(data [][]byte, n int) [][]byte {
	var out [][]byte
	for _, b := range data {
		if n <= 0 {
			break
		}
		if len(b) > n {
			b = b[:n]
		}
		out = append(out, b)
		n -= len(b)
	}
	return out
}

// recordThrottle records what the open file waited, if it waited.
func (h *handle) recordThrottle(ctx context.Context) {
	waits := h.throttleWaits.Load()
	if waits == 0 {
		return
	}
	f := h.node.fsys
	r := f.limit.Rates()
	ev := f.event(ctx, "throttle", h.path())
	ev.Result = "ok"
	ev.Duration = time.Duration(h.throttled.Load())
	detail(&ev, "waits", waits)
	detail(&ev, "io_bytes_per_s", r.BytesPerSec)
	detail(&ev, "io_ops_per_s", r.OpsPerSec)
	detail(&ev, "holders", int64(f.limit.Holders()))
	_ = f.sink.Record(ctx, ev)
}

// throttledOps makes every request but reads and writes (which wait for
// their bytes in the handle) take one operation from the scope's bucket.
type throttledOps struct {
	fuse.RawFileSystem
	limit *throttle.Limiter
}

// wait takes one operation, for as long as the request is not cancelled.
func (t throttledOps) wait(cancel <-chan struct{}) {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go func() {
		select {
		case <-cancel:
			stop()
		case <-ctx.Done():
		}
	}()
	t.limit.Wait(ctx, 0)
}

func (t throttledOps) Lookup(cancel <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	t.wait(cancel)
	return t.RawFileSystem.Lookup(cancel, h, name, out)
}

func (t throttledOps) GetAttr(cancel <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	t.wait(cancel)
	return t.RawFileSystem.GetAttr(cancel, in, out)
}

func (t throttledOps) SetAttr(cancel <-chan struct{}, in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	t.wait(cancel)
	return t.RawFileSystem.SetAttr(cancel, in, out)
}

func (t throttledOps) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	t.wait(cancel)
	return t.RawFileSystem.Open(cancel, in, out)
}

func (t throttledOps) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	t.wait(cancel)
	return t.RawFileSystem.Create(cancel, in, name, out)
}

func (t throttledOps) Mkdir(cancel <-chan struct{}, in *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	t.wait(cancel)
	return t.RawFileSystem.Mkdir(cancel, in, name, out)
}

func (t throttledOps) Unlink(cancel <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	t.wait(cancel)
	return t.RawFileSystem.Unlink(cancel, h, name)
}

func (t throttledOps) Rmdir(cancel <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	t.wait(cancel)
	return t.RawFileSystem.Rmdir(cancel, h, name)
}

func (t throttledOps) Rename(cancel <-chan struct{}, in *fuse.RenameIn, old, new string) fuse.Status {
	t.wait(cancel)
	return t.RawFileSystem.Rename(cancel, in, old, new)
}

func (t throttledOps) OpenDir(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	t.wait(cancel)
	return t.RawFileSystem.OpenDir(cancel, in, out)
}

func (t throttledOps) ReadDir(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	t.wait(cancel)
	return t.RawFileSystem.ReadDir(cancel, in, out)
}

func (t throttledOps) ReadDirPlus(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	t.wait(cancel)
	return t.RawFileSystem.ReadDirPlus(cancel, in, out)
}
