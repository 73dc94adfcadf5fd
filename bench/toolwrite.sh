#!/usr/bin/env bash
# The tool door's write, side by side: CALLS calls of `loomfs tool
# workspace_write` (one process each, a new 1 KiB file each, as an agent's
# CLI call is) by the loomfs of this tree and by the loomfs of revision
# BEFORE, taking turns call by call so that a change of the machine's load
# hits both alike; ROUNDS rounds on fresh roots; the median and the 90th
# percentile of each call's wall time over all rounds, and their ratio.
# PIN=1 runs every call on CPU 0 (taskset).
#
# Usage, as root:   BEFORE=REV ROUNDS=5 CALLS=100 bash bench/toolwrite.sh
set -euo pipefail
cd "$(dirname "$0")/.."
: "${BEFORE:?set BEFORE to the git revision to compare with}"
ROUNDS=${ROUNDS:-5}
CALLS=${CALLS:-100}
work=$(mktemp -d /var/tmp/loomfs-toolwrite.XXXXXX)
trap 'rm -rf "$work"' EXIT
go build -o "$work/after" ./cmd/loomfs
mkdir -p "$work/src"
git archive "$BEFORE" | tar -x -C "$work/src"
(cd "$work/src" && go build -o "$work/before" ./cmd/loomfs)
pre=(); [ "${PIN:-}" = 1 ] && pre=(taskset -c 0)
content=$(head -c 768 /dev/urandom | base64 -w0 | head -c 1024)
scope=bench/agent/s

for r in $(seq "$ROUNDS"); do
	for b in after before; do
		"$work/$b" --root "$work/root-$b" --data "$work/data-$b" tool workspace_list --scope $scope >/dev/null
	done
	for i in $(seq "$CALLS"); do
		for b in after before; do
			s=$(date +%s%N)
			"${pre[@]}" "$work/$b" --root "$work/root-$b" --data "$work/data-$b" tool workspace_write --scope $scope \
				--input "{\"path\":\"w/f$i.txt\",\"content\":\"$content\"}" >/dev/null
			echo $(( ($(date +%s%N) - s) / 1000 )) >>"$work/$b.us"
		done
	done
	rm -rf "$work"/root-* "$work"/data-*
	echo "round $r done, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
done

pct() { sort -n "$1" | awk -v p="$2" '{a[NR]=$1} END {i=int(NR*p+0.999); if (i<1) i=1; print a[i]}'; }
printf '%-8s %10s %10s\n' "" "p50 µs" "p90 µs"
for b in before after; do printf '%-8s %10s %10s\n' $b "$(pct "$work/$b.us" 0.5)" "$(pct "$work/$b.us" 0.9)"; done
awk -v a="$(pct "$work/after.us" 0.5)" -v b="$(pct "$work/before.us" 0.5)" 'BEGIN {printf "after/before p50: %.3f\n", a / b}'
