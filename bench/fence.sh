#!/usr/bin/env bash
# How long `loomfs fence` takes (issue 50), two builds side by side: for
# each round, a fresh ceph-fuse client of the single-host CephFS of
# scripts/cephfs, carrying a node's metadata, is fenced by the build at
# BASE (default: the commit before HEAD) and another by the working
# tree's, in turn. Prints each fence's wall time and what its record says
# it took, then the median and the maximum per build. BUSY=N runs N busy
# loops beside it (a loaded node), stopped at the end. Each fenced node's
# blocklist entry and fence record are removed after its round.
# Needs root and a cluster that is up:
#   LOOMFS_CEPHFS_STATE=DIR bash scripts/cephfs up
#   LOOMFS_CEPHFS_STATE=DIR ROUNDS=5 BUSY=0 bash bench/fence.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-5}
BUSY=${BUSY:-0}
BASE=${BASE:-HEAD~1}
state=${LOOMFS_CEPHFS_STATE:?set LOOMFS_CEPHFS_STATE to the cluster of scripts/cephfs}
conf=$state/ceph.conf
root=$(bash scripts/cephfs roots | cut -d, -f2)
work=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	git worktree remove --force "$work/base" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

git worktree add -q --detach "$work/base" "$BASE"
(cd "$work/base" && go build -o "$work/loomfs-base" ./cmd/loomfs)
go build -o "$work/loomfs-new" ./cmd/loomfs
boot=$(cat /proc/sys/kernel/random/boot_id)

for _ in $(seq "$BUSY"); do
	(while :; do :; done) &
	pids+=($!)
done
sleep 1
uptime

# fence BUILD ROUND: mounts a client for a node of its own, fences it with
# BUILD and prints "BUILD wall_s took_s" (took_s: the ceph part, by its record).
fence() {
	local build=$1 node=bench-fence-$1-$2-$$ mnt=$work/mnt-$1-$2
	mkdir -p "$mnt"
	ceph-fuse -c "$conf" --client_metadata="loomfs_node=$node,loomfs_boot=$boot" \
		--client_reconnect_stale=false -f "$mnt" >"$work/fuse-$1-$2.log" 2>&1 &
	local fpid=$!
	for _ in $(seq 300); do grep -qs " $mnt fuse" /proc/mounts && break; sleep 0.1; done
	local t0 t1 out
	t0=$(date +%s.%N)
	out=$("$work/loomfs-$build" --root "$root" --json fence --node "$node" --reason bench --ceph-conf "$conf")
	t1=$(date +%s.%N)
	echo "$build $(echo "$t1 - $t0" | bc) $(echo "$out" | python3 -c 'import json,sys; r=json.load(sys.stdin); print("%.2f" % (r["took_ns"]/1e9))')"
	for addr in $(echo "$out" | python3 -c 'import json,sys; [print(i["addr"]) for i in json.load(sys.stdin)["instances"]]'); do
		ceph -c "$conf" osd blocklist rm "$addr" >/dev/null 2>&1 || true
	done
	rm -f "$root/.agentloom-fences/$node.json" "$root/.agentloom-fences/marks/$node.json"
	umount -l "$mnt" 2>/dev/null || true
	kill "$fpid" 2>/dev/null || true
	wait "$fpid" 2>/dev/null || true
}

for r in $(seq "$ROUNDS"); do
	fence base "$r"
	fence new "$r"
done >"$work/rounds"
cat "$work/rounds"
awk '
	{ n[$1]++; w[$1, n[$1]] = $2 }
	END {
		print "build: median, max seconds of loomfs fence (wall)"
		for (k in n) {
			m = n[k]
			for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (w[k, j] < w[k, i]) { x = w[k, i]; w[k, i] = w[k, j]; w[k, j] = x }
			med = (m % 2) ? w[k, (m + 1) / 2] : (w[k, m / 2] + w[k, m / 2 + 1]) / 2
			printf "%s: %.2f, %.2f (%d rounds)\n", k, med, w[k, m], m
		}
	}' "$work/rounds"
uptime
