package slots_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentloom/loomfs/slots"
)

// The test binary is also the child process of these tests: with
// slotsChild set it runs child instead of the tests.
const slotsChild = "LOOMFS_SLOTS_TEST_CHILD"

// slotsIndex tells a "turn" child its place in the order it was started.
const slotsIndex = "LOOMFS_SLOTS_TEST_INDEX"

func TestMain(m *testing.M) {
	if os.Getenv(slotsChild) != "" {
		os.Exit(child(os.Getenv(slotsChild), os.Args[len(os.Args)-3:]))
	}
	os.Exit(m.Run())
}

// child does what role says with the slots of dir, n and the markers
// directory of args: "hold" takes one slot, marks itself in markers,
// counts the marks, and fails if more than n are there; "hog" takes all n
// and says so on stdout, then waits to be killed; "turn" takes one slot
// and appends its index (slotsIndex) to the file order in markers.
func child(role string, args []string) int {
	dir, markers := args[0], args[2]
	n, _ := strconv.Atoi(args[1])
	s := slots.New(dir, n)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	switch role {
	case "hold":
		release, err := s.Take(ctx)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		defer release()
		mark := filepath.Join(markers, strconv.Itoa(os.Getpid()))
		if err := os.WriteFile(mark, nil, 0o600); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		defer os.Remove(mark)
		ents, err := os.ReadDir(markers)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		fmt.Println(len(ents))
		if len(ents) > n {
			fmt.Fprintf(os.Stderr, "%d holders of %d slots\n", len(ents), n)
			return 1
		}
		time.Sleep(100 * time.Millisecond)
		return 0
	case "turn":
		release, err := s.Take(ctx)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		defer release()
		f, err := os.OpenFile(filepath.Join(markers, "order"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err == nil {
			_, err = fmt.Fprintln(f, os.Getenv(slotsIndex))
			err = errors.Join(err, f.Close())
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		time.Sleep(20 * time.Millisecond)
		return 0
	case "hog":
		for range n {
			if _, err := s.Take(ctx); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 2
			}
		}
		fmt.Println("held")
		time.Sleep(time.Minute)
		return 0
	}
	return 2
}

func command(t *testing.T, role, dir string, n int, markers string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$", dir, strconv.Itoa(n), markers)
	cmd.Env = append(os.Environ(), slotsChild+"="+role)
	cmd.Stderr = os.Stderr
	return cmd
}

// TestBoundAcrossProcesses starts more processes than slots at once: no
// more than n ever hold one together, and every one gets its turn.
func TestBoundAcrossProcesses(t *testing.T) {
	const n, procs = 3, 12
	dir, markers := t.TempDir(), t.TempDir()
	outs := make([][]byte, procs)
	errs := make([]error, procs)
	var wg sync.WaitGroup
	for i := range procs {
		wg.Go(func() { outs[i], errs[i] = command(t, "hold", dir, n, markers).Output() })
	}
	wg.Wait()
	most := 0
	for i := range procs {
		if errs[i] != nil {
			t.Fatalf("process %d: %v", i, errs[i])
		}
		k, err := strconv.Atoi(string(outs[i][:len(outs[i])-1]))
		if err != nil {
			t.Fatalf("process %d said %q", i, outs[i])
		}
		most = max(most, k)
	}
	t.Logf("at most %d of %d slots held at once", most, n)
	if left := tickets(t, dir); len(left) > 0 {
		t.Fatalf("tickets left after every waiter got its slot: %v", left)
	}
}

// tickets lists the waiters' tickets in dir.
func tickets(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "wait-") {
			names = append(names, e.Name())
		}
	}
	return names
}

