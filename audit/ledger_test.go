package audit

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// rechain rewrites lines as someone who can write the files but holds no
// key would after removing or editing some: seq renumbered from first and
// every prev recomputed, so the hash chain is whole again.
func rechain(t *testing.T, lines [][]byte, first uint64, prev string, edit func(m map[string]any)) [][]byte {
	t.Helper()
	var out [][]byte
	for i, l := range lines {
		d := json.NewDecoder(bytes.NewReader(l))
		d.UseNumber()
		var m map[string]any
		if err := d.Decode(&m); err != nil {
			t.Fatal(err)
		}
		m["seq"] = first + uint64(i)
		m["prev"] = prev
		if edit != nil {
			edit(m)
		}
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		b = append(b, '\n')
		prev = sha256hex(string(b))
		out = append(out, b)
	}
	return out
}

func splitLines(t *testing.T, name string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.SplitAfter(b, []byte("\n"))
	return lines[:len(lines)-1]
}

func firstProblem(rep Report) string {
	if len(rep.Problems) == 0 {
		return ""
	}
	return rep.Problems[0].String()
}

// A writer's records removed whole from the shared chain, the chain
// rehashed so it is whole again: the ledger's close of that writer, and
// the heads the other writer's entries pin, give it away; with the ledger
// rewritten as well, the other writer's entries still do.
func TestWholeWriterRemoved(t *testing.T) {
	for _, tc := range []struct {
		name         string
		fixLedger    bool
		wantInReport string
	}{
		{"chain rehashed", false, "closed with 10 events; the chain holds 0"},
		{"chain rehashed and the writer's ledger entries removed", true, "the chain was rewritten"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			a := openLog(t, root, Options{Node: "n1"})
			b := openLog(t, root, Options{Node: "n1"})
			for i := range 10 {
				for _, l := range []*Log{a, b} {
					e := sampleEvent()
					e.CallID = fmt.Sprint(i)
					if err := l.Record(context.Background(), e); err != nil {
						t.Fatal(err)
					}
				}
			}
			a.Close()
			b.Close()
			dir := Dir(root)
			if rep, _ := Verify(dir); !rep.Clean(false) {
				t.Fatalf("untouched: %v %v", rep, rep.Problems)
			}
			chain, _ := filepath.Glob(filepath.Join(dir, "n1.2*.jsonl"))
			lines := slices.DeleteFunc(splitLines(t, chain[0]), func(l []byte) bool { return bytes.Contains(l, []byte(`"writer":2,`)) })
			os.WriteFile(chain[0], bytes.Join(rechain(t, lines, 1, "", nil), nil), 0o600)
			if tc.fixLedger {
				led := filepath.Join(dir, "n1"+ledgerExt)
				entries := slices.DeleteFunc(splitLines(t, led), func(l []byte) bool {
					return bytes.Contains(l, []byte(`"seq":2,`)) || bytes.Contains(l, []byte(`"writer":2,`))
				})
				os.WriteFile(led, bytes.Join(rechain(t, entries, 1, "", nil), nil), 0o600)
			}
			rep, err := Verify(dir)
			if err != nil || rep.OK() {
				t.Fatalf("a writer removed whole went unseen: %v %v", rep, err)
			}
			if !strings.Contains(fmt.Sprint(rep.Problems), tc.wantInReport) {
				t.Errorf("problems %v: want one saying %q", rep.Problems, tc.wantInReport)
			}
			t.Logf("first problem: %s", firstProblem(rep))
		})
	}
}

// keyPair makes a node key outside the volume.
func keyPair(t *testing.T, node string) (priv, pubDir string) {
	t.Helper()
	dir := t.TempDir()
	priv, pub, err := GenerateKey(filepath.Join(dir, "key"), node)
	if err != nil {
		t.Fatal(err)
	}
	pubDir = filepath.Join(dir, "trust")
	os.Mkdir(pubDir, 0o700)
	b, _ := os.ReadFile(pub)
	os.WriteFile(filepath.Join(pubDir, node+".pub"), b, 0o644)
	return priv, pubDir
}

