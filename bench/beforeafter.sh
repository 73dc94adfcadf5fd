#!/usr/bin/env bash
# Go benchmarks of this tree and of revision BEFORE, side by side in one
# run: the test binaries of both are built first, then each round runs
# every benchmark with one and then the other, unpinned and pinned to CPU 0
# (taskset), so that a change of the machine's load hits both alike.
# Prints each benchmark's median ns/op over ROUNDS rounds and after/before.
# The defaults are what a change to the write path must not slow: a tool
# write (audited, in process: no process start) and the mount's small-file
# cycle (create and write 100 bytes, stat, delete, through a real mount).
#
# Usage, as root:   BEFORE=REV ROUNDS=7 bash bench/beforeafter.sh
#   BENCHES="pkg:regexp …"   which benchmarks (default below); pkg:A=B runs
#                            A in this tree and B in BEFORE (a sub-benchmark
#                            renamed, or the old default beside a new mode)
#   BENCHTIME=2000x          each run's -test.benchtime
set -euo pipefail
cd "$(dirname "$0")/.."
: "${BEFORE:?set BEFORE to the git revision to compare with}"
ROUNDS=${ROUNDS:-7}
BENCHTIME=${BENCHTIME:-2000x}
BENCHES=${BENCHES:-"tools:^BenchmarkWrite$/^audit=true$/^cas=false$ fusefs:^BenchmarkCreateStatDelete$/^loomfs$"}
PINS=${PINS:-"unpinned pinned"}
work=$(mktemp -d /var/tmp/loomfs-beforeafter.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src"
git archive "$BEFORE" | tar -x -C "$work/src"
pkgs=$(for b in $BENCHES; do echo "${b%%:*}"; done | sort -u)
for p in $pkgs; do
	go test -c -o "$work/after-$p.test" "./$p"
	(cd "$work/src" && go test -c -o "$work/before-$p.test" "./$p")
done

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
declare -A R
for r in $(seq "$ROUNDS"); do
	for pin in $PINS; do
		pre=(); [ "$pin" = pinned ] && pre=(taskset -c 0)
		for b in $BENCHES; do
			p=${b%%:*} spec=${b#*:}
			declare -A RE=([after]=${spec%%=*} [before]=${spec#*=})
			for v in after before; do
				re=${RE[$v]}
				# The package's own directory, as go test runs it (testdata).
				ns=$(cd "$p" && "${pre[@]}" "$work/$v-$p.test" -test.run '^$' -test.bench "$re" \
					-test.benchtime "$BENCHTIME" -test.count 1 | awk '/ns\/op/ {for (i = 1; i < NF; i++) if ($(i+1) == "ns/op") print $i; exit}')
				R[$pin,$b,$v]+="$ns "
			done
		done
	done
	echo "round $r done, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
done
printf '%-9s %-56s %12s %12s %8s\n' pin benchmark "before ns/op" "after ns/op" ratio
for pin in $PINS; do
	for b in $BENCHES; do
		bm=$(echo ${R[$pin,$b,before]} | tr ' ' '\n' | median)
		am=$(echo ${R[$pin,$b,after]} | tr ' ' '\n' | median)
		printf '%-9s %-56s %12s %12s %8s\n' "$pin" "$b" "$bm" "$am" "$(awk -v a="$am" -v b="$bm" 'BEGIN {printf "%.3f", a / b}')"
	done
done
