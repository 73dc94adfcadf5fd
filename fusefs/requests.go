package fusefs

import (
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// timedOps tells Options.Requests of every request the mount answers:
// the outermost layer, so a request's time includes its throttle wait.
// Release, ReleaseDir and Forget answer nothing and are not timed. It is
// only in place when Options.Requests is set.
type timedOps struct {
	fuse.RawFileSystem
	observe func(op string, errno syscall.Errno, took time.Duration)
}

// done reports a request that started at start and was answered st.
func (t timedOps) done(op string, start time.Time, st fuse.Status) {
	t.observe(op, syscall.Errno(st), time.Since(start))
}

func (t timedOps) Lookup(cancel <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	start := time.Now()
	st := t.RawFileSystem.Lookup(cancel, h, name, out)
	t.done("LOOKUP", start, st)
	return st
}

func (t timedOps) GetAttr(cancel <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	start := time.Now()
	st := t.RawFileSystem.GetAttr(cancel, in, out)
	t.done("GETATTR", start, st)
	return st
}

func (t timedOps) SetAttr(cancel <-chan struct{}, in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	start := time.Now()
	st := t.RawFileSystem.SetAttr(cancel, in, out)
	t.done("SETATTR", start, st)
	return st
}

func (t timedOps) Mknod(cancel <-chan struct{}, in *fuse.MknodIn, name string, out *fuse.EntryOut) fuse.Status {
	start := time.Now()
	st := t.RawFileSystem.Mknod(cancel, in, name, out)
	t.done("MKNOD", start, st)
	return st
}

func (t timedOps) Mkdir(cancel <-chan struct{}, in *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	start := time.Now()
	st := t.RawFileSystem.Mkdir(cancel, in, name, out)
	t.done("MKDIR", start, st)
	return st
}

func (t timedOps) Unlink(cancel <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	start := time.Now()
	st := t.RawFileSystem.Unlink(cancel, h, name)
	t.done("UNLINK", start, st)
	return st
}

func (t timedOps) Rmdir(cancel <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	start := time.Now()
	st := t.RawFileSystem.Rmdir(cancel, h, name)
	t.done("RMDIR", start, st)
	return st
}

func (t timedOps) Rename(cancel <-chan struct{}, in *fuse.RenameIn, oldName, newName string) fuse.Status {
	start := time.Now()
	st := t.RawFileSystem.Rename(cancel, in, oldName, newName)
	t.done("RENAME", start, st)
	return st
}

func (t timedOps) Link(cancel <-chan struct{}, in *fuse.LinkIn, name string, out *fuse.EntryOut) fuse.Status {
	start := time.Now()
	st := t.RawFileSystem.Link(cancel, in, name, out)
	t.done("LINK", start, st)
	return st
}

func (t timedOps) Symlink(cancel <-chan struct{}, h *fuse.InHeader, target, name string, out *fuse.EntryOut) fuse.Status {
	start := time.Now()
	st := t.RawFileSystem.Symlink(cancel, h, target, name, out)
	t.done("SYMLINK", start, st)
	return st
}

func (t timedOps) Readlink(cancel <-chan struct{}, h *fuse.InHeader) ([]byte, fuse.Status) {
	start := time.Now()
	r, st := t.RawFileSystem.Readlink(cancel, h)
	t.done("READLINK", start, st)
	return r, st
}

func (t timedOps) Access(cancel <-chan struct{}, in *fuse.AccessIn) fuse.Status {
	start := time.Now()
	st := t.RawFileSystem.Access(cancel, in)
	t.done("ACCESS", start, st)
	return st
}

func (t timedOps) GetXAttr(cancel <-chan struct{}, h *fuse.InHeader, attr string, dest []byte) (uint32, fuse.Status) {
	start := time.Now()
	r, st := t.RawFileSystem.GetXAttr(cancel, h, attr, dest)
	t.done("GETXATTR", start, st)
	return r, st
}

func (t timedOps) ListXAttr(cancel <-chan struct{}, h *fuse.InHeader, dest []byte) (uint32, fuse.Status) {
	start := time.Now()
	r, st := t.RawFileSystem.ListXAttr(cancel, h, dest)
	t.done("LISTXATTR", start, st)
	return r, st
}

func (t timedOps) SetXAttr(cancel <-chan struct{}, in *fuse.SetXAttrIn, attr string, data []byte) fuse.Status {
	start := time.Now()
	st := t.RawFileSystem.SetXAttr(cancel, in, attr, data)
	t.done("SETXATTR", start, st)
	return st
}

func (t timedOps) RemoveXAttr(cancel <-chan struct{}, h *fuse.InHeader, attr string) fuse.Status {
	start := time.Now()
	st := t.RawFileSystem.RemoveXAttr(cancel, h, attr)
	t.done("REMOVEXATTR", start, st)
	return st
}

func (t timedOps) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	start := time.Now()
	st := t.RawFileSystem.Create(cancel, in, name, out)
	t.done("CREATE", start, st)
	return st
}