func trusted(t *testing.T, dir string) TrustedKeys {
	t.Helper()
	k, err := LoadTrustedKeys(dir)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// signedLog writes a rotated log of node n1 with its key and returns the
// audit directory and the trusted key directory.
func signedLog(t *testing.T) (dir, trust string) {
	t.Helper()
	priv, trust := keyPair(t, "n1")
	root := t.TempDir()
	l := openLog(t, root, Options{Node: "n1", KeyFile: priv, MaxFileBytes: 2 << 10})
	for i := range 30 {
		e := sampleEvent()
		e.Path = fmt.Sprintf("src/%d.go", i)
		if err := l.Record(context.Background(), e); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return Dir(root), trust
}

func TestSignedSeals(t *testing.T) {
	dir, trust := signedLog(t)
	rep, err := VerifyWith(dir, VerifyOptions{Keys: trusted(t, trust)})
	if err != nil || !rep.Clean(false) || !rep.Signed {
		t.Fatalf("signed log: %v %v %v", rep, err, rep.Problems)
	}
	n := rep.Nodes[0]
	if n.Seals < 3 || n.SignedUpTo != n.LedgerSeq {
		t.Errorf("node %+v: want a seal per rotation and one at close, the last covering the whole ledger", n)
	}
	if len(rep.Warnings) != 0 {
		t.Errorf("warnings %v", rep.Warnings)
	}
	if rep, _ := Verify(dir); !rep.OK() || rep.Signed {
		t.Errorf("without keys: %v signed=%v, want intact and not signed", rep, rep.Signed)
	}
}

// Someone who can write the volume edits a record, rehashes the chain and
// the ledger and signs the seals again with a key of their own: the chain
// alone verifies, the trusted keys don't.
func TestResignedWithOtherKey(t *testing.T) {
	dir, trust := signedLog(t)
	other, _ := keyPair(t, "n1")
	forger, err := LoadKey(other)
	if err != nil {
		t.Fatal(err)
	}
	led := filepath.Join(dir, "n1"+ledgerExt)
	lines := rechain(t, splitLines(t, led), 1, "", func(m map[string]any) {
		if m["kind"] != LedgerSeal {
			return
		}
		var e LedgerEntry
		b, _ := json.Marshal(m)
		json.Unmarshal(b, &e)
		forger.sign(&e)
		m["key"], m["sig"] = e.Key, e.Sig
	})
	os.WriteFile(led, bytes.Join(lines, nil), 0o600)
	if rep, _ := Verify(dir); !rep.OK() {
		t.Fatalf("the forged ledger is a valid chain, yet: %v", rep.Problems)
	}
	rep, _ := VerifyWith(dir, VerifyOptions{Keys: trusted(t, trust)})
	if rep.OK() || !strings.Contains(firstProblem(rep), "is not signed by a trusted key of node n1") {
		t.Fatalf("re-signed ledger: %v %v", rep, rep.Problems)
	}
	t.Logf("first problem: %s", firstProblem(rep))
}

func TestKeys(t *testing.T) {
	priv, trust := keyPair(t, "n1")
	t.Run("a key is never replaced", func(t *testing.T) {
		if _, _, err := GenerateKey(filepath.Dir(priv), "n1"); err == nil || !strings.Contains(err.Error(), "already exists") {
			t.Errorf("GenerateKey over a key: %v", err)
		}
	})
	t.Run("bad node name", func(t *testing.T) {
		if _, _, err := GenerateKey(t.TempDir(), "a/b"); err == nil {
			t.Error("accepted a node name with a slash")
		}
	})
	t.Run("a key others can read is refused", func(t *testing.T) {
		os.Chmod(priv, 0o644)
		defer os.Chmod(priv, 0o600)
		_, err := Open(t.TempDir(), Options{Node: "n1", KeyFile: priv})
		if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "readable by its owner only") {
			t.Errorf("Open with a 0644 key: %v", err)
		}
	})
	t.Run("another node's key is refused", func(t *testing.T) {
		_, err := Open(t.TempDir(), Options{Node: "n2", KeyFile: priv})
		if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), `node "n1"'s`) {
			t.Errorf("Open with n1's key on n2: %v", err)
		}
	})
	t.Run("the key from the environment", func(t *testing.T) {
		t.Setenv(KeyEnv, priv)
		root := t.TempDir()
		l := openLog(t, root, Options{Node: "n1"})
		l.Close()
		rep, _ := VerifyWith(Dir(root), VerifyOptions{Keys: trusted(t, trust)})
		if !rep.OK() || rep.Nodes[0].Seals != 1 {
			t.Errorf("%v %v %+v", rep, rep.Problems, rep.Nodes)
		}
	})
	t.Run("a node without a trusted key", func(t *testing.T) {
		root := t.TempDir()
		l := openLog(t, root, Options{Node: "n2"})
		l.Close()
		rep, _ := VerifyWith(Dir(root), VerifyOptions{Keys: trusted(t, trust)})
		if rep.OK() || !strings.Contains(fmt.Sprint(rep.Problems), "node n2 has no trusted key") {
			t.Errorf("%v", rep.Problems)
		}
		if !strings.Contains(fmt.Sprint(rep.Problems), "node n1 has a trusted key but no ledger") {
			t.Errorf("a trusted node without a log: %v", rep.Problems)
		}
	})
	t.Run("a seal every interval", func(t *testing.T) {
		root := t.TempDir()
		l := openLog(t, root, Options{Node: "n1", KeyFile: priv, SealEvery: 5 * time.Millisecond,
			Clock: fixedClock(time.Date(2025, 5, 1, 0, 0, 0, 0, time.UTC))})
		for range 20 {
			l.Record(context.Background(), sampleEvent())
		}
		rep, _ := VerifyWith(Dir(root), VerifyOptions{Keys: trusted(t, trust)})
		if !rep.OK() || rep.Nodes[0].Seals != 4 || rep.Nodes[0].Running != 1 {
			t.Errorf("%v %v %+v: want 4 interval seals of a running writer", rep, rep.Problems, rep.Nodes)
		}
	})
}

