#!/usr/bin/env bash
# Local ext4 against a distributed filesystem seen by two clients, side by
# side in one run: tool write latency (in-process and CLI), compare-and-swap
# increments from two nodes, a snapshot after 10 changes in a 10,000-file
# scope, and tar -x of 1,000 files through a loomfs mount against directly.
#
# Usage, as root:
#   bash scripts/cephfs up
#   LOOMFS_DFS_ROOTS=$(bash scripts/cephfs roots) bash bench/dfs.sh
# ONLY=untar runs the untar rows only; bench/untar.sh measures them alone,
# with more rounds, a baseline build side by side and system call counts.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${LOOMFS_DFS_ROOTS:-}" ] || { echo "dfs.sh: set LOOMFS_DFS_ROOTS=A,B (scripts/cephfs roots)" >&2; exit 2; }
IFS=, read -r dfs_a dfs_b <<<"$LOOMFS_DFS_ROOTS"
work=$(mktemp -d /var/tmp/loomfs-dfs-bench.XXXXXX) # /var/tmp: on the local disk, not a tmpfs
name="bench-$$"
mounted=""
cleanup() {
	if [ -n "$mounted" ]; then
		kill "$mounted" 2>/dev/null || true
		wait "$mounted" 2>/dev/null || true
	fi
	rm -rf "$work" "${dfs_b:?}/$name"
}
trap cleanup EXIT
go build -o "$work/loomfs" ./cmd/loomfs
go build -o "$work/gentree" ./bench/gentree
go build -o "$work/dfs" ./bench/dfs

pct() { sort -n | awk -v p="$1" '{a[NR]=$1} END {i=int(NR*p/100); if (i<1) i=1; printf "%.2f", a[i]*1000}'; }
now() { date +%s.%N; }
since() { awk -v s="$1" -v e="$(now)" 'BEGIN {printf "%.4f", e - s}'; }
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

# A tarball of 1,000 files of 4 KiB in 10 directories.
mkdir -p "$work/src"
for d in $(seq 0 9); do
	mkdir -p "$work/src/d$d"
	for f in $(seq 0 99); do head -c 4096 /dev/urandom >"$work/src/d$d/f$f"; done
done
tar -cf "$work/files.tar" -C "$work/src" .

run() { # run LABEL ROOT_A ROOT_B
	local label="$1" a="$2/$name" b="$3/$name" l s
	mkdir -p "$a"
	echo vol-bench >"$a/.agentloom-volume"
	local L=("$work/loomfs" --backend shared_posix --root "$a" --volume-id vol-bench --data "$work/data")
	echo "### $label"
	if [ "${ONLY:-}" != untar ]; then
		"$work/dfs" -roots "$a,$b" -volume-id vol-bench
		l=$(for i in $(seq 1 100); do
			s=$(now)
			"${L[@]}" tool workspace_write --scope bench/cli/s1 --input "{\"path\":\"w$((i % 20))\",\"content\":\"$i\"}" >/dev/null
			since "$s"; echo
		done)
		echo "tool write as a CLI process: p50 $(pct 50 <<<"$l") ms, p99 $(pct 99 <<<"$l") ms (100 calls)"

		"${L[@]}" tool workspace_list --scope bench/snap/s1 >/dev/null
		"$work/gentree" -dir "$a/$(scope_dir bench/snap/s1)/tree" -files 10000 -size 1024
		"${L[@]}" snapshot create --scope bench/snap/s1 --full --wait 10m >/dev/null
		for i in $(seq 1 10); do
			"${L[@]}" tool workspace_write --scope bench/snap/s1 --input "{\"path\":\"tree/d00$((i % 10))/e00/f$i\",\"content\":\"changed $i\"}" >/dev/null
		done
		s=$(now)
		"${L[@]}" snapshot create --scope bench/snap/s1 >/dev/null
		echo "snapshot create after 10 changes in a 10,000-file scope: $(since "$s") s"
	fi

	# Three rounds each, a fresh directory and scope per round: the median
	# and the ratio of the medians (one round swings with the machine's load).
	local mnt="$work/mnt-$label" r ds=() ls=()
	mkdir -p "$mnt"
	for r in 1 2 3; do
		mkdir -p "$a/untar-direct-$r"
		s=$(now); tar --no-same-owner --no-same-permissions -xf "$work/files.tar" -C "$a/untar-direct-$r"; ds+=("$(since "$s")")
		: >"$work/mount.log"
		"${L[@]}" mount --scope "bench/tar/s$r" "$mnt" >"$work/mount.log" 2>&1 &
		mounted=$!
		for _ in $(seq 1 100); do grep -qs "mounted " "$work/mount.log" && break; sleep 0.1; done
		s=$(now); tar --no-same-owner --no-same-permissions -xf "$work/files.tar" -C "$mnt"; ls+=("$(since "$s")")
		kill "$mounted"; wait "$mounted" || true
		mounted=""
	done
	local dm lm
	dm=$(median "${ds[@]}"); lm=$(median "${ls[@]}")
	echo "tar -x of 1,000 files directly: median $dm s (${ds[*]})"
	echo "tar -x of 1,000 files through a loomfs mount: median $lm s (${ls[*]}), $(awk -v l="$lm" -v d="$dm" 'BEGIN {printf "%.2f", l / d}')x the direct median"
	rm -rf "$a"
}

# scope_dir S: where scope S lives under the root.
scope_dir() {
	IFS=/ read -r sp ag se <<<"$1"
	echo "spaces/$sp/agents/$ag/sessions/$se/main"
}

mkdir -p "$work/ext4"
run "local ext4 (one directory at two paths)" "$work/ext4" "$work/ext4"
run "$(awk -v m="$dfs_a" '$2 == m {print $3}' /proc/mounts) (two clients)" "$dfs_a" "$dfs_b"
