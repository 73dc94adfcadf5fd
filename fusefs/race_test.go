package fusefs

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestSwapRace: while something outside swaps a backing directory and a
// symlink to a directory outside the root (RENAME_EXCHANGE, in a loop),
// processes in the mount chmod, truncate, open, write, rename, unlink and
// utimes through both names. Nothing outside the root may change: not the
// canary's content, mode, times or inode, nor the outside directory's
// entries or mode.
func TestSwapRace(t *testing.T) {
	e := newEnv(t)
	mustWrite(t, e.host("d/f"), "inside")
	canary := filepath.Join(e.outside, "f")
	mustWrite(t, canary, "canary")
	if err := os.Chmod(e.outside, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(e.outside, e.host("s")); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, e.outside)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var swaps, ops, canaryReads atomic.Int64

	// The outside process: swap d and s as fast as it can.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := unix.Renameat2(unix.AT_FDCWD, e.host("d"), unix.AT_FDCWD, e.host("s"), unix.RENAME_EXCHANGE); err != nil {
				t.Errorf("swap: %v", err)
				return
			}
			swaps.Add(1)
		}
	}()

	// The processes in the mount: every mutating call, through both names.
	attacks := []func(dir string){
		func(dir string) { unix.Chmod(dir+"/f", 0o666) },
		func(dir string) { unix.Chmod(dir, 0o777) },
		func(dir string) { unix.Truncate(dir+"/f", 0) },
		func(dir string) {
			if fd, err := unix.Open(dir+"/f", unix.O_WRONLY|unix.O_TRUNC, 0); err == nil {
				unix.Write(fd, []byte("pwned"))
				unix.Ftruncate(fd, 1)
				unix.Fchmod(fd, 0o777)
				unix.Close(fd)
			}
		},
		func(dir string) {
			if fd, err := unix.Open(dir+"/f", unix.O_RDONLY, 0); err == nil {
				buf := make([]byte, 64)
				n, _ := unix.Read(fd, buf)
				if bytes.Contains(buf[:n], []byte("canary")) {
					canaryReads.Add(1)
				}
				unix.Close(fd)
			}
		},
		func(dir string) {
			if unix.Rename(dir+"/f", dir+"/g") == nil {
				unix.Rename(dir+"/g", dir+"/f")
			}
		},
		func(dir string) {
			if unix.Unlink(dir+"/f") == nil {
				os.WriteFile(dir+"/f", []byte("inside"), 0o600)
			}
		},
		func(dir string) { os.WriteFile(dir+"/new", []byte("x"), 0o600) },
		func(dir string) { unix.Mkdir(dir+"/sub", 0o700); unix.Rmdir(dir + "/sub") },
		func(dir string) {
			unix.UtimesNano(dir+"/f", []unix.Timespec{{Sec: 1}, {Sec: 1}})
		},
	}
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				for _, name := range []string{"d", "s"} {
					attacks[i%len(attacks)](e.path(name))
					ops.Add(1)
				}
			}
		}()
	}
	time.Sleep(3 * time.Second)
	close(stop)
	wg.Wait()
	t.Logf("%d swaps, %d calls through the mount", swaps.Load(), ops.Load())
	if swaps.Load() < 100 || ops.Load() < 100 {
		t.Errorf("too little happened to mean anything")
	}
	if n := canaryReads.Load(); n > 0 {
		t.Errorf("the canary was read through the mount %d times", n)
	}
	if after := snapshot(t, e.outside); after != before {
		t.Errorf("outside the root changed:\nbefore %s\nafter  %s", before, after)
	}
}

// snapshot describes a directory and everything in it.
func snapshot(t *testing.T, dir string) string {
	t.Helper()
	var lines []string
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		content := ""
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			content = string(b)
		}
		rel, _ := filepath.Rel(dir, p)
		lines = append(lines, fmt.Sprintf("%s %v %q mtime %d.%09d ino %d", rel, fi.Mode(), content, st.Mtim.Sec, st.Mtim.Nsec, st.Ino))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(lines)
	var b bytes.Buffer
	for _, l := range lines {
		b.WriteString(l + "; ")
	}
	return b.String()
}
