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
// beside the rates and how many processes shared them.

// throttle waits for n bytes and one operation of the scope's limits, and
// counts the wait against the open file.
func (h *handle) throttle(ctx context.Context, n int) {
	if d := h.node.fsys.limit.Wait(ctx, n); d > 0 {
		h.throttleWaits.Add(1)
		h.throttled.Add(int64(d))
	}
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