func TestAnchor(t *testing.T) {
	root := t.TempDir()
	dir := Dir(root)
	write := func(node string, n int) {
		l := openLog(t, root, Options{Node: node, MaxFileBytes: 2 << 10})
		for range n {
			if err := l.Record(context.Background(), sampleEvent()); err != nil {
				t.Fatal(err)
			}
		}
		l.Close()
	}
	write("n1", 10)
	write("n2", 10)
	old := filepath.Join(t.TempDir(), "old")
	if err := exec.Command("cp", "-a", dir, old).Run(); err != nil {
		t.Fatal(err)
	}
	write("n1", 10)
	a, err := Heads(dir, time.Now())
	if err != nil || len(a.Heads) != 2 {
		t.Fatalf("Heads: %+v %v", a, err)
	}
	// Round trip through a file, as syslog would hand it back.
	line, _ := json.Marshal(a)
	anchors, err := ReadAnchors(strings.NewReader("Dec  1 12:00:00 host loomfs-audit[7]: anchor " + string(line) + "\n"))
	if err != nil || len(anchors) != 1 {
		t.Fatalf("ReadAnchors: %v", err)
	}
	write("n2", 5) // the log grows after the anchor: still extends it
	if rep, _ := VerifyWith(dir, VerifyOptions{Anchors: anchors}); !rep.Clean(false) || rep.Anchored != 2 {
		t.Fatalf("log extending its anchor: %v %v", rep, rep.Problems)
	}
	// The directory replaced by an older copy: a valid log, but short of
	// the anchored head.
	os.RemoveAll(dir)
	if err := os.Rename(old, dir); err != nil {
		t.Fatal(err)
	}
	if rep, _ := Verify(dir); !rep.Clean(false) {
		t.Fatalf("the older copy is itself intact: %v", rep.Problems)
	}
	rep, _ := VerifyWith(dir, VerifyOptions{Anchors: anchors})
	if rep.OK() || !strings.Contains(firstProblem(rep), "anchored head no longer extended") {
		t.Fatalf("older copy against the anchor: %v %v", rep, rep.Problems)
	}
	t.Logf("first problem: %s", firstProblem(rep))
	// The whole directory removed and started again.
	os.RemoveAll(dir)
	write("n1", 1)
	rep, _ = VerifyWith(dir, VerifyOptions{Anchors: anchors})
	if rep.OK() || !strings.Contains(fmt.Sprint(rep.Problems), "anchored node n2 (anchor of") {
		t.Fatalf("new directory against the anchor: %v %v", rep, rep.Problems)
	}
}

func TestSendSyslog(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "log")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	root := t.TempDir()
	l := openLog(t, root, Options{Node: "n1"})
	l.Close()
	a, _ := Heads(Dir(root), time.Now())
	line, _ := json.Marshal(a)
	if err := SendSyslog(sock, append(line, '\n')); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64<<10)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := c.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ReadAnchors(bytes.NewReader(buf[:n]))
	if err != nil || len(got) != 1 || got[0].Heads[0].LedgerHead != a.Heads[0].LedgerHead {
		t.Errorf("syslog message %q: %v", buf[:n], err)
	}
}

// A writer killed with SIGKILL: running while it runs, then reported as
// ended without closing, which fails verify unless the operator allows it.
// A queued writer killed once its queue is empty has lost nothing.
func TestWriterKilled(t *testing.T) {
	for _, queue := range []int{0, DefaultQueue} {
		t.Run(fmt.Sprintf("queue=%d", queue), func(t *testing.T) { testWriterKilled(t, queue) })
	}
}

