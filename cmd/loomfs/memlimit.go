package main

import (
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
)

// limitMemoryToCgroup sets the Go runtime's soft memory limit to most of
// the memory cgroup's limit, unless GOMEMLIMIT sets one: the runtime does
// not look at the cgroup, and a process whose heap grows past the cgroup
// between two collections is OOM-killed (a crash, for a mount: its
// projection dies), where near a soft limit it collects harder instead.
// A fifth of the cgroup is left to what is not heap: stacks, the runtime,
// and the page cache the cgroup charges for what the process writes.
func limitMemoryToCgroup() {
	if os.Getenv("GOMEMLIMIT") != "" {
		return
	}
	if lim, ok := cgroupMemoryLimit(); ok {
		debug.SetMemoryLimit(lim / 5 * 4)
	}
}

// cgroupMemoryLimit returns the memory limit of this process's cgroup (v2,
// or v1's memory controller), or false when it has none.
func cgroupMemoryLimit() (int64, bool) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		var file string
		switch {
		case f[0] == "0" && f[1] == "":
			file = filepath.Join("/sys/fs/cgroup", f[2], "memory.max")
		case strings.Contains(","+f[1]+",", ",memory,"):
			file = filepath.Join("/sys/fs/cgroup/memory", f[2], "memory.limit_in_bytes")
		default:
			continue
		}
		v, err := os.ReadFile(file)
		if err != nil {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(v)), 10, 64)
		// "max", or v1's page-rounded largest number: no limit.
		if err != nil || n <= 0 || n >= 1<<62 {
			continue
		}
		return n, true
	}
	return 0, false
}