func (t timedOps) Tmpfile(cancel <-chan struct{}, in *fuse.CreateIn, out *fuse.CreateOut) fuse.Status {
	start := time.Now()
	st := t.RawFileSystem.Tmpfile(cancel, in, out)
	t.done("TMPFILE", start, st)
	return st
}

func (t timedOps) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	start := time.Now()
	st := t.RawFileSystem.Open(cancel, in, out)
	t.done("OPEN", start, st)
	return st
}

func (t timedOps) Read(cancel <-chan struct{}, in *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	start := time.Now()
	r, st := t.RawFileSystem.Read(cancel, in, buf)
	t.done("READ", start, st)
	return r, st
}

func (t timedOps) Lseek(cancel <-chan struct{}, in *fuse.LseekIn, out *fuse.LseekOut) fuse.Status {
	start := time.Now()
	st := t.RawFileSystem.Lseek(cancel, in, out)
	t.done("LSEEK", start, st)
	return st
}

func (t timedOps) GetLk(cancel <-chan struct{}, in *fuse.LkIn, out *fuse.LkOut) fuse.Status {
	start := time.Now()
	st := t.RawFileSystem.GetLk(cancel, in, out)
	t.done("GETLK", start, st)
	return st
}

func (t timedOps) SetLk(cancel <-chan struct{}, in *fuse.LkIn) fuse.Status {
	start := time.Now()
	st := t.RawFileSystem.SetLk(cancel, in)
	t.done("SETLK", start, st)
	return st
}

func (t timedOps) SetLkw(cancel <-chan struct{}, in *fuse.LkIn) fuse.Status {
	start := time.Now()
	st := t.RawFileSystem.SetLkw(cancel, in)
	t.done("SETLKW", start, st)
	return st
}

func (t timedOps) Write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	start := time.Now()
	r, st := t.RawFileSystem.Write(cancel, in, data)
	t.done("WRITE", start, st)
	return r, st
}

func (t timedOps) Writev(cancel <-chan struct{}, in *fuse.WriteIn, data [][]byte) (uint32, fuse.Status) {
	start := time.Now()
	r, st := t.RawFileSystem.Writev(cancel, in, data)
	t.done("WRITE", start, st)
	return r, st
}

func (t timedOps) CopyFileRange(cancel <-chan struct{}, in *fuse.CopyFileRangeIn) (uint32, fuse.Status) {
	start := time.Now()
	r, st := t.RawFileSystem.CopyFileRange(cancel, in)
	t.done("COPY_FILE_RANGE", start, st)
	return r, st
}

func (t timedOps) Flush(cancel <-chan struct{}, in *fuse.FlushIn) fuse.Status {
	start := time.Now()
	st := t.RawFileSystem.Flush(cancel, in)
	t.done("FLUSH", start, st)
	return st
}

func (t timedOps) Fsync(cancel <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	start := time.Now()
	st := t.RawFileSystem.Fsync(cancel, in)
	t.done("FSYNC", start, st)
	return st
}

func (t timedOps) Fallocate(cancel <-chan struct{}, in *fuse.FallocateIn) fuse.Status {
	start := time.Now()
	st := t.RawFileSystem.Fallocate(cancel, in)
	t.done("FALLOCATE", start, st)
	return st
}

func (t timedOps) OpenDir(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	start := time.Now()
	st := t.RawFileSystem.OpenDir(cancel, in, out)
	t.done("OPENDIR", start, st)
	return st
}

func (t timedOps) ReadDir(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	start := time.Now()
	st := t.RawFileSystem.ReadDir(cancel, in, out)
	t.done("READDIR", start, st)
	return st
}

func (t timedOps) ReadDirPlus(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	start := time.Now()
	st := t.RawFileSystem.ReadDirPlus(cancel, in, out)
	t.done("READDIRPLUS", start, st)
	return st
}

func (t timedOps) FsyncDir(cancel <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	start := time.Now()
	st := t.RawFileSystem.FsyncDir(cancel, in)
	t.done("FSYNCDIR", start, st)
	return st
}

func (t timedOps) StatFs(cancel <-chan struct{}, h *fuse.InHeader, out *fuse.StatfsOut) fuse.Status {
	start := time.Now()
	st := t.RawFileSystem.StatFs(cancel, h, out)
	t.done("STATFS", start, st)
	return st
}

func (t timedOps) Statx(cancel <-chan struct{}, in *fuse.StatxIn, out *fuse.StatxOut) fuse.Status {
	start := time.Now()
	st := t.RawFileSystem.Statx(cancel, in, out)
	t.done("STATX", start, st)
	return st
}
