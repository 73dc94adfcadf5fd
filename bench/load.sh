#!/usr/bin/env bash
# A busy worker (issue 49): N agents (default 50) on scopes of their own on
# this node, each looping for M minutes (default 10) through an agent's
# work (writes, a read, an edit, a patch, grep, glob, a build-like
# workspace_command, two calls refused on purpose, and in every fourth
# agent a Python REPL in its session sandbox), then checks that nothing
# failed or was quarantined, nothing is left, the audit verifies and every
# scope holds what its agent wrote. Prints p50/p99 per operation, and the
# CPU seconds and peak memory of the loomfs processes by kind. It is
# test/load_test.go's TestLoad at full size (make test runs it at 20 agents
# for 60 s). Needs the engine and loomfs-sandbox-dev.
#
# Usage: bash bench/load.sh [N] [M]
#        bash bench/load.sh --compare A B
#
# The environment picks the mode (each off by default):
#   DOOR=api      the tool calls go through the Go API in the test process,
#                 a session per agent held open, as a platform embedding
#                 loomfs makes them; default: a loomfs tool process per call
#   HEAVY=1       agent 0 is a heavy one: a 1 GiB dd and an untar of 20,000
#                 files in a loop, through its commands; its calls are timed
#                 apart (heavy_dd, heavy_tar) from the others'
#   HEAVY=compare N agents without the heavy one, then with it, and the
#                 others' p50/p99 of both side by side
#   POLICY=FILE   a policy file for every loomfs process (io_bytes_per_s…)
#   NODES=2       half of the agents on each of two nodes, the two clients
#                 of LOOMFS_DFS_ROOTS=A,B (scripts/cephfs roots)
#   SAVE=FILE     keep the run's output in FILE, for --compare (HEAVY 0 or 1)
#
# --compare A B prints two saved runs' p50/p99 per operation side by side,
# with B's p99 as a multiple of A's.
set -euo pipefail

# compare A B: the operation tables of two runs' outputs, side by side.
compare() {
	awk '
		# The table follows its header line; any other line ends it.
		FNR == 1 { file++; intable = 0 }
		/load_test.go:[0-9]+: operation / { intable = 1; next }
		intable {
			sub(/.*load_test.go:[0-9]+: /, "")
			if (NF != 5 || $2 !~ /^[0-9]+$/) { intable = 0; next }
			if (!($1 in seen)) { seen[$1] = 1; ops[++n] = $1 }
			p50[file, $1] = $3; p99[file, $1] = $4
		}
		END {
			printf "%-16s %10s %10s   %10s %10s %8s\n", "operation", "A p50 ms", "A p99 ms", "B p50 ms", "B p99 ms", "B/A p99"
			for (i = 1; i <= n; i++) {
				op = ops[i]
				a50 = ((1, op) in p50) ? p50[1, op] : "-"; a99 = ((1, op) in p99) ? p99[1, op] : "-"
				b50 = ((2, op) in p50) ? p50[2, op] : "-"; b99 = ((2, op) in p99) ? p99[2, op] : "-"
				ratio = (a99 != "-" && b99 != "-" && a99 > 0) ? sprintf("%.2f", b99 / a99) : "-"
				printf "%-16s %10s %10s   %10s %10s %8s\n", op, a50, a99, b50, b99, ratio
			}
		}' "$1" "$2"
}

if [ "${1:-}" = --compare ]; then
	[ $# -eq 3 ] || { echo "usage: bash bench/load.sh --compare A B" >&2; exit 2; }
	compare "$2" "$3"
	exit 0
fi
cd "$(dirname "$0")/.."

N=${1:-${N:-50}}
M=${2:-${M:-10}}

# run HEAVY OUT: one TestLoad run, its output kept in OUT; rc is 1 once a
# run failed.
rc=0
run() {
	uptime
	LOOMFS_LOAD_AGENTS=$N LOOMFS_LOAD_DURATION=${M}m LOOMFS_LOAD_HEAVY=$1 \
		LOOMFS_LOAD_DOOR=${DOOR:-process} LOOMFS_LOAD_NODES=${NODES:-1} LOOMFS_LOAD_POLICY=${POLICY:-} \
		go test -count=1 -v -run '^TestLoad$' -timeout "$((M + 20))m" ./test/ |
		grep -E 'load(_[a-z]+)?_test.go|^(--- |ok|FAIL|PASS)' | tee "$2" || rc=1
	uptime
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
case "${HEAVY:-0}" in
compare)
	run 0 "$tmp/without"
	run 1 "$tmp/with"
	echo "A: $N agents; B: the same with agent 0 heavy (its own calls are heavy_dd and heavy_tar)"
	compare "$tmp/without" "$tmp/with"
	;;
0 | 1)
	run "${HEAVY:-0}" "$tmp/run"
	[ -z "${SAVE:-}" ] || cp "$tmp/run" "$SAVE"
	;;
*) echo "HEAVY=$HEAVY: want 0, 1 or compare" >&2; exit 2 ;;
esac
exit $rc
