// Command dfs measures in-process tool calls on a shared_posix volume seen
// at two paths (two clients of one distributed filesystem, or one local
// directory twice): workspace_write latency from one node, and
// compare-and-swap increments of one counter from both at once.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentloom/loomfs/audit"
	"github.com/agentloom/loomfs/newname"
	"github.com/agentloom/loomfs/policy"
	"github.com/agentloom/loomfs/store"
	"github.com/agentloom/loomfs/tools"
	"golang.org/x/sys/unix"
)

func main() {
	roots := flag.String("roots", "", "the volume root as node A and node B see it: A,B")
	volume := flag.String("volume-id", "", "the volume id its marker holds")
	writes := flag.Int("writes", 300, "workspace_write calls timed")
	incs := flag.Int("increments", 200, "compare-and-swap increments per node")
	names := flag.Int("names", 3, "new names made on node A and looked up on node B, by rename and by newname.Place")
	creates := flag.Int("creates", 100, "workspace_write calls timed that each make a new file (given its name by newname.Place)")
	pause := flag.Duration("pause", 0, "a pause before each timed tool write and each bare replace, as a model thinks between calls (the audit chain's lock is let go after 20 ms at most)")
	flag.Parse()
	a, b, ok := strings.Cut(*roots, ",")
	if !ok || *volume == "" {
		fmt.Fprintln(os.Stderr, "dfs: -roots A,B and -volume-id are required")
		os.Exit(2)
	}
	ctx := context.Background()
	if *names > 0 {
		firstLookups(a, b, *names)
	}
	ta, tb := box(ctx, a, *volume, "node-a"), box(ctx, b, *volume, "node-b")

	content := strings.Repeat("x", 4096)
	// Each tool write is followed by the atomic replace SPEC §4 asks of
	// it done bare (floorReplace), in a directory of node A beside the
	// volume's scopes, so the machine's load weighs on both alike.
	floorDir := a + "/floor"
	if err := os.MkdirAll(floorDir, 0o700); err != nil {
		die(err)
	}
	var lat, floor []time.Duration
	for i := range *writes {
		time.Sleep(*pause)
		t0 := time.Now()
		call(ctx, ta, tools.Write, map[string]any{"path": "w" + strconv.Itoa(i%20), "content": content})
		lat = append(lat, time.Since(t0))
		time.Sleep(*pause)
		t0 = time.Now()
		floorReplace(floorDir, "w"+strconv.Itoa(i%20), []byte(content))
		floor = append(floor, time.Since(t0))
	}
	slices.Sort(lat)
	slices.Sort(floor)
	fmt.Printf("tool write in-process (4 KiB, audit on): p50 %.2f ms, p99 %.2f ms (%d calls)\n",
		ms(lat[len(lat)/2]), ms(lat[len(lat)*99/100]), len(lat))
	fmt.Printf("  the atomic replace alone (create, write, fsync, rename, fsync of the directory): p50 %.2f ms, p99 %.2f ms\n",
		ms(floor[len(floor)/2]), ms(floor[len(floor)*99/100]))

	if *creates > 0 {
		var lat []time.Duration
		for i := range *creates {
			time.Sleep(*pause)
			t0 := time.Now()
			call(ctx, ta, tools.Write, map[string]any{"path": "new/c" + strconv.Itoa(i), "content": content})
			lat = append(lat, time.Since(t0))
		}
		slices.Sort(lat)
		fmt.Printf("tool write of a new file in-process (4 KiB, audit on): p50 %.2f ms, p99 %.2f ms (%d calls)\n",
			ms(lat[len(lat)/2]), ms(lat[len(lat)*99/100]), len(lat))
	}

	call(ctx, ta, tools.Write, map[string]any{"path": "counter", "content": "0"})
	var wg sync.WaitGroup
	conflicts := make([]int, 2)
	// Each node's read and write latencies: where an increment's time goes.
	reads, casWrites := make([][]time.Duration, 2), make([][]time.Duration, 2)
	t0 := time.Now()
	for i, t := range []*tools.Toolbox{ta, tb} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for done := 0; done < *incs; {
				var r struct{ Content, SHA256 string }
				s := time.Now()
				json.Unmarshal(call(ctx, t, tools.Read, map[string]any{"path": "counter"}), &r)
				reads[i] = append(reads[i], time.Since(s))
				v, _ := strconv.Atoi(r.Content)
				in, _ := json.Marshal(map[string]any{"path": "counter", "content": strconv.Itoa(v + 1), "expected_sha256": r.SHA256})
				s = time.Now()
				_, err := t.Call(ctx, tools.Write, "", in)
				casWrites[i] = append(casWrites[i], time.Since(s))
				switch {
				case err == nil:
					done++
				case policy.CodeOf(err) == policy.Conflict:
					conflicts[i]++
				default:
					die(err)
				}
			}
		}()
	}
	wg.Wait()
	el := time.Since(t0)
	var r struct{ Content string }
	json.Unmarshal(call(ctx, tb, tools.Read, map[string]any{"path": "counter"}), &r)
	fmt.Printf("CAS increments from two nodes in-process: %.0f/s (%d in %.2f s, counter %s, conflicts %d+%d)\n",
		float64(2**incs)/el.Seconds(), 2**incs, el.Seconds(), r.Content, conflicts[0], conflicts[1])
	for i, node := range []string{"A", "B"} {
		fmt.Printf("  node %s: read p50 %.2f ms, p90 %.2f, max %.0f, sum %.0f; write (or conflict) p50 %.2f ms, p90 %.2f, max %.0f, sum %.0f\n",
			node, pct(reads[i], 50), pct(reads[i], 90), pct(reads[i], 100), ms(sum(reads[i])),
			pct(casWrites[i], 50), pct(casWrites[i], 90), pct(casWrites[i], 100), ms(sum(casWrites[i])))
	}
}