func testWriterKilled(t *testing.T, queue int) {
	root := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childRootEnv+"="+root, childCountEnv+"=50", childHangEnv+"=1", childQueueEnv+"="+strconv.Itoa(queue))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("child: %q %v", line, err)
	}
	writeRecords(root, "shared-node", 5) // another writer, closed
	rep, _ := Verify(Dir(root))
	if !rep.Clean(false) || rep.Nodes[0].Running != 1 || rep.Nodes[0].Closed != 1 {
		t.Fatalf("while the writer runs: %v %+v", rep, rep.Nodes)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	rep, _ = Verify(Dir(root))
	if !rep.OK() || len(rep.Crashed) != 1 || rep.Clean(false) || !rep.Clean(true) {
		t.Fatalf("after SIGKILL: %v problems %v ended without closing %v", rep, rep.Problems, rep.Crashed)
	}
	if !strings.Contains(rep.Crashed[0].Message, "writer ended without closing") || !strings.Contains(rep.Crashed[0].Message, "50 events") {
		t.Errorf("report %q", rep.Crashed[0].Message)
	}
	if rep.Events != 55 {
		t.Errorf("%d events, want 55", rep.Events)
	}
	// The chain goes on after the crash.
	writeRecords(root, "shared-node", 5)
	if rep, _ := Verify(Dir(root)); !rep.OK() || len(rep.Crashed) != 1 || rep.Events != 60 {
		t.Errorf("after a later writer: %v %v", rep, rep.Problems)
	}
}

// A queued writer killed right after a burst of records loses at most
// what was still queued: the chain verifies, the writer is named as ended
// without closing, and the records that made it are all there.
func TestQueuedWriterKilledMidBurst(t *testing.T) {
	root := t.TempDir()
	const n = 2000
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childRootEnv+"="+root, childCountEnv+"="+strconv.Itoa(n), childKillEnv+"=1",
		childQueueEnv+"="+strconv.Itoa(DefaultQueue))
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err == nil || cmd.ProcessState.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("child: %v, want killed by SIGKILL", err)
	}
	rep, err := Verify(Dir(root))
	if err != nil || !rep.OK() || len(rep.Crashed) != 1 || rep.Clean(false) || !rep.Clean(true) {
		t.Fatalf("after SIGKILL mid-burst: %v %v problems %v warnings %v ended without closing %v", rep, err, rep.Problems, rep.Warnings, rep.Crashed)
	}
	if !strings.Contains(rep.Crashed[0].Message, "writer ended without closing") {
		t.Errorf("report %q", rep.Crashed[0].Message)
	}
	if rep.Events > n || rep.Events < n-DefaultQueue {
		t.Errorf("%d events: want all %d but at most the queue (%d)", rep.Events, n, DefaultQueue)
	}
	t.Logf("%d of %d records written before SIGKILL", rep.Events, n)
}

// Verify of a log being written: writers that register or close while it
// reads are neither forged nor ended without closing.
func TestVerifyWhileWriting(t *testing.T) {
	root := t.TempDir()
	writeRecords(root, "shared-node", 10)
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			if err := writeRecords(root, "shared-node", 20); err != nil {
				done <- err
				return
			}
		}
	}()
	for range 100 {
		rep, err := Verify(Dir(root))
		if err != nil || !rep.Clean(false) {
			close(stop)
			<-done
			t.Fatalf("verify while writers come and go: %v %v %v %v", rep, err, rep.Problems, rep.Crashed)
		}
	}
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// A record of a writer no ledger entry names is still forged.
	chain, _ := filepath.Glob(filepath.Join(Dir(root), "shared-node.2*.jsonl"))
	slices.Sort(chain)
	last := chain[len(chain)-1]
	lines := splitLines(t, last)
	n := len(lines)
	prev := sha256hex(string(lines[n-1]))
	var seq uint64
	json.Unmarshal(lines[n-1], &struct{ Seq *uint64 }{&seq})
	forged := rechain(t, lines[n-1:], seq+1, prev, func(m map[string]any) { m["writer"] = 999999 })
	os.WriteFile(last, bytes.Join(append(lines, forged...), nil), 0o600)
	rep, _ := Verify(Dir(root))
	if rep.OK() || !strings.Contains(firstProblem(rep), "writer 999999") {
		t.Errorf("forged writer: %v %v", rep, rep.Problems)
	}
}