// TestTurnsInOrderAcrossProcesses: waiters in different processes get a
// slot in the order they came, not by the luck of their polls (a command
// of a busy node once waited its whole 120 s while later ones started).
func TestTurnsInOrderAcrossProcesses(t *testing.T) {
	const waiters = 5
	dir, markers := t.TempDir(), t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	release, err := slots.New(dir, 1).Take(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cmds := make([]*exec.Cmd, waiters)
	for i := range cmds {
		cmds[i] = command(t, "turn", dir, 1, markers)
		cmds[i].Env = append(cmds[i].Env, slotsIndex+"="+strconv.Itoa(i))
		if err := cmds[i].Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmds[i].Process.Kill(); cmds[i].Wait() })
		for deadline := time.Now().Add(30 * time.Second); len(tickets(t, dir)) < i+1; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("waiter %d took no ticket", i)
			}
		}
	}
	release()
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("waiter %d: %v", i, err)
		}
	}
	order, err := os.ReadFile(filepath.Join(markers, "order"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(order), "0\n1\n2\n3\n4\n"; got != want {
		t.Fatalf("waiters got the slot in the order %q, want %q", got, want)
	}
}

// TestDeadWaitersTicketSkipped: a ticket ahead that no live waiter holds
// (its waiter was killed) is removed, and the waiters behind it go on.
func TestDeadWaitersTicketSkipped(t *testing.T) {
	dir := t.TempDir()
	old := time.Now().Add(-time.Minute).UnixNano()
	for i := range 3 {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("wait-%020d-1-%08x", old, i)), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	release, err := slots.New(dir, 2).Take(ctx)
	if err != nil {
		t.Fatalf("Take behind dead waiters' tickets: %v", err)
	}
	release()
	if left := tickets(t, dir); len(left) > 0 {
		t.Fatalf("dead waiters' tickets left: %v", left)
	}
}

// TestBoundInOneProcess: goroutines of one process share the bound too
// (each Take is an open file description of its own).
func TestBoundInOneProcess(t *testing.T) {
	const n, takers = 2, 10
	s := slots.New(filepath.Join(t.TempDir(), "slots"), n)
	var mu sync.Mutex
	holding, most := 0, 0
	var wg sync.WaitGroup
	for range takers {
		wg.Go(func() {
			release, err := s.Take(context.Background())
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			holding++
			most = max(most, holding)
			mu.Unlock()
			time.Sleep(10 * time.Millisecond)
			mu.Lock()
			holding--
			mu.Unlock()
			release()
		})
	}
	wg.Wait()
	if most > n {
		t.Fatalf("%d held at once of %d slots", most, n)
	}
}

// TestFreedWhenHolderDies: a process killed while it holds every slot
// frees them; until then Take ends with its context and says so.
func TestFreedWhenHolderDies(t *testing.T) {
	const n = 2
	dir := t.TempDir()
	hog := command(t, "hog", dir, n, t.TempDir())
	out, err := hog.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := hog.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hog.Process.Kill(); hog.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); line != "held\n" {
		t.Fatalf("the holder said %q, %v", line, err)
	}

	s := slots.New(dir, n)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := s.Take(ctx); !errors.Is(err, slots.ErrBusy) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Take with every slot held: %v, want ErrBusy and the deadline", err)
	}

	hog.Process.Kill()
	hog.Wait()
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range n {
		if _, err := s.Take(ctx); err != nil {
			t.Fatalf("Take after the holder died: %v", err)
		}
	}
}

// TestTakeFailsOnAnUnusableDir: an error of the file system is said at
// once, not waited out.
func TestTakeFailsOnAnUnusableDir(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := slots.New(file, 1).Take(context.Background())
	if err == nil || errors.Is(err, slots.ErrBusy) {
		t.Fatalf("Take in a file: %v", err)
	}
}

// TestTurnsInOrder: waiters of one process get a slot in the order they
// came, not by the luck of their polls.
func TestTurnsInOrder(t *testing.T) {
	const waiters = 5
	s := slots.New(filepath.Join(t.TempDir(), "slots"), 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	release, err := s.Take(ctx)
	if err != nil {
		t.Fatal(err)
	}
	order := make(chan int, waiters)
	for i := range waiters {
		go func() {
			r, err := s.Take(ctx)
			if err != nil {
				t.Error(err)
				order <- -1
				return
			}
			order <- i
			r()
		}()
		waitQueued(t, i+1)
	}
	release()
	for want := range waiters {
		if got := <-order; got != want {
			t.Fatalf("waiter %d got the slot in turn %d", got, want)
		}
	}
}

// waitQueued waits until n goroutines wait in Take for their turn.
func waitQueued(t *testing.T, n int) {
	t.Helper()
	buf := make([]byte, 1<<20)
	for deadline := time.Now().Add(30 * time.Second); ; {
		k := 0
		for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			if strings.Contains(g, "[select") && strings.Contains(g, "slots.(*Set).Take") {
				k++
			}
		}
		if k == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines wait their turn, want %d", k, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestStoppedWaitersTicketLapses: a ticket still locked (its waiter was
// stopped, not killed) keeps the waiters behind it for minutes, not for
// good.
func TestStoppedWaitersTicketLapses(t *testing.T) {
	dir := t.TempDir()
	old := time.Now().Add(-time.Hour).UnixNano()
	f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("wait-%020d-1-0", old)), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	lk := unix.Flock_t{Type: unix.F_WRLCK}
	if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	release, err := slots.New(dir, 1).Take(ctx)
	if err != nil {
		t.Fatalf("Take behind a stopped waiter's ticket of an hour ago: %v", err)
	}
	release()
}

// TestTakeWithoutRoomForATicket: on a full file system (no inode left for
// a ticket) a waiter still gets a free slot; it only loses its place.
func TestTakeWithoutRoomForATicket(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounts a tmpfs: needs root")
	}
	dir := t.TempDir()
	// The root directory, slot-0 and one more inode.
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64k,nr_inodes=3"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	s := slots.New(dir, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	release, err := s.Take(ctx) // makes slot-0
	if err != nil {
		t.Fatal(err)
	}
	release()
	if err := os.WriteFile(filepath.Join(dir, "filler"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "one-more"), nil, 0o600); err == nil {
		t.Fatal("the tmpfs has room for another file: the test would not test a full one")
	}
	release, err = s.Take(ctx)
	if err != nil {
		t.Fatalf("Take with no room for a ticket: %v", err)
	}
	release()
}