// floorReplace replaces dir/name with data as a tool write must (SPEC §4:
// a temporary file in the same directory, fsync, rename, fsync of the
// directory) and nothing else: what a write costs before loomfs does
// anything of its own.
func floorReplace(dir, name string, data []byte) {
	tmp := dir + "/.tmp-" + name
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		die(err)
	}
	if _, err := f.Write(data); err != nil {
		die(err)
	}
	if err := f.Sync(); err != nil {
		die(err)
	}
	f.Close()
	if err := os.Rename(tmp, dir+"/"+name); err != nil {
		die(err)
	}
	d, err := os.Open(dir)
	if err != nil {
		die(err)
	}
	if err := d.Sync(); err != nil {
		die(err)
	}
	d.Close()
}

func sum(d []time.Duration) (t time.Duration) {
	for _, x := range d {
		t += x
	}
	return t
}

// pct is the p-th percentile of d, in milliseconds.
func pct(d []time.Duration, p int) float64 {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return ms(d[min(len(d)*p/100, len(d)-1)])
}

// firstLookups makes n new names on node A, each a file written under a
// temporary name and given its name by rename(2) or by newname.Place, and
// times node B's first stat of each: on CephFS a name made by rename
// keeps another client waiting about five seconds.
func firstLookups(a, b string, n int) {
	dir := "names-" + strconv.Itoa(os.Getpid())
	if err := os.Mkdir(a+"/"+dir, 0o700); err != nil {
		die(err)
	}
	defer os.RemoveAll(a + "/" + dir)
	dfd, err := unix.Open(a+"/"+dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		die(err)
	}
	defer unix.Close(dfd)
	for _, way := range []string{"rename", "newname.Place"} {
		var lat []time.Duration
		for i := range n {
			name := fmt.Sprintf("%s.%d", way, i)
			if err := os.WriteFile(a+"/"+dir+"/tmp", make([]byte, 64), 0o600); err != nil {
				die(err)
			}
			if way == "rename" {
				err = unix.Renameat(dfd, "tmp", dfd, name)
			} else {
				err = newname.Place(dfd, "tmp", name)
			}
			if err != nil {
				die(err)
			}
			t0 := time.Now()
			if _, err := os.Stat(b + "/" + dir + "/" + name); err != nil {
				die(err)
			}
			lat = append(lat, time.Since(t0))
		}
		fmt.Printf("a new name made on node A by %s, node B's first stat of it: p50 %.1f ms, max %.1f ms (%d names)\n",
			way, pct(lat, 50), pct(lat, 100), n)
	}
}

// box opens scope bench/dfs/s1 of the volume at root, auditing as the
// command line does on node node. Each node has a name of its own, and
// with it an audit chain of its own: two clients of a distributed
// filesystem appending to one file would each wait for the other's
// caches at every record, which no deployment does.
func box(ctx context.Context, root, volume, node string) *tools.Toolbox {
	vol, err := store.OpenVolume(ctx, store.Config{Backend: store.BackendSharedPOSIX, Root: root, VolumeID: volume})
	if err != nil {
		die(err)
	}
	ws, err := vol.Open(ctx, store.Scope{Space: "bench", Agent: "dfs", Session: "s1"}, nil)
	if err != nil {
		die(err)
	}
	log, err := audit.Open(vol.Path(), audit.Options{Node: node})
	if err != nil {
		die(err)
	}
	return &tools.Toolbox{WS: ws, Audit: log}
}

func call(ctx context.Context, t *tools.Toolbox, name string, in any) json.RawMessage {
	b, _ := json.Marshal(in)
	res, err := t.Call(ctx, name, "", b)
	if err != nil {
		die(fmt.Errorf("%s: %w", name, err))
	}
	return res
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func die(err error) {
	fmt.Fprintln(os.Stderr, "dfs:", err)
	os.Exit(1)
}
