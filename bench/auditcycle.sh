#!/usr/bin/env bash
# Audit on against off on the FUSE cycle (create + write 100 B + stat +
# delete through a real mount, BenchmarkAudit in fusefs), each run in a
# process of its own on a freshly made ext4 filesystem, the variants in a
# shuffled order in each of ROUNDS rounds (default 15), unpinned and
# pinned to one core. A fresh filesystem per run because ext4 skips
# inodes freed in the last minutes when it allocates one, scanning past
# them: on a filesystem that earlier runs filled with freed inodes the
# create costs up to twice as much, and that cost, not the audit, decides
# which variant looks faster (in a profile of such a run, ext4's inode
# search was a quarter of the cycle's CPU).
#
# Prints every run and, per pinning, the median wall and CPU time per
# cycle of each variant and the median of each round's on ÷ off.
# VARIANTS (default "off on queued") are BenchmarkAudit's sub-benchmarks;
# BIN may name test binaries built beforehand as NAME=PATH pairs
# ("old=/path/to/fusefs.test new=..."), to compare builds in one series.
# PINS (default "unpinned pinned") picks the pinnings to run; BENCH
# (default BenchmarkAudit) the benchmark: BenchmarkAuditClient makes the
# cycle from a client process of its own (variants off, on and queued).
# BENCH=BenchmarkAuditClientInterleaved with VARIANTS=pair makes each run
# one client process alternate blocks of cycles between a mount with the
# audit off and one with it queued, both served by the benchmark's
# process, so that drift within the run weighs on both alike; its rows
# give wall time only (the CPU column repeats it).
# PROCS (default "mount") gives the serving process the GOMAXPROCS that
# loomfs mount takes by default for its pinning (3 pinned to one core, 1
# otherwise: cmd/loomfs servingProcs); "go" leaves Go's own (a P per CPU
# the process may run on); a number sets it.
# Needs root (loop mount). BENCHMARKS.md records the figures with this
# command.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-15}
CYCLES=${CYCLES:-4000}
VARIANTS=${VARIANTS:-off on queued}
PINS=${PINS:-unpinned pinned}
BENCH=${BENCH:-BenchmarkAudit}
PROCS=${PROCS:-mount}
work=$(mktemp -d)
img=/dev/shm/loomfs-auditcycle.$$.img
mnt=$work/mnt
mkdir -p "$mnt"
dev=
cleanup() {
	if mountpoint -q "$mnt"; then umount "$mnt"; fi
	if [ -n "$dev" ]; then losetup -d "$dev" || true; fi
	rm -rf "$work" "$img"
}
trap cleanup EXIT

bins=()
if [ -n "${BIN:-}" ]; then
	for pair in $BIN; do bins+=("$pair"); done
else
	go test -c -o "$work/fusefs.test" ./fusefs/
	bins=("now=$work/fusefs.test")
fi

# run BIN VARIANT PIN: one run on a fresh filesystem; prints
# "wall-ns cpu-ns".
run() {
	local bin=$1 variant=$2 pin=$3
	truncate -s 2G "$img"
	mkfs.ext4 -q -F "$img"
	# A loop device just let go may still be busy for a moment.
	for _ in 1 2 3 4 5; do dev=$(losetup -f --show "$img" 2>/dev/null) && break; sleep 0.2; done
	mount "$dev" "$mnt"
	mkdir -m 1777 "$mnt/tmp"
	local cmd=("$bin" -test.run '^$' -test.bench "^$BENCH\$/^audit=$variant\$" -test.benchtime "${CYCLES}x")
	local fields='{print $3, $5}'
	if [ "$variant" = pair ]; then
		# BenchmarkAuditClientInterleaved: one b.N is a pair of blocks of
		# 50 cycles; it prints the off and the on mount's time per cycle.
		cmd=("$bin" -test.run '^$' -test.bench "^$BENCH\$" -test.benchtime "$((CYCLES / 50))x")
		fields='{print $5, $7}'
	fi
	[ "$pin" = pinned ] && cmd=(taskset -c 0 "${cmd[@]}")
	case $PROCS in
	mount) if [ "$pin" = pinned ]; then cmd=(env GOMAXPROCS=3 "${cmd[@]}"); else cmd=(env GOMAXPROCS=1 "${cmd[@]}"); fi ;;
	go) ;;
	*) cmd=(env GOMAXPROCS="$PROCS" "${cmd[@]}") ;;
	esac
	TMPDIR=$mnt/tmp "${cmd[@]}" | awk "/^Benchmark/ $fields"
	umount "$mnt"
	losetup -d "$dev"
	dev=
	rm -f "$img"
}

results=$work/results
for pin in $PINS; do
	for r in $(seq "$ROUNDS"); do
		for job in $(for b in "${bins[@]}"; do for v in $VARIANTS; do echo "${b%%=*}:$v"; done; done | shuf); do
			name=${job%%:*} variant=${job#*:}
			for b in "${bins[@]}"; do [ "${b%%=*}" = "$name" ] && bin=${b#*=}; done
			out=$(run "$bin" "$variant" "$pin")
			read -r wall cpu <<<"$out"
			if [ "$variant" = pair ]; then
				# Two mounts in one run: the off and the queued one's wall
				# time per cycle (their CPU is not told apart).
				off=${wall%.*} on=${cpu%.*}
				echo "$pin round $r $name interleaved: off $((off / 1000)) µs, queued $((on / 1000)) µs per cycle"
				echo "$pin $r $name off $off $off" >>"$results"
				echo "$pin $r $name queued $on $on" >>"$results"
				continue
			fi
			echo "$pin round $r $name $variant: $((wall / 1000)) µs wall, $((cpu / 1000)) µs CPU per cycle"
			echo "$pin $r $name $variant $wall $cpu" >>"$results"
		done
	done
done

# The medians, and each round's on ÷ off of the same build and pinning.
python3 - "$results" <<'EOF'
import statistics, sys
from collections import defaultdict
runs = defaultdict(dict)
for line in open(sys.argv[1]):
    pin, r, name, variant, wall, cpu = line.split()
    runs[(pin, name, variant)][r] = (int(wall), int(cpu))
for (pin, name, variant), by in sorted(runs.items()):
    walls = [w for w, _ in by.values()]
    cpus = [c for _, c in by.values()]
    line = f"{pin} {name} {variant}: median {statistics.median(walls)/1000:.0f} µs wall, {statistics.median(cpus)/1000:.0f} µs CPU"
    off = runs.get((pin, name, "off"))
    if variant != "off" and off:
        rw = [by[r][0] / off[r][0] - 1 for r in by if r in off]
        rc = [by[r][1] / off[r][1] - 1 for r in by if r in off]
        line += f"; vs off, median of rounds: {100*statistics.median(rw):+.1f}% wall, {100*statistics.median(rc):+.1f}% CPU"
    print(line)
EOF
