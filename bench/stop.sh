#!/usr/bin/env bash
# How long a loomfs mount takes from SIGTERM to exit, on local ext4 and on a
# distributed filesystem seen by two clients, side by side in one run. Each
# round mounts one scope on two nodes (on ext4: two mounts of one local
# volume), writes through A, reads and rewrites through B, reads through
# A, then stops B and A with SIGTERM and times each until its process is
# gone. Rounds where the writes are still going on at the signal ("busy")
# keep a writer in each mount.
#
# Usage, as root:
#   bash scripts/cephfs up
#   LOOMFS_DFS_ROOTS=$(bash scripts/cephfs roots) ROUNDS=10 bash bench/stop.sh
# Without LOOMFS_DFS_ROOTS only the ext4 rows are measured.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-10}
work=$(mktemp -d /var/tmp/loomfs-stop-bench.XXXXXX) # /var/tmp: on the local disk, not a tmpfs
pids=()
dirs=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	for d in "${dirs[@]}"; do rm -rf "$d"; done
	rm -rf "$work"
}
trap cleanup EXIT
go build -o "$work/loomfs" ./cmd/loomfs

# start NODE ROOT: a loomfs mount of the scope on node NODE; sets $pid.
start() {
	local n=$1 root=$2 dir=$work/$round/$1
	mkdir -p "$dir/mnt"
	(cd "$dir" && exec env -i PATH="$PATH" AGENT_LOOM_NODE="node-$n" "$work/loomfs" --backend shared_posix \
		--root "$root" --volume-id stop-bench --data "$dir/data" mount --scope acme/coder/s1 "$dir/mnt" >"$dir/out" 2>&1) &
	pid=$!
	pids+=("$pid")
	for _ in $(seq 600); do
		grep -q '^mounted ' "$dir/out" 2>/dev/null && return
		sleep 0.05
	done
	echo "stop.sh: the mount on node $n did not come up:" >&2
	cat "$dir/out" >&2
	exit 1
}

# stop PID: SIGTERM, then sets $took to the seconds until the process is
# gone (run in this shell, whose child it is: wait reaps it).
stop() {
	local t0 t1
	t0=$(date +%s.%N)
	kill -TERM "$1"
	wait "$1" 2>/dev/null || true
	t1=$(date +%s.%N)
	took=$(echo "$t1 - $t0" | bc)
}

# measure LABEL ROOT_A ROOT_B BUSY: one line per round and node.
measure() {
	local label=$1 ra=$2 rb=$3 busy=$4
	for round in $(seq "$rounds"); do
		round="$label-$busy-$round"
		local name="stop-bench-$$-$round"
		mkdir -p "$ra/$name"
		dirs+=("$rb/$name")
		echo stop-bench >"$ra/$name/.agentloom-volume"
		start a "$ra/$name"; local pa=$pid
		start b "$rb/$name"; local pb=$pid
		local ma=$work/$round/a/mnt mb=$work/$round/b/mnt
		echo "through A" >"$ma/f"
		cat "$mb/f" >/dev/null
		echo "changed on B" >"$mb/f"
		cat "$ma/f" >/dev/null
		local writers=()
		if [ "$busy" = busy ]; then
			for m in "$ma" "$mb"; do
				(while :; do head -c 4096 /dev/zero >"$m/w$RANDOM" || exit 0; done) 2>/dev/null &
				writers+=("$!")
			done
			sleep 1
		fi
		local sb sa
		stop "$pb"; sb=$took
		stop "$pa"; sa=$took
		for w in "${writers[@]}"; do kill "$w" 2>/dev/null || true; wait "$w" 2>/dev/null || true; done
		echo "$label $busy B $sb"
		echo "$label $busy A $sa"
		rm -rf "${rb:?}/$name"
	done
}

results=$work/results
mkdir -p "$work/ext4"
for busy in idle busy; do
	measure ext4 "$work/ext4" "$work/ext4" "$busy" >>"$results"
	if [ -n "${LOOMFS_DFS_ROOTS:-}" ]; then
		IFS=, read -r dfs_a dfs_b <<<"$LOOMFS_DFS_ROOTS"
		measure cephfs "$dfs_a" "$dfs_b" "$busy" >>"$results"
	fi
done

echo "SIGTERM to exit of loomfs mount, seconds, $rounds rounds, both nodes' mounts"
printf "%-8s %-5s %8s %8s %8s\n" backend load median p90 max
for label in ext4 cephfs; do
	for busy in idle busy; do
		awk -v l="$label" -v b="$busy" '$1 == l && $2 == b {print $4}' "$results" | sort -n | awk -v l="$label" -v b="$busy" '
			{a[NR] = $1}
			END {
				if (NR == 0) exit
				m = a[int((NR + 1) / 2)]; p = a[int(NR * 0.9 + 0.5)]; if (p == "") p = a[NR]
				printf "%-8s %-5s %8.3f %8.3f %8.3f\n", l, b, m, p, a[NR]
			}'
	done
done
