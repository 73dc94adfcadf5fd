package fusefs

import (
	"os"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestRequestsObserved: with Options.Requests every request is told with
// its opcode and the errno it was answered, as a program met it.
func TestRequestsObserved(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]int{}
	e := newEnv(t, withOptions(func(o *Options) {
		o.Requests = func(op string, errno syscall.Errno, took time.Duration) {
			if took < 0 {
				t.Errorf("%s took %v", op, took)
			}
			mu.Lock()
			seen[op+" "+errnoName(errno)]++
			mu.Unlock()
		}
	}))
	cases := []struct {
		name string
		do   func() error
		want string
	}{
		{"a create answered", func() error { return os.WriteFile(e.path("a"), []byte("x"), 0o600) }, "CREATE 0"},
		{"a write answered", func() error { return os.WriteFile(e.path("b"), []byte("x"), 0o600) }, "WRITE 0"},
		{"a stat answered", func() error { _, err := os.Stat(e.path("b")); return err }, "LOOKUP 0"},
		{"a hard link refused", func() error { os.Link(e.path("a"), e.path("c")); return nil }, "LINK EXDEV"},
		{"an unlink answered", func() error { return os.Remove(e.path("a")) }, "UNLINK 0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := c.do(); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if seen[c.want] == 0 {
				t.Errorf("no %q among %v", c.want, seen)
			}
		})
	}
}

func errnoName(e syscall.Errno) string {
	switch e {
	case 0:
		return "0"
	case syscall.ENOENT:
		return "ENOENT"
	case syscall.EXDEV:
		return "EXDEV"
	}
	return e.Error()
}
