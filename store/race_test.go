package store_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
)

// TestSwapRace: while an attacker inside the backing store swaps a real
// directory "d" with a symlink "l" to a directory outside the scope
// (RENAME_EXCHANGE, in a loop), readers, writers, removers and walkers
// hammer paths through "d" and "l". The canary outside must never be read
// (its unique content never appears in any result) nor changed.
func TestSwapRace(t *testing.T) {
	forEachResolver(t, testSwapRace)
}

func testSwapRace(t *testing.T) {
	iterations := 2000
	if testing.Short() {
		iterations = 200
	}
	e := newEnv(t)
	ws := e.open(t, mainScope, nil)
	s := e.dir(mainScope)

	var token [16]byte
	rand.Read(token[:])
	canary := []byte("CANARY-" + hex.EncodeToString(token[:]))
	outside := filepath.Join(e.root, "outside")
	// The outside directory has the same names as "d" and one more; a
	// single successful step through the symlink reads, writes or removes
	// one of them.
	mkfile(t, filepath.Join(outside, "f"), string(canary))
	mkfile(t, filepath.Join(outside, "canary"), string(canary))
	mkfile(t, filepath.Join(outside, "sub", "f"), string(canary))
	mkfile(t, filepath.Join(s, "d", "f"), "inside")
	mkdir(t, filepath.Join(s, "d", "sub"))
	mkfile(t, filepath.Join(s, "d", "sub", "f"), "inside")
	symlink(t, outside, filepath.Join(s, "l"))
	outsideTree := treeOf(t, outside)
	canaryHash := sha(canary)

	stop := make(chan struct{})
	var swaps atomic.Int64
	var swapper sync.WaitGroup
	swapper.Add(1)
	go func() {
		defer swapper.Done()
		d, l := filepath.Join(s, "d"), filepath.Join(s, "l")
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := unix.Renameat2(unix.AT_FDCWD, d, unix.AT_FDCWD, l, unix.RENAME_EXCHANGE); err != nil {
				t.Errorf("RENAME_EXCHANGE: %v", err)
				return
			}
			swaps.Add(1)
		}
	}()

	// Codes a refused call may answer while the tree moves under it.
	allowed := []policy.Code{policy.NotFound, policy.SymlinkRefused, policy.NotDir, policy.IsDir, policy.Conflict, policy.Exists, policy.NotEmpty}
	var mu sync.Mutex
	codes := map[string]int{}
	note := func(what string, err error) {
		if err == nil {
			return
		}
		c := policy.CodeOf(err)
		mu.Lock()
		codes[what+":"+string(c)]++
		mu.Unlock()
		if !slices.Contains(allowed, c) {
			t.Errorf("%s: unexpected refusal %v (code %q)", what, err, c)
		}
	}
	leaked := func(what string, b []byte) {
		if bytes.Contains(b, canary) {
			t.Errorf("%s returned the canary: the outside was read", what)
		}
	}

	ctx := context.Background()
	workers := map[string]func(i int){
		"ReadFile": func(i int) {
			for _, p := range []string{"d/f", "d/canary", "l/f", "d/sub/f", "l/sub/f"} {
				b, _, err := ws.ReadFile(ctx, p)
				note("ReadFile", err)
				leaked("ReadFile "+p, b)
				if err == nil && strings.HasSuffix(p, "canary") {
					t.Errorf("ReadFile(%s) succeeded; only the outside has that name", p)
				}
			}
			h, err := ws.HashFile("d/f")
			note("HashFile", err)
			if h == canaryHash {
				t.Errorf("HashFile(d/f) hashed the canary")
			}
		},
		"WriteFile": func(i int) {
			for _, p := range []string{"d/w", "d/f", "d/sub/f", "l/w"} {
				_, err := ws.WriteFile(ctx, p, []byte("inside"), nil)
				note("WriteFile", err)
			}
			_, err := ws.WriteFile(ctx, "d/f", []byte("inside"), ptr(canaryHash))
			if err == nil {
				t.Errorf("WriteFile(d/f, expected canary hash) succeeded: the canary was hashed")
			}
			note("WriteFile expected", err)
			var pe *policy.Error
			if errors.As(err, &pe) && pe.SHA256 == canaryHash {
				t.Errorf("a conflict reported the canary's hash")
			}
		},
		"Remove": func(i int) {
			name := fmt.Sprintf("d/rm-%d", i)
			_, err := ws.WriteFile(ctx, name, []byte("inside"), nil)
			note("WriteFile", err)
			for _, p := range []string{name, "d/f", "d/canary", "l/f", "d/sub/f"} {
				note("Remove", ws.Remove(ctx, p, nil))
			}
		},
		"Walk": func(i int) {
			err := ws.Walk(ctx, ".", func(rel string, info store.Info) error {
				if strings.HasSuffix(rel, "canary") {
					t.Errorf("Walk reached %s: it descended the symlink", rel)
				}
				if info.Kind == policy.KindRegular {
					b, _, err := ws.ReadFile(ctx, rel)
					note("ReadFile in Walk", err)
					leaked("ReadFile "+rel+" in Walk", b)
				}
				return nil
			})
			note("Walk", err)
			ents, err := ws.ReadDir(ctx, "d")
			note("ReadDir", err)
			for _, e := range ents {
				if e.Name == "canary" {
					t.Errorf("ReadDir(d) listed the outside directory")
				}
			}
		},
	}
	var wg sync.WaitGroup
	for _, work := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range iterations {
				if t.Failed() {
					return
				}
				work(i)
			}
		}()
	}
	wg.Wait()
	close(stop)
	swapper.Wait()
	t.Logf("%d swaps; refusals by op and code: %v", swaps.Load(), codes)
	if swaps.Load() < 100 {
		t.Errorf("only %d swaps happened; the race was not exercised", swaps.Load())
	}

	if got := treeOf(t, outside); got != outsideTree {
		t.Errorf("the outside tree changed:\nbefore\n%s\nafter\n%s", outsideTree, got)
	}
	for _, p := range []string{"f", "canary", "sub/f"} {
		if got := fileHash(t, filepath.Join(outside, p)); got != canaryHash {
			t.Errorf("outside/%s changed", p)
		}
	}
	if _, err := os.Lstat(filepath.Join(outside, "w")); err == nil {
		t.Errorf("a write went through the symlink: outside/w exists")
	}
}
